//! The variable-count collectives where every rank holds a partition: allgatherv and
//! alltoallv. (gatherv and scatterv, partitioned at the root only, are
//! `collectives::rooted`.) The counts travel as given to MPI (`counts.rs`).

use jaxmpi_core::{Buf, Comm, Partition, PartitionMut, Result};

use super::abi::Abi;
use super::handles::{expect_len, same_dtype};
use super::library::MpiLibrary;

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
