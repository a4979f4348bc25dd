//! `JAXMPI_MPI=linked`: the MPI this build was linked against through mpi-sys (feature
//! `linked`). It refuses to start under another MPI's launcher, where `MPI_Init` would
//! hang or silently give every rank a world of one.

use std::ffi::{c_char, c_void};

use jaxmpi_core::{Error, Family, Library, Result};

use super::detect::{launcher_hint, launcher_size};
use super::{family_of, loaded, open};
use crate::mpi::abi::linked::BUILD_MPICC;
use crate::mpi::abi::{Abi, Linked, Mpich, OpenMpi};
use crate::mpi::functions::Functions;
use crate::mpi::inspect::Inspect;
use crate::mpi::{c_string, one_line, MpiLibrary};

const STEP: &str = "select MPI";

/// The linked library, initialized.
pub fn load() -> Result<MpiLibrary<Linked>> {
    let fns = Functions::<<Linked as Abi>::Handle>::linked();
    let init = fns.MPI_Init_thread as *const c_void;
    let path = loaded::symbol_file(init)
        .map(|p| loaded::canonical(&p))
        .ok_or_else(|| Error::library(STEP, "the linked MPI_Init_thread lies in no loaded file"))?;
    let mut buffer = vec![0 as c_char; 8192];
    let mut len = 0;
    // SAFETY: callable before MPI_Init; the buffer exceeds MPI_MAX_LIBRARY_VERSION_STRING.
    unsafe { (fns.MPI_Get_library_version)(buffer.as_mut_ptr(), &mut len) };
    let version = c_string(&buffer, len);
    // The first line, up to Open MPI's ", package:": "MPICH Version: 4.0.2", "Open MPI v4.1.4".
    let first_line = version.lines().next().unwrap_or_default();
    let built = format!(
        "{} ({}, whose mpi.h was found through {BUILD_MPICC} at build time)",
        one_line(first_line.split(',').next().unwrap_or_default()),
        path.display()
    );
    // Opened again by path, RTLD_GLOBAL: Python loads extensions (and so the MPI they link)
    // with RTLD_LOCAL, but the optional lookups and Open MPI's plugins need its symbols.
    let lib =
        open(&path).map_err(|why| Error::library(STEP, format!("{}: {why}", path.display())))?;
    match family_of(&lib) {
        Some(family) if family == Linked::FAMILY => {}
        found => {
            return Err(Error::library(
                STEP,
                format!(
                    "this jaxmpi was linked against {built}, which is {}, but its mpi.h has {} \
                     handles; the linked backend supports the MPICH family and Open MPI: use JAXMPI_MPI=auto",
                    found.map_or("no known MPI family".to_string(), |f| f.to_string()),
                    Linked::FAMILY
                ),
            ))
        }
    }
    if let Some((_, launcher)) = launcher_hint().filter(|(f, _)| *f != Linked::FAMILY) {
        return Err(wrong_launcher(&built, launcher));
    }
    if let Some(other) = loaded::loaded_mpi_libraries()
        .into_iter()
        .find(|p| *p != path)
    {
        return Err(super::detect::second_library(
            &other,
            &format!("JAXMPI_MPI=linked ({})", path.display()),
        ));
    }
    let reason = format!(
        "{} because JAXMPI_MPI=linked (built with {BUILD_MPICC})",
        path.display()
    );
    let library = MpiLibrary::<Linked>::with_functions(lib, fns, path, reason, None)?;
    // A launcher of the same family but another PMI can still start singletons.
    if let Some((size, variable)) = launcher_size() {
        let world = library.comm_size(library.world())?;
        if world != size {
            return Err(wrong_launcher(
                &built,
                &format!("a launcher that set {variable}={size}, but MPI_Init gave a world of {world} ranks"),
            ));
        }
    }
    Ok(library)
}

fn wrong_launcher(built: &str, launcher: &str) -> Error {
    Error::library(
        STEP,
        format!(
            "this jaxmpi was built against {built}, but the job was started by {launcher}. \
             Start it with the launcher of the MPI it was built against, rebuild jaxmpi with the \
             mpicc of the MPI you launch with (MPICC=... maturin build --features linked), \
             or use JAXMPI_MPI=auto"
        ),
    )
}

/// The linked backend and the dlopened backend of the same library file, in one process
/// (the oracle compares them). The linked one initializes MPI, so it owns finalization.
pub fn load_twins() -> Result<(Box<dyn Inspect>, Box<dyn Inspect>)> {
    let linked = load()?;
    let path = linked.info().path.clone();
    let lib =
        open(&path).map_err(|why| Error::library(STEP, format!("{}: {why}", path.display())))?;
    let reason = format!(
        "{} because it is the linked backend's library",
        path.display()
    );
    let loaded: Box<dyn Inspect> = match Linked::FAMILY {
        Family::Mpich => Box::new(MpiLibrary::<Mpich>::load(lib, path, reason)?),
        _ => Box::new(MpiLibrary::<OpenMpi>::load(lib, path, reason)?),
    };
    Ok((Box::new(linked), loaded))
}
