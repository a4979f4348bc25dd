//! Point to point: send, recv, sendrecv (in place: MPI_Sendrecv_replace).

use jaxmpi_core::{Buf, BufMut, Comm, Envelope, Input, Peer, Result, Status};

use super::abi::{Abi, RawStatus};
use super::count_agnostic::RawEnvelope;
use super::library::MpiLibrary;

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
    let source = lib.peer(source, true)?;
    let t = lib.typed(buf.count(), buf.dtype())?;
    let mut status = RawStatus::default();
    let tag = lib.tag(tag);
    lib.mpi_recv(buf.ptr().cast(), &t, source, tag, handle, &mut status)?;
    lib.status(&mut status, &buf)
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
    lib.status(&mut status, &recvbuf)
}
