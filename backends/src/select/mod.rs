//! Which MPI library this process uses, chosen once: `select()` picks it (`detect.rs`: the
//! user's request, an MPI already loaded, mpi4py's variables, the launcher, the search
//! path), opens it with dlopen, tells its ABI family apart, and installs a
//! `MpiLibrary<Family>` as the process's `dyn Library`. `loaded.rs` finds what the process
//! has loaded already; `linked.rs` is the optional build linked against one MPI.

pub mod detect;
#[cfg(feature = "linked")]
pub mod linked;
pub(crate) mod loaded;

use std::ffi::c_int;
use std::path::Path;

use jaxmpi_core::{install_library, Error, Family, Library, Result};
use libloading::os::unix::{Library as UnixLibrary, RTLD_GLOBAL, RTLD_NOW};

use crate::mpi::abi::{Mpich, OpenMpi, Standard};
use crate::mpi::functions;
use crate::mpi::MpiLibrary;
use detect::{choose, Choice, Request, SearchPath};

const STEP: &str = "select MPI";

/// The process's library, selected from `JAXMPI_MPI` and the environment on first use.
pub fn select() -> Result<&'static dyn Library> {
    select_with(&SearchPath::from_env())
}

/// As `select`, with the search prefixes the caller knows (Python passes sys.prefix etc.).
pub fn select_with(search: &SearchPath) -> Result<&'static dyn Library> {
    install_library(|| load(&Request::from_env()?, search))
}

/// Chooses, opens and initializes a library without installing it (`select` installs).
pub fn load(request: &Request, search: &SearchPath) -> Result<Box<dyn Library>> {
    #[cfg(feature = "linked")]
    if *request == Request::Linked {
        return Ok(Box::new(linked::load()?));
    }
    let loaded = loaded::loaded_mpi_libraries();
    let mut tried = Vec::new();
    for choice in choose(request, search, &loaded)? {
        match open(&choice.library) {
            Ok(lib) => return build(lib, &choice, loaded.first().map(|p| p.as_path())),
            Err(why) => tried.push(format!("  {}: {why}", choice.library.display())),
        }
    }
    Err(Error::library(
        STEP,
        format!(
            "no MPI library could be loaded for JAXMPI_MPI={}. Tried:\n{}\nInstall one (e.g. `pip install mpich`), \
             or set JAXMPI_MPI to the path of your libmpi",
            std::env::var("JAXMPI_MPI").unwrap_or_else(|_| "auto".into()),
            tried.join("\n")
        ),
    ))
}

fn open(library: &Path) -> Result<libloading::Library, String> {
    // RTLD_GLOBAL: Open MPI's plugins resolve symbols of libmpi through the global scope.
    // SAFETY: loading runs the library's initializers; MPI libraries have no harmful ones.
    match unsafe { UnixLibrary::open(Some(library), RTLD_NOW | RTLD_GLOBAL) } {
        Ok(lib) => Ok(lib.into()),
        Err(err) => Err(err.to_string()),
    }
}

/// Tells the ABI family of an opened library by symbols only that family answers to (below).
fn family_of(lib: &libloading::Library) -> Option<Family> {
    type AbiVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
    // SAFETY: symbol lookups only; MPI_Abi_get_version may be called before MPI_Init (a
    // call of jaxmpi's like any other: a profiling tool's definition where it has one).
    unsafe {
        if let Some(abi_version) = functions::optional::<AbiVersion>(lib, "MPI_Abi_get_version") {
            let (mut major, mut minor) = (-1, -1);
            // Native MPICH 5 exports it too but answers -1.
            if abi_version(&mut major, &mut minor) == 0 && major > 0 {
                return Some(Family::MpiAbi);
            }
        }
        if lib
            .get::<*mut std::ffi::c_void>(b"ompi_mpi_comm_self\0")
            .is_ok()
        {
            return Some(Family::OpenMpi);
        }
        lib.get::<*mut std::ffi::c_void>(b"MPI_Init_thread\0")
            .ok()
            .map(|_| Family::Mpich)
    }
}

fn build(
    lib: libloading::Library,
    choice: &Choice,
    already_loaded: Option<&Path>,
) -> Result<Box<dyn Library>> {
    // SAFETY: the address of a function symbol, only passed to dladdr.
    let init = unsafe {
        lib.get::<*mut std::ffi::c_void>(b"MPI_Init_thread\0")
            .map(|s| *s)
    };
    let path = init
        .ok()
        .and_then(|a| loaded::symbol_file(a))
        .map(|p| loaded::canonical(&p));
    let (Some(path), Some(family)) = (path, family_of(&lib)) else {
        return Err(Error::library(
            STEP,
            format!(
                "{} is not an MPI library (it defines no MPI_Init_thread)",
                choice.library.display()
            ),
        ));
    };
    if let Some(loaded) = already_loaded.filter(|l| *l != path) {
        return Err(detect::second_library(loaded, &path.display().to_string()));
    }
    if let Some(wanted) = choice.family.filter(|w| *w != family) {
        return Err(Error::library(
            STEP,
            format!(
                "{} is an {family} library, but {wanted} was requested ({}); set JAXMPI_MPI to match the MPI you run with",
                path.display(),
                choice.reason
            ),
        ));
    }
    let reason = format!("{} because {}", path.display(), choice.reason);
    Ok(match family {
        Family::Mpich => Box::new(MpiLibrary::<Mpich>::load(lib, path, reason)?),
        Family::OpenMpi => Box::new(MpiLibrary::<OpenMpi>::load(lib, path, reason)?),
        Family::MpiAbi => Box::new(MpiLibrary::<Standard>::load(lib, path, reason)?),
    })
}
