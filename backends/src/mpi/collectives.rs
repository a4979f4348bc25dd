//! The collectives that move equal blocks: bcast, gather, allgather, scatter, alltoall.

use jaxmpi_core::{Broadcast, Buf, BufMut, Comm, Error, Result};

use super::abi::Abi;
use super::calls::Direction;
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
            format!("internal error: the root's buffer passed on a rank that is not root {root}, or the reverse"),
        ));
    }
    let t = lib.typed(name, buf.count(), buf.dtype())?;
    lib.mpi_bcast(name, &buf, &t, root, handle)
}

/// gather and scatter: the root holds one block per rank (receives them for a gather,
/// sends them for a scatter); every rank's own block is the other buffer.
pub(super) fn rooted<A: Abi>(
    lib: &MpiLibrary<A>,
    direction: Direction,
    comm: Comm,
    send: Buf,
    recv: BufMut,
    root: i32,
) -> Result<()> {
    let name = match direction {
        Direction::Gather => "gather",
        Direction::Scatter => "scatter",
    };
    let handle = lib.comm(name, comm)?;
    let size = lib.size_of(name, handle)?;
    lib.check_root(name, root, size)?;
    let (own, own_dtype) = match direction {
        Direction::Gather => (send.count(), send.dtype()),
        Direction::Scatter => (recv.count(), recv.dtype()),
    };
    if lib.comm_rank_raw(handle)? == root {
        same_dtype(name, &send, &recv)?;
        match direction {
            Direction::Gather => expect_len(name, "the receive buffer", recv.count(), size * own),
            Direction::Scatter => expect_len(name, "the send buffer", send.count(), size * own),
        }?;
    }
    let t = lib.typed(name, own, own_dtype)?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    lib.mpi_equal_blocks(name, direction, s, r, &t, Some(root), handle)
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
    lib.mpi_equal_blocks(name, Direction::Gather, s, r, &t, None, handle)
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
    lib.mpi_equal_blocks(name, Direction::Scatter, s, r, &t, None, handle)
}
