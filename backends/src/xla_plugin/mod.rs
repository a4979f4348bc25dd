//! The plug-in through which XLA's MPI backend runs JAX's CPU collectives over jaxmpi's MPI.
//!
//! jaxlib carries MPItrampoline: a constructor in `libjax_common.so` dlopens the library that
//! `MPITRAMPOLINE_LIB` names at `import jax`, reads every name of its table (`contract.rs`:
//! 260 constants, 374 functions) and the ABI version below, and from then on forwards XLA's
//! MPI calls to it. jaxmpi's extension module is that library: the wheel's startup hook
//! points `MPITRAMPOLINE_LIB` at it, so the process has one jaxmpi, one MPI library, one
//! initialization and one monitor for jaxmpi's ops and JAX's collectives alike.
//!
//! Loading costs nothing else: no code runs until XLA's first MPI call (`MPI_Init_thread`,
//! when JAX starts its CPU client with `jax_cpu_collectives_implementation="mpi"`), and no
//! MPI library is loaded before it.
//!
//! The constants are copied by jaxlib at `import jax`, before any MPI is chosen, so they
//! are the MPI-5 standard ABI's values, whatever MPI is loaded later; `encoding.rs`
//! translates them at every call, `calls.rs` implements the calls XLA makes, and every other
//! function fails with a message that names it.

mod calls;
mod encoding;

use std::cell::RefCell;
use std::ffi::{c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use jaxmpi_core::{Error, Library, Result};

use crate::select::detect::SearchPath;

/// Exported constants: `NAME: type = value;` each becomes a symbol jaxlib reads once.
macro_rules! exported_constants {
    ($($name:ident: $ty:ty = $value:expr;)*) => {$(
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static $name: $ty = $value;
    )*};
}

/// Functions XLA never calls: each says so and fails (see `Failure`).
macro_rules! unsupported_functions {
    ($($ty:ident $name:ident;)*) => {$(
        #[no_mangle]
        #[allow(non_snake_case)]
        extern "C" fn $name() -> $ty {
            super::unsupported(stringify!($name))
        }
    )*};
}

mod contract;

// What MPItrampoline reads before anything else. It requires MPI ABI 2.x with x >= 9; the
// "MPIwrapper" version is only printed (MPITRAMPOLINE_VERBOSE=1): jaxmpi's own.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mpiabi_version_major: c_int = 2;
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mpiabi_version_minor: c_int = 9;
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mpiabi_version_patch: c_int = 0;
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mpiwrapper_version_major: c_int = version_part(0);
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mpiwrapper_version_minor: c_int = version_part(1);
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mpiwrapper_version_patch: c_int = version_part(2);

/// Part `index` of this crate's version, at compile time.
const fn version_part(index: usize) -> c_int {
    let version = env!("CARGO_PKG_VERSION").as_bytes();
    let (mut i, mut part, mut value) = (0, 0, 0);
    while i < version.len() && version[i] != b'-' && version[i] != b'+' {
        match version[i] {
            b'.' => part += 1,
            digit if part == index => value = value * 10 + (digit - b'0') as c_int,
            _ => {}
        }
        i += 1;
    }
    value
}

/// Set when jaxlib's MPItrampoline has loaded this library: it calls this once, right
/// after the version check (jaxmpi has no Fortran constants to export).
static LOADED_BY_JAXLIB: AtomicBool = AtomicBool::new(false);

#[no_mangle]
extern "C" fn mpiwrapper_export_fortran_constants_() {
    LOADED_BY_JAXLIB.store(true, Ordering::SeqCst);
}

/// Whether jaxlib's MPItrampoline loaded this library, i.e. whether XLA's MPI collectives
/// in this process would run through jaxmpi.
pub fn loaded_by_jaxlib() -> bool {
    LOADED_BY_JAXLIB.load(Ordering::SeqCst)
}

/// Set when jaxmpi's Python runtime will finalize MPI at its own exit: XLA's MPI_Finalize
/// (from an `atexit` of JAX's, which may run before jaxmpi's) then leaves it to that.
static RUNTIME_FINALIZES: AtomicBool = AtomicBool::new(false);

/// Makes the caller, not XLA, the one who finalizes MPI (if jaxmpi initialized it).
pub fn finalize_at_runtime_exit() {
    RUNTIME_FINALIZES.store(true, Ordering::SeqCst);
}

/// The MPI library for XLA's calls: the process's, selected here if XLA comes first (JAX's
/// CPU client started before jaxmpi was imported), by the same rules as jaxmpi's import.
fn library() -> Result<&'static dyn Library> {
    if let Ok(library) = jaxmpi_core::library() {
        return Ok(library);
    }
    crate::select::select_with(&search_path())
}

/// Where jaxmpi's import would look first (Python passes sys.prefix and friends): the
/// active environment, and the one this library is installed in
/// (`<prefix>/lib/pythonX.Y/site-packages/jaxmpi/<this>`), which is where mpi4py and an MPI
/// wheel installed beside jaxmpi live even when nobody activated it.
fn search_path() -> SearchPath {
    let mut search = SearchPath::from_env();
    let here = crate::select::loaded::symbol_file(loaded_by_jaxlib as *const c_void);
    if let Some(prefix) = here.as_deref().and_then(install_prefix) {
        if !search.prefixes.contains(&prefix) {
            search.prefixes.insert(0, prefix);
        }
    }
    search
}

fn install_prefix(module: &Path) -> Option<PathBuf> {
    let site_packages = module.parent()?.parent()?;
    let lib = site_packages.parent()?.parent()?;
    let site = site_packages.file_name()?.to_str()?;
    let lib_name = lib.file_name()?.to_str()?;
    if matches!(site, "site-packages" | "dist-packages") && matches!(lib_name, "lib" | "lib64") {
        return lib.parent().map(Path::to_path_buf);
    }
    None
}

thread_local! {
    /// The last failure on this thread, for the MPI_Error_string that XLA calls right after.
    static LAST_FAILURE: RefCell<Option<(c_int, CString)>> = const { RefCell::new(None) };
}

/// The message of `code` if it is this thread's last failure.
fn failure_message(code: c_int) -> Option<CString> {
    LAST_FAILURE.with(|last| match &*last.borrow() {
        Some((kept, message)) if *kept == code => Some(message.clone()),
        _ => None,
    })
}

fn keep_failure(code: c_int, message: String) {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_FAILURE.with(|last| *last.borrow_mut() = Some((code, message)));
}

/// Runs a call's body for XLA: its error becomes an MPI error code whose message
/// MPI_Error_string gives, and a panic never unwinds into XLA's C++ frames.
fn answer(function: &'static str, body: impl FnOnce() -> Result<()>) -> c_int {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return encoding::SUCCESS,
        Ok(Err(err)) => err,
        Err(_) => Error::unsupported(function, "internal error (panic)"),
    };
    let code = encoding::error_code(&failure);
    keep_failure(code, format!("jaxmpi: {failure}"));
    code
}

/// What an unsupported function returns: an error code, or a value no caller can take for
/// a result.
trait Failure {
    const FAILED: Self;
}
impl Failure for i32 {
    const FAILED: i32 = encoding::ERR_UNSUPPORTED_OPERATION;
}
impl Failure for isize {
    const FAILED: isize = 0;
}
impl Failure for usize {
    const FAILED: usize = 0; // no handle of the MPI-5 ABI is 0
}
impl Failure for f64 {
    const FAILED: f64 = f64::NAN;
}

/// An MPI function jaxlib forwarded but jaxmpi's plug-in does not implement: XLA's
/// collectives never call it, so a caller is something new in jaxlib. Says which, on
/// stderr (once per function) and through MPI_Error_string, and fails.
fn unsupported<T: Failure>(abi_name: &'static str) -> T {
    let name = abi_name.replacen("ABI_", "_", 1);
    let message = format!(
        "jaxmpi: {name} was called through jaxlib's MPI interface (MPItrampoline), but \
         jaxmpi's plug-in implements only the MPI calls of XLA's CPU collectives ({}). \
         Please report this with your jaxlib version; meanwhile use \
         jaxmpi.distributed.initialize(collectives=\"gloo\").",
        calls::IMPLEMENTED.join(", ")
    );
    static SAID: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if !said.contains(&abi_name) {
        said.push(abi_name);
        eprintln!("{message}");
    }
    keep_failure(encoding::ERR_UNSUPPORTED_OPERATION, message);
    T::FAILED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abi_version_is_the_one_mpitrampoline_5_requires() {
        assert_eq!((mpiabi_version_major, mpiabi_version_minor), (2, 9));
        let ours: Vec<c_int> = env!("CARGO_PKG_VERSION")
            .split(['.', '-'])
            .take(3)
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(
            ours,
            [
                mpiwrapper_version_major,
                mpiwrapper_version_minor,
                mpiwrapper_version_patch
            ]
        );
    }

    #[test]
    fn the_install_prefix_is_four_levels_above_the_package() {
        let module = Path::new("/opt/venv/lib/python3.11/site-packages/jaxmpi/_native.abi3.so");
        assert_eq!(install_prefix(module), Some(PathBuf::from("/opt/venv")));
        let debian = Path::new("/usr/lib/python3/dist-packages/jaxmpi/_native.abi3.so");
        assert_eq!(install_prefix(debian), Some(PathBuf::from("/usr")));
        let source_tree = Path::new("/src/jaxmpi/python/jaxmpi/_native.abi3.so");
        assert_eq!(install_prefix(source_tree), None);
    }

    #[test]
    fn an_unsupported_function_fails_and_says_its_name_through_error_string() {
        let code: i32 = unsupported("MPIABI_Bsend");
        assert_eq!(code, encoding::ERR_UNSUPPORTED_OPERATION);
        let message = failure_message(code).unwrap().into_string().unwrap();
        assert!(message.contains("MPI_Bsend was called"), "{message}");
        assert!(unsupported::<f64>("MPIABI_Wtime").is_nan());
    }
}
