//! Which MPI library, if any, this process has already loaded, and where a symbol comes from.
//!
//! Python loads extension modules (mpi4py's among them) with RTLD_LOCAL, so their libmpi is
//! invisible to `dlsym(RTLD_DEFAULT)`; walking the loaded objects finds it anyway.

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// Every object currently mapped into the process, by the path it was loaded from.
fn loaded_objects() -> Vec<PathBuf> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid info struct; `data` is the Vec below.
        unsafe {
            let paths = &mut *(data as *mut Vec<PathBuf>);
            let name = (*info).dlpi_name;
            if !name.is_null() {
                let name = CStr::from_ptr(name).to_string_lossy();
                if !name.is_empty() {
                    paths.push(PathBuf::from(name.as_ref()));
                }
            }
        }
        0
    }
    let mut paths: Vec<PathBuf> = Vec::new();
    // SAFETY: the callback only appends to `paths`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut paths as *mut Vec<PathBuf> as *mut c_void) };
    paths
}

/// The file that defines `symbol` when looked up from the object at `path`, if that object
/// is loaded already (RTLD_NOLOAD never loads anything).
pub fn defining_file(path: &Path, symbol: &CStr) -> Option<PathBuf> {
    let cpath = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: RTLD_NOLOAD only returns a handle to an object already mapped; we drop the
    // reference it adds with dlclose right after.
    unsafe {
        let handle = libc::dlopen(cpath.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return None;
        }
        let address = libc::dlsym(handle, symbol.as_ptr());
        let file = symbol_file(address);
        libc::dlclose(handle);
        file
    }
}

/// The file an address belongs to, by `dladdr`.
pub fn symbol_file(address: *const c_void) -> Option<PathBuf> {
    if address.is_null() {
        return None;
    }
    // SAFETY: dladdr fills `info` and reads nothing at `address`.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(address, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(PathBuf::from(
            CStr::from_ptr(info.dli_fname).to_string_lossy().as_ref(),
        ))
    }
}

/// The MPI libraries loaded in this process, canonicalized: the files that define
/// `PMPI_Init_thread`, as every MPI library does, found from the loaded objects whose name
/// holds "mpi". Not `MPI_Init_thread`: a profiling tool preloaded ahead of MPI (mpiP's
/// libmpiP.so, ...) defines that one too, and forwards to the library's `PMPI_Init_thread`,
/// so the lookup from the tool lands in the library it links (wrappers such as libmpicxx
/// likewise only depend on one).
pub fn loaded_mpi_libraries() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    for object in loaded_objects() {
        let looks_like_mpi = object
            .file_name()
            .map(|n| n.to_string_lossy().contains("mpi"))
            .unwrap_or(false);
        if !looks_like_mpi {
            continue;
        }
        if let Some(file) = defining_file(&object, c"PMPI_Init_thread") {
            let file = canonical(&file);
            if !found.contains(&file) {
                found.push(file);
            }
        }
    }
    found
}

pub fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}
