//! The CUDA driver API, loaded at run time from the library XLA uses: `libcuda.so.1`, the
//! driver's soname, which XLA's loader asks for by that name. A libcuda already in the
//! process (XLA's) is taken as it is; otherwise that same name is loaded, so that XLA,
//! starting later, gets the same object from the dynamic linker. The unversioned
//! `libcuda.so` is never loaded: where it exists it may be another file, such as the CUDA
//! toolkit's stub, and a second driver in one process does not share XLA's contexts.
//!
//! Every function is resolved when the library is loaded: a driver that lacks one is
//! refused then, naming what is missing, never at the first call that needs it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use jaxmpi_core::{Error, Result};
use libloading::os::unix::{Library, RTLD_NOW};

pub type CuResult = c_int;
pub type CuDevice = c_int;
pub type CuDevicePtr = u64;
pub type CuContext = *mut c_void;
pub type CuStream = *mut c_void;
pub type CuEvent = *mut c_void;

pub const CUDA_SUCCESS: CuResult = 0;
/// `CU_EVENT_DISABLE_TIMING`: cheaper events, which only mark a point in a stream.
pub const EVENT_DISABLE_TIMING: c_uint = 2;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, so the pool serves any stream.
pub const MEMHOSTALLOC_PORTABLE: c_uint = 1;

/// The soname of the NVIDIA driver library, as XLA's loader names it.
pub const LIBCUDA: &str = "libcuda.so.1";
const RTLD_NOLOAD: c_int = 4;

/// `CUpointer_attribute` values (cuda.h), for what a GPU buffer is.
pub mod attribute {
    pub const MEMORY_TYPE: u32 = 2;
    pub const DEVICE_ORDINAL: u32 = 9;
    pub const IS_LEGACY_CUDA_IPC_CAPABLE: u32 = 10;
    pub const RANGE_SIZE: u32 = 12;
    pub const MAPPED: u32 = 13;
    pub const ALLOWED_HANDLE_TYPES: u32 = 14;
    pub const IS_GPU_DIRECT_RDMA_CAPABLE: u32 = 15;
    pub const MEMPOOL_HANDLE: u32 = 17;
}

/// A copy of the function pointer `name` of `lib`, if it exports one.
fn resolve<F: Copy>(lib: &Library, name: &str) -> Option<F> {
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    // SAFETY: `F` is the prototype cuda.h gives `name` (see the table); the library stays
    // loaded for the life of the process (`driver` keeps it in a static).
    unsafe { lib.get::<F>(&cname) }.ok().map(|symbol| *symbol)
}

macro_rules! driver_table {
    ($($name:ident($($arg:ty),* $(,)?);)*) => {
        /// The driver functions jaxmpi calls, under their exported names (`_v2` where
        /// cuda.h maps the plain name to it).
        #[allow(non_snake_case)]
        pub struct Functions {
            $(pub $name: unsafe extern "C" fn($($arg),*) -> CuResult,)*
        }

        /// The names, in table order (what a GPU run checks the driver for).
        pub const SYMBOLS: &[&str] = &[$(stringify!($name)),*];

        impl Functions {
            fn load(lib: &Library) -> std::result::Result<Self, Vec<&'static str>> {
                let missing: Vec<&'static str> = SYMBOLS
                    .iter()
                    .copied()
                    .filter(|name| resolve::<*mut c_void>(lib, name).is_none())
                    .collect();
                if !missing.is_empty() {
                    return Err(missing);
                }
                Ok(Functions {
                    $($name: resolve(lib, stringify!($name)).expect("checked above"),)*
                })
            }
        }
    };
}

driver_table! {
    cuInit(c_uint);
    cuDriverGetVersion(*mut c_int);
    cuGetErrorName(CuResult, *mut *const c_char);
    cuDeviceGetCount(*mut c_int);
    cuDeviceGet(*mut CuDevice, c_int);
    cuDevicePrimaryCtxRetain(*mut CuContext, CuDevice);
    cuDevicePrimaryCtxRelease_v2(CuDevice);
    cuCtxSetCurrent(CuContext);
    cuCtxGetCurrent(*mut CuContext);
    cuCtxPushCurrent_v2(CuContext);
    cuCtxPopCurrent_v2(*mut CuContext);
    cuCtxGetDevice(*mut CuDevice);
    cuStreamGetCtx(CuStream, *mut CuContext);
    cuStreamSynchronize(CuStream);
    cuMemcpyDtoHAsync_v2(*mut c_void, CuDevicePtr, usize, CuStream);
    cuMemcpyHtoDAsync_v2(CuDevicePtr, *const c_void, usize, CuStream);
    cuMemsetD8Async(CuDevicePtr, u8, usize, CuStream);
    cuEventCreate(*mut CuEvent, c_uint);
    cuEventRecord(CuEvent, CuStream);
    cuEventSynchronize(CuEvent);
    cuEventDestroy_v2(CuEvent);
    cuMemHostAlloc(*mut *mut c_void, usize, c_uint);
    cuMemFreeHost(*mut c_void);
    cuPointerGetAttribute(*mut c_void, u32, CuDevicePtr);
}

/// The loaded driver: its functions and the file they came from.
pub struct Driver {
    pub api: Functions,
    /// The file the dynamic linker loaded for `libcuda.so.1` (links resolved).
    pub path: String,
    /// Whether XLA (or anyone) had loaded it before jaxmpi asked.
    pub already_loaded: bool,
    _library: Library,
}

impl Driver {
    /// `Ok` for CUDA_SUCCESS, else an error naming `what` and the driver's name for `rc`.
    pub fn check(&self, what: &str, rc: CuResult) -> Result<()> {
        if rc == CUDA_SUCCESS {
            return Ok(());
        }
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: writes a pointer to a static string, or fails for an unknown code.
        let known = unsafe { (self.api.cuGetErrorName)(rc, &mut name) } == CUDA_SUCCESS;
        let name = if known && !name.is_null() {
            // SAFETY: the driver's static, NUL-terminated name of the code.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("CUDA error {rc}")
        };
        Err(Error::library("cuda", format!("{what} failed: {name}")))
    }
}

fn open(flags: c_int) -> Option<Library> {
    // SAFETY: loading the NVIDIA driver runs its initializers, as XLA loading it does.
    unsafe { Library::open(Some(LIBCUDA), flags) }.ok()
}

/// The file a symbol of the loaded library lives in (dladdr), for `info` and the GPU run.
fn path_of(library: &Library) -> String {
    // SAFETY: looks up a symbol every driver exports; only its address is used.
    let Ok(symbol) = (unsafe { library.get::<*mut c_void>(b"cuInit\0") }) else {
        return LIBCUDA.to_string();
    };
    // SAFETY: Dl_info is plain C data (pointers and integers), valid when zeroed.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    if unsafe { libc::dladdr(*symbol as *const c_void, &mut info) } == 0 || info.dli_fname.is_null()
    {
        return LIBCUDA.to_string();
    }
    // SAFETY: a NUL-terminated path owned by the dynamic linker.
    let named = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    // The file itself, as /proc/self/maps names it (`mapped_libcudas`), not a link to it.
    std::fs::canonicalize(&named).map_or(named, |p| p.display().to_string())
}

fn load() -> Result<Driver> {
    let (library, already_loaded) = match open(RTLD_NOW | RTLD_NOLOAD) {
        Some(library) => (library, true),
        None => match open(RTLD_NOW) {
            Some(library) => (library, false),
            None => {
                return Err(Error::library(
                    "cuda",
                    format!(
                        "arrays live on a GPU but the CUDA driver library ({LIBCUDA}) cannot be \
                         loaded: install the NVIDIA driver or add its directory to \
                         LD_LIBRARY_PATH, or run on CPU with JAX_PLATFORMS=cpu"
                    ),
                ))
            }
        },
    };
    let path = path_of(&library);
    let api = Functions::load(&library).map_err(|missing| {
        Error::library(
            "cuda",
            format!(
                "the CUDA driver {path} lacks {}: jaxmpi needs a driver for CUDA 12.0 or newer",
                missing.join(", ")
            ),
        )
    })?;
    let driver = Driver {
        api,
        path,
        already_loaded,
        _library: library,
    };
    // SAFETY: the documented first call of the driver API; repeated calls are harmless.
    driver.check("cuInit", unsafe { (driver.api.cuInit)(0) })?;
    Ok(driver)
}

/// The driver, loaded and initialized once per process.
pub fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
    DRIVER.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Every file of this process whose name says it is a libcuda (from /proc/self/maps): one,
/// once the driver is loaded, unless something loaded a second one.
pub fn mapped_libcudas() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut paths: Vec<String> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            name.starts_with("libcuda.so")
        })
        .map(str::to_string)
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_function_once_and_never_the_unversioned_library() {
        let mut names = SYMBOLS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SYMBOLS.len());
        assert_eq!(LIBCUDA, "libcuda.so.1");
    }

    #[test]
    fn no_libcuda_is_mapped_before_one_is_loaded() {
        // This test process never loads the driver (no GPU code runs in unit tests).
        assert!(mapped_libcudas().is_empty(), "{:?}", mapped_libcudas());
    }
}
