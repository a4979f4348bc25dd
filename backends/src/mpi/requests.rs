//! Completing a request: its test, wait or abandonment, whoever started it (isend and
//! irecv, or an op in starting mode, `starting.rs`).

use std::ffi::c_int;

use jaxmpi_core::{Progress, Request, Result};

use super::abi::{Abi, RawStatus};
use super::library::MpiLibrary;

fn request_handle<A: Abi>(request: &Request) -> Result<A::Handle> {
    A::handle_from_raw(request.raw)
        .map_err(|why| jaxmpi_core::Error::invalid_argument("request", why))
}

/// What a completed request reports: a receive's status, or that a send is done.
fn completed<A: Abi>(
    lib: &MpiLibrary<A>,
    request: &Request,
    status: &mut RawStatus,
) -> Result<Progress> {
    match request.receives {
        Some(dtype) => Ok(Progress::Received(lib.status(status, dtype)?)),
        None => Ok(Progress::Sent),
    }
}

pub(super) fn test<A: Abi>(lib: &MpiLibrary<A>, request: &mut Request) -> Result<Progress> {
    let mut handle = request_handle::<A>(request)?;
    let (mut done, mut status): (c_int, _) = (0, RawStatus::default());
    // SAFETY: a live request this library started; one flag and one whole status written.
    let rc = unsafe { (lib.fns.MPI_Test)(&mut handle, &mut done, status.as_mut_ptr()) };
    lib.check("MPI_Test", rc)?;
    if done == 0 {
        return Ok(Progress::Pending);
    }
    completed(lib, request, &mut status)
}

pub(super) fn wait<A: Abi>(lib: &MpiLibrary<A>, request: &mut Request) -> Result<Progress> {
    let mut handle = request_handle::<A>(request)?;
    let mut status = RawStatus::default();
    // SAFETY: a live request this library started; one whole status written.
    let rc = unsafe { (lib.fns.MPI_Wait)(&mut handle, status.as_mut_ptr()) };
    lib.check("MPI_Wait", rc)?;
    completed(lib, request, &mut status)
}

pub(super) fn abandon<A: Abi>(lib: &MpiLibrary<A>, request: Request) -> Result<()> {
    let mut handle = request_handle::<A>(&request)?;
    if request.receives.is_some() {
        // SAFETY: a live request this library started.
        lib.check("MPI_Cancel", unsafe { (lib.fns.MPI_Cancel)(&mut handle) })?;
    }
    // SAFETY: as above; MPI frees it once its transfer ends or is cancelled.
    let rc = unsafe { (lib.fns.MPI_Request_free)(&mut handle) };
    lib.check("MPI_Request_free", rc)
}
