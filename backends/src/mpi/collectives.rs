//! The collectives that move equal blocks: bcast, gather, allgather, scatter, alltoall.

use jaxmpi_core::{Broadcast, Buf, BufMut, Comm, Error, Result};

use super::abi::Abi;
use super::handles::{expect_len, same_dtype};
use super::library::MpiLibrary;

pub(super) fn bcast<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    buf: Broadcast,
    root: i32,
) -> Result<()> {
    let name = "bcast";
    let handle = lib.comm(name, comm)?;
    lib.check_root(name, root, lib.size_of(name, handle)?)?;
    // The root's buffer may be read-only memory: it must be the root's to pass.
    if buf.is_root() != (lib.comm_rank_raw(handle)? == root) {
        return Err(Error::invalid_argument(
            name,
            format!(
                "internal error: the buffer passed is not the one of a rank whose root is {root}"
            ),
        ));
    }
    let t = lib.typed(name, buf.count(), buf.dtype())?;
    lib.bcast_c(name, &buf, &t, root, handle)
}

pub(super) fn gather<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Buf,
    recv: BufMut,
    root: i32,
) -> Result<()> {
    let name = "gather";
    let handle = lib.comm(name, comm)?;
    let size = lib.size_of(name, handle)?;
    lib.check_root(name, root, size)?;
    if lib.comm_rank_raw(handle)? == root {
        same_dtype(name, &send, &recv)?;
        let want = size * send.count();
        expect_len(name, "the receive buffer", recv.count(), want)?;
    }
    let t = lib.typed(name, send.count(), send.dtype())?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    lib.gather_c(name, s, r, &t, Some(root), handle)
}

pub(super) fn allgather<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Buf,
    recv: BufMut,
) -> Result<()> {
    let name = "allgather";
    let handle = lib.comm(name, comm)?;
    same_dtype(name, &send, &recv)?;
    let want = lib.size_of(name, handle)? * send.count();
    expect_len(name, "the receive buffer", recv.count(), want)?;
    let t = lib.typed(name, send.count(), send.dtype())?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    lib.gather_c(name, s, r, &t, None, handle)
}

pub(super) fn scatter<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Buf,
    recv: BufMut,
    root: i32,
) -> Result<()> {
    let name = "scatter";
    let handle = lib.comm(name, comm)?;
    let size = lib.size_of(name, handle)?;
    lib.check_root(name, root, size)?;
    if lib.comm_rank_raw(handle)? == root {
        same_dtype(name, &send, &recv)?;
        expect_len(name, "the send buffer", send.count(), size * recv.count())?;
    }
    let t = lib.typed(name, recv.count(), recv.dtype())?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    lib.scatter_c(name, s, r, &t, Some(root), handle)
}

pub(super) fn alltoall<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Buf,
    recv: BufMut,
) -> Result<()> {
    let name = "alltoall";
    let handle = lib.comm(name, comm)?;
    same_dtype(name, &send, &recv)?;
    let size = lib.size_of(name, handle)?;
    expect_len(name, "the receive buffer", recv.count(), send.count())?;
    if send.count() % size != 0 {
        return Err(Error::invalid_argument(
            name,
            format!(
                "{} elements do not split into {size} equal blocks",
                send.count()
            ),
        ));
    }
    let t = lib.typed(name, send.count() / size, send.dtype())?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    lib.scatter_c(name, s, r, &t, None, handle)
}
