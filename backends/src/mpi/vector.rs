//! The variable-count collectives: gatherv, allgatherv, scatterv, alltoallv. Their buffers
//! are `Partition`s, checked here; the counts travel as given to MPI (`counts.rs`).

use jaxmpi_core::{Buf, BufMut, Comm, Partition, PartitionMut, Result};

use super::abi::Abi;
use super::handles::{expect_len, same_dtype};
use super::library::MpiLibrary;

/// The block the root keeps for itself must be what it passes as its own.
fn own_block(own: usize, counts: &[usize], root: i32) -> Result<()> {
    let want = counts.get(root as usize).copied().unwrap_or(0);
    expect_len("the root's own block", own, want)
}

pub(super) fn gatherv<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Buf,
    recv: PartitionMut,
    root: i32,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    let size = lib.size_of(handle)?;
    lib.check_root(root, size)?;
    if lib.comm_rank_raw(handle)? == root {
        same_dtype(&send, &recv.buf)?;
        own_block(send.count(), recv.blocks.counts, root)?;
        recv.check(size)?;
    }
    let t = lib.typed(send.count(), send.dtype())?;
    let dt = lib.pre.datatype(send.dtype());
    let (s, r) = (send.ptr().cast(), recv.buf.ptr().cast());
    lib.mpi_gatherv(s, &t, r, &recv.blocks, dt, Some(root), handle)
}

pub(super) fn allgatherv<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Buf,
    recv: PartitionMut,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    same_dtype(&send, &recv.buf)?;
    let size = lib.size_of(handle)?;
    let rank = lib.comm_rank_raw(handle)? as usize;
    recv.check(size)?;
    let mine = recv.blocks.counts[rank];
    expect_len("this rank's block", send.count(), mine)?;
    let t = lib.typed(send.count(), send.dtype())?;
    let dt = lib.pre.datatype(send.dtype());
    let (s, r) = (send.ptr().cast(), recv.buf.ptr().cast());
    lib.mpi_gatherv(s, &t, r, &recv.blocks, dt, None, handle)
}

pub(super) fn scatterv<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Partition,
    recv: BufMut,
    root: i32,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    let size = lib.size_of(handle)?;
    lib.check_root(root, size)?;
    if lib.comm_rank_raw(handle)? == root {
        same_dtype(&send.buf, &recv)?;
        own_block(recv.count(), send.blocks.counts, root)?;
        send.check(size)?;
    }
    let t = lib.typed(recv.count(), recv.dtype())?;
    let dt = lib.pre.datatype(recv.dtype());
    let (s, r) = (send.buf.ptr().cast(), recv.ptr().cast());
    lib.mpi_scatterv(s, &send.blocks, dt, r, &t, root, handle)
}

pub(super) fn alltoallv<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Partition,
    recv: PartitionMut,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    same_dtype(&send.buf, &recv.buf)?;
    let size = lib.size_of(handle)?;
    send.check(size)?;
    recv.check(size)?;
    let dt = lib.pre.datatype(send.buf.dtype());
    let (s, r) = (send.buf.ptr().cast(), recv.buf.ptr().cast());
    lib.mpi_alltoallv(s, &send.blocks, r, &recv.blocks, dt, handle)
}
