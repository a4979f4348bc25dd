//! Point to point: send, recv, sendrecv (in place: MPI_Sendrecv_replace), and the
//! non-blocking isend and irecv with the test, wait and abandonment of their requests.

use std::ffi::c_int;

use jaxmpi_core::{Buf, BufMut, Comm, Envelope, Input, Peer, Progress, Request, Result, Status};

use super::abi::{Abi, RawStatus};
use super::count_agnostic::RawEnvelope;
use super::library::MpiLibrary;
use super::starting;

pub(super) fn send<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    buf: Buf,
    dest: Peer,
    tag: i32,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    let dest = lib.peer(dest, false)?;
    let t = lib.typed(buf.count(), buf.dtype())?;
    lib.mpi_send(buf.ptr().cast(), &t, dest, tag, handle)
}

pub(super) fn recv<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    buf: BufMut,
    source: Peer,
    tag: Option<i32>,
) -> Result<Status> {
    let handle = lib.comm(comm)?;
    // Started, a receive from nobody starts nothing: it moves nothing, and some
    // libraries' requests for it complete with a status naming a rank (MPICH 4.0).
    if source == Peer::Null && starting::active() {
        return Ok(Status::not_yet());
    }
    let source = lib.peer(source, true)?;
    let t = lib.typed(buf.count(), buf.dtype())?;
    let mut status = RawStatus::default();
    let tag = lib.tag(tag);
    let dtype = buf.dtype();
    lib.mpi_recv(
        buf.ptr().cast(),
        &t,
        source,
        tag,
        handle,
        &mut status,
        dtype,
    )?;
    if starting::active() {
        return Ok(Status::not_yet());
    }
    lib.status(&mut status, dtype)
}

pub(super) fn sendrecv<A: Abi>(
    lib: &MpiLibrary<A>,
    sendbuf: Input,
    recvbuf: BufMut,
    envelope: Envelope,
) -> Result<Status> {
    let handle = lib.comm(envelope.comm)?;
    let raw = RawEnvelope {
        dest: lib.peer(envelope.dest, false)?,
        sendtag: envelope.sendtag,
        source: lib.peer(envelope.source, true)?,
        recvtag: lib.tag(envelope.recvtag),
    };
    let tr = lib.typed(recvbuf.count(), recvbuf.dtype())?;
    let ts = match sendbuf {
        Input::Data(buf) => Some((buf.ptr().cast(), lib.typed(buf.count(), buf.dtype())?)),
        Input::InPlace => None,
    };
    let s = ts.as_ref().map(|(p, t)| (*p, t));
    let mut status = RawStatus::default();
    let r = recvbuf.ptr().cast();
    lib.mpi_sendrecv(s, r, &tr, raw, handle, &mut status)?;
    lib.status(&mut status, recvbuf.dtype())
}

/// # Safety
/// As `Backend::isend`: `buf` outlives the request, unchanged.
pub(super) unsafe fn isend<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    buf: Buf,
    dest: Peer,
    tag: i32,
) -> Result<Request> {
    let handle = lib.comm(comm)?;
    let dest = lib.peer(dest, false)?;
    let t = lib.typed(buf.count(), buf.dtype())?;
    let mut request = lib.pre.comm_null; // overwritten by MPI_Isend
    lib.mpi_isend(buf.ptr().cast(), &t, (dest, tag), handle, &mut request)?;
    Ok(Request {
        raw: A::handle_to_raw(request),
        receives: None,
    })
}

/// # Safety
/// As `Backend::irecv`: `buf` outlives the request, and only MPI writes it meanwhile.
pub(super) unsafe fn irecv<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    buf: BufMut,
    source: Peer,
    tag: Option<i32>,
) -> Result<Request> {
    let handle = lib.comm(comm)?;
    let source = lib.peer(source, true)?;
    let t = lib.typed(buf.count(), buf.dtype())?;
    let mut request = lib.pre.comm_null; // overwritten by MPI_Irecv
    lib.mpi_irecv(
        buf.ptr().cast(),
        &t,
        (source, lib.tag(tag)),
        handle,
        &mut request,
    )?;
    Ok(Request {
        raw: A::handle_to_raw(request),
        receives: Some(buf.dtype()),
    })
}

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
