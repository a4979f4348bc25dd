//! Point to point: send, recv, sendrecv (in place: MPI_Sendrecv_replace), and the
//! non-blocking isend and irecv (their requests complete in `requests.rs`).

use jaxmpi_core::{Buf, BufMut, Comm, Envelope, Input, Peer, Request, Result, Status};

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
