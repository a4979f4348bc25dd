//! `Backend` for `MpiLibrary`: each op, written once for all families, lives in the file of
//! its kind (`reductions`, `collectives`, `vector`, `p2p`); the MPI functions they call
//! (`count_agnostic.rs`) pick the count convention in `counts.rs`.

use jaxmpi_core::{
    Backend, Broadcast, Buf, BufMut, Comm, Envelope, Input, Partition, PartitionMut, Peer,
    Progress, ReduceOp, Request, Result, Started, Status,
};

use super::abi::Abi;
use super::count_agnostic::Direction;
use super::handles::{expect_len, same_dtype};
use super::library::MpiLibrary;
use super::{collectives, p2p, reductions, requests, starting, vector};
use crate::chunks;

impl<A: Abi> Backend for MpiLibrary<A> {
    fn barrier(&self, comm: Comm) -> Result<()> {
        self.refuses_to_start("MPI_Barrier")?;
        let comm = self.comm(comm)?;
        // SAFETY: a valid communicator.
        self.check("MPI_Barrier", unsafe { (self.fns.MPI_Barrier)(comm) })
    }
    /// In the chunks every rank cuts, whatever memory its buffers are in (`chunks`).
    fn allreduce(&self, comm: Comm, send: Input, mut recv: BufMut, op: ReduceOp) -> Result<()> {
        if let Input::Data(buf) = &send {
            same_dtype(buf, &recv)?;
            expect_len("the receive buffer", recv.count(), buf.count())?;
        }
        let f = reductions::Pair {
            names: ("MPI_Allreduce", "MPI_Iallreduce"),
            blocking: self.fns.MPI_Allreduce,
            started: self.fns.MPI_Iallreduce,
        };
        // A large one may go round a ring instead (`reductions::large_allreduce`); this
        // test is all that a small one pays for it.
        if recv.len_bytes() >= reductions::RING_FROM {
            return reductions::large_allreduce(self, &f, comm, send, recv, op);
        }
        let pieces = chunks::spans(recv.count(), recv.dtype().size(), chunks::CHUNK_BYTES);
        chunks::each_span(pieces, |start, n| {
            let part = recv.part(start, n);
            reductions::elementwise(self, &f, comm, send.part(start, n), part, op)
        })
    }
    fn reduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp, root: i32) -> Result<()> {
        reductions::reduce(self, comm, send, recv, op, root)
    }
    fn scan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let f = reductions::Pair {
            names: ("MPI_Scan", "MPI_Iscan"),
            blocking: self.fns.MPI_Scan,
            started: self.fns.MPI_Iscan,
        };
        reductions::elementwise(self, &f, comm, send, recv, op)
    }
    fn exscan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let f = reductions::Pair {
            names: ("MPI_Exscan", "MPI_Iexscan"),
            blocking: self.fns.MPI_Exscan,
            started: self.fns.MPI_Iexscan,
        };
        reductions::elementwise(self, &f, comm, send, recv, op)
    }
    fn reduce_scatter(&self, comm: Comm, send: Buf, recv: BufMut, op: ReduceOp) -> Result<()> {
        reductions::reduce_scatter(self, comm, send, recv, op)
    }
    fn reduce_local(&self, src: Buf, dst: BufMut, op: ReduceOp) -> Result<()> {
        reductions::reduce_local(self, src, dst, op)
    }

    /// In the chunks every rank cuts, whatever memory its buffer is in (`chunks`).
    fn bcast(&self, comm: Comm, mut buf: Broadcast, root: i32) -> Result<()> {
        let pieces = chunks::spans(buf.count(), buf.dtype().size(), chunks::CHUNK_BYTES);
        chunks::each_span(pieces, |start, n| {
            collectives::bcast(self, comm, buf.part(start, n), root)
        })
    }
    fn gather(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<bool> {
        collectives::rooted(self, Direction::Gather, comm, send, recv, None, root)
    }
    fn allgather(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        collectives::unrooted(self, Direction::Gather, comm, send, recv)
    }
    fn scatter(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        collectives::rooted(self, Direction::Scatter, comm, send, recv, None, root).map(|_| ())
    }
    fn alltoall(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        collectives::unrooted(self, Direction::Scatter, comm, send, recv)
    }

    fn gatherv(&self, comm: Comm, send: Buf, recv: PartitionMut, root: i32) -> Result<bool> {
        let (recv, blocks) = (recv.buf, Some(recv.blocks));
        collectives::rooted(self, Direction::Gather, comm, send, recv, blocks, root)
    }
    fn allgatherv(&self, comm: Comm, send: Buf, recv: PartitionMut) -> Result<()> {
        vector::allgatherv(self, comm, send, recv)
    }
    fn scatterv(&self, comm: Comm, send: Partition, recv: BufMut, root: i32) -> Result<()> {
        let (send, blocks) = (send.buf, Some(send.blocks));
        collectives::rooted(self, Direction::Scatter, comm, send, recv, blocks, root).map(|_| ())
    }
    fn alltoallv(&self, comm: Comm, send: Partition, recv: PartitionMut) -> Result<()> {
        vector::alltoallv(self, comm, send, recv)
    }

    fn send(&self, comm: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<()> {
        p2p::send(self, comm, buf, dest, tag)
    }
    fn recv(&self, comm: Comm, buf: BufMut, source: Peer, tag: Option<i32>) -> Result<Status> {
        p2p::recv(self, comm, buf, source, tag)
    }
    fn sendrecv(&self, sendbuf: Input, recvbuf: BufMut, envelope: Envelope) -> Result<Status> {
        self.refuses_to_start("MPI_Sendrecv")?;
        p2p::sendrecv(self, sendbuf, recvbuf, envelope)
    }
    unsafe fn isend(&self, comm: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<Request> {
        // SAFETY: forwarded from the caller.
        unsafe { p2p::isend(self, comm, buf, dest, tag) }
    }
    unsafe fn irecv(
        &self,
        comm: Comm,
        buf: BufMut,
        source: Peer,
        tag: Option<i32>,
    ) -> Result<Request> {
        // SAFETY: forwarded from the caller.
        unsafe { p2p::irecv(self, comm, buf, source, tag) }
    }
    unsafe fn start(&self, ops: &mut dyn FnMut(&dyn Backend) -> Result<()>) -> Result<Started> {
        let mode = starting::Mode::begin(self);
        ops(self)?;
        Ok(mode.finish())
    }
    fn test(&self, request: &mut Request) -> Result<Progress> {
        requests::test(self, request)
    }
    fn wait(&self, request: &mut Request) -> Result<Progress> {
        requests::wait(self, request)
    }
    fn abandon(&self, request: Request) -> Result<()> {
        requests::abandon(self, request)
    }
}
