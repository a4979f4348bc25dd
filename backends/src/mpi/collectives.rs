//! The collectives that move blocks between ranks: bcast; gather and scatter, whose root
//! holds one block per rank, equal (gather, scatter) or as counted (gatherv, scatterv);
//! allgather and alltoall. allgatherv and alltoallv, where every rank holds a partition,
//! are in `vector.rs`.

use jaxmpi_core::{Blocks, Broadcast, Buf, BufMut, Comm, Error, Result};

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
    let c = lib.rooted_comm(comm, root)?;
    // The root's buffer may be read-only memory: it must be the root's to pass.
    if !buf.fits(c.at_root) {
        return Err(Error::invalid_argument(
            "root",
            format!("internal error: the root's buffer passed on a rank that is not root {root}, or the reverse"),
        ));
    }
    let t = lib.typed(buf.count(), buf.dtype())?;
    lib.mpi_bcast(&buf, &t, root, c.handle)
}

/// gather and scatter: the root holds one block per rank (receives them for a gather,
/// sends them for a scatter); every rank's own block is the other buffer. `blocks`: the
/// root buffer's block of each rank (gatherv, scatterv); None: equal blocks, each the size
/// of every rank's own.
pub(super) fn rooted<A: Abi>(
    lib: &MpiLibrary<A>,
    direction: Direction,
    comm: Comm,
    send: Buf,
    recv: BufMut,
    blocks: Option<Blocks>,
    root: i32,
) -> Result<bool> {
    let c = lib.rooted_comm(comm, root)?;
    let (own, own_dtype, all, all_name) = match direction {
        Direction::Gather => (
            send.count(),
            send.dtype(),
            recv.count(),
            "the receive buffer",
        ),
        Direction::Scatter => (recv.count(), recv.dtype(), send.count(), "the send buffer"),
    };
    if c.at_root {
        same_dtype(&send, &recv)?;
        match &blocks {
            None => expect_len(all_name, all, c.size * own)?,
            Some(blocks) => {
                // The block the root keeps for itself must be what it passes as its own.
                let mine = blocks.counts.get(root as usize).copied().unwrap_or(0);
                expect_len("the root's own block", own, mine)?;
                blocks.check(c.size, all)?;
            }
        }
    }
    let t = lib.typed(own, own_dtype)?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    let Some(blocks) = blocks else {
        lib.mpi_equal_blocks(direction, s, r, &t, Some(root), c.handle)?;
        return Ok(c.at_root);
    };
    let dt = lib.pre.datatype(own_dtype);
    match direction {
        Direction::Gather => lib.mpi_gatherv(s, &t, r, &blocks, dt, Some(root), c.handle)?,
        Direction::Scatter => lib.mpi_scatterv(s, &blocks, dt, r, &t, root, c.handle)?,
    }
    Ok(c.at_root)
}

/// allgather (every rank's block to every rank) and alltoall (block r of every rank to
/// rank r): equal blocks, no root.
pub(super) fn unrooted<A: Abi>(
    lib: &MpiLibrary<A>,
    direction: Direction,
    comm: Comm,
    send: Buf,
    recv: BufMut,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    same_dtype(&send, &recv)?;
    let size = lib.size_of(handle)?;
    let block = match direction {
        Direction::Gather => {
            expect_len("the receive buffer", recv.count(), size * send.count())?;
            send.count()
        }
        Direction::Scatter => {
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
            send.count() / size
        }
    };
    let t = lib.typed(block, send.dtype())?;
    let (s, r) = (send.ptr().cast(), recv.ptr().cast());
    lib.mpi_equal_blocks(direction, s, r, &t, None, handle)
}
