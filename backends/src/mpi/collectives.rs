//! The collectives that move equal blocks: bcast, gather, allgather, scatter, alltoall.

use jaxmpi_core::{Broadcast, Buf, BufMut, Comm, Error, Result};

use super::abi::Abi;
use super::count_agnostic::Direction;
use super::handles::{expect_len, same_dtype};
use super::library::MpiLibrary;

pub(super) fn bcast<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    buf: Broadcast,
    root: i32,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    lib.check_root(root, lib.size_of(handle)?)?;
    // The root's buffer may be read-only memory: it must be the root's to pass.
    if buf.is_root() != (lib.comm_rank_raw(handle)? == root) {
        return Err(Error::invalid_argument(
            "root",
            format!("internal error: the root's buffer passed on a rank that is not root {root}, or the reverse"),
        ));
    }
    let t = lib.typed(buf.count(), buf.dtype())?;
    lib.mpi_bcast(&buf, &t, root, handle)
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
    let handle = lib.comm(comm)?;
    let size = lib.size_of(handle)?;
    lib.check_root(root, size)?;
    let (own, own_dtype) = match direction {
        Direction::Gather => (send.count(), send.dtype()),
        Direction::Scatter => (recv.count(), recv.dtype()),
    };
    if lib.comm_rank_raw(handle)? == root {
        same_dtype(&send, &recv)?;
        match direction {
            Direction::Gather => expect_len("the receive buffer", recv.count(), size * own),
            Direction::Scatter => expect_len("the send buffer", send.count(), size * own),
        }?;
    }
    let t = lib.typed(own, own_dtype)?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    lib.mpi_equal_blocks(direction, s, r, &t, Some(root), handle)
}

pub(super) fn allgather<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Buf,
    recv: BufMut,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    same_dtype(&send, &recv)?;
    let want = lib.size_of(handle)? * send.count();
    expect_len("the receive buffer", recv.count(), want)?;
    let t = lib.typed(send.count(), send.dtype())?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    lib.mpi_equal_blocks(Direction::Gather, s, r, &t, None, handle)
}

pub(super) fn alltoall<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Buf,
    recv: BufMut,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    same_dtype(&send, &recv)?;
    let size = lib.size_of(handle)?;
    expect_len("the receive buffer", recv.count(), send.count())?;
    if !send.count().is_multiple_of(size) {
        return Err(Error::invalid_argument(
            "buffers",
            format!(
                "{} elements do not split into {size} equal blocks",
                send.count()
            ),
        ));
    }
    let t = lib.typed(send.count() / size, send.dtype())?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    lib.mpi_equal_blocks(Direction::Scatter, s, r, &t, None, handle)
}
