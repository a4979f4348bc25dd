//! Point to point: send, recv, sendrecv (in place: MPI_Sendrecv_replace).

use jaxmpi_core::{Buf, BufMut, Comm, Envelope, Input, Peer, Result, Status};

use super::abi::{Abi, RawStatus};
use super::calls::RawEnvelope;
use super::library::MpiLibrary;

pub(super) fn send<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    buf: Buf,
    dest: Peer,
    tag: i32,
) -> Result<()> {
    let name = "send";
    let handle = lib.comm(name, comm)?;
    let dest = lib.peer(name, dest, false)?;
    let t = lib.typed(name, buf.count(), buf.dtype())?;
    lib.mpi_send(name, buf.ptr().cast(), &t, dest, tag, handle)
}

pub(super) fn recv<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    buf: BufMut,
    source: Peer,
    tag: Option<i32>,
) -> Result<Status> {
    let name = "recv";
    let handle = lib.comm(name, comm)?;
    let source = lib.peer(name, source, true)?;
    let t = lib.typed(name, buf.count(), buf.dtype())?;
    let mut status = RawStatus::default();
    let tag = lib.tag(tag);
    lib.mpi_recv(name, buf.ptr().cast(), &t, source, tag, handle, &mut status)?;
    lib.status(name, &mut status, &buf)
}

pub(super) fn sendrecv<A: Abi>(
    lib: &MpiLibrary<A>,
    sendbuf: Input,
    recvbuf: BufMut,
    envelope: Envelope,
) -> Result<Status> {
    let name = "sendrecv";
    let handle = lib.comm(name, envelope.comm)?;
    let raw = RawEnvelope {
        dest: lib.peer(name, envelope.dest, false)?,
        sendtag: envelope.sendtag,
        source: lib.peer(name, envelope.source, true)?,
        recvtag: lib.tag(envelope.recvtag),
    };
    let tr = lib.typed(name, recvbuf.count(), recvbuf.dtype())?;
    let ts = match sendbuf {
        Input::Data(buf) => Some((buf.ptr().cast(), lib.typed(name, buf.count(), buf.dtype())?)),
        Input::InPlace => None,
    };
    let s = ts.as_ref().map(|(p, t)| (*p, t));
    let mut status = RawStatus::default();
    let r = recvbuf.ptr().cast();
    lib.mpi_sendrecv(name, s, r, &tr, raw, handle, &mut status)?;
    lib.status(name, &mut status, &recvbuf)
}
