//! `Direct`: device pointers straight to a CUDA-aware MPI. MPI runs on the host thread and
//! knows nothing of XLA's stream, so the stream is synchronized first; the MPI call returns
//! once the device buffers are read or written.

use jaxmpi_core::{
    Backend, Broadcast, Buf, BufMut, Comm, Envelope, Error, Input, Partition, PartitionMut, Peer,
    Progress, ReduceOp, Request, Result, Status,
};

use super::DeviceMemory;

pub struct Direct<'a> {
    inner: &'a dyn Backend,
    device: &'a dyn DeviceMemory,
}

/// A failure with device pointers may mean the MPI is not CUDA-aware after all.
fn explain(err: Error) -> Error {
    if err.mpi_class().is_none() {
        return err;
    }
    err.context(
        "MPI failed on GPU buffers passed directly (CUDA-aware mode); if this MPI is not \
         CUDA-aware, set JAXMPI_CUDA_AWARE=0 to stage through host memory",
    )
}

impl<'a> Direct<'a> {
    pub fn new(inner: &'a dyn Backend, device: &'a dyn DeviceMemory) -> Self {
        Direct { inner, device }
    }

    /// Runs one MPI call on device memory once XLA's work on it is done.
    fn call<R>(&self, op: impl FnOnce(&dyn Backend) -> Result<R>) -> Result<R> {
        self.device.synchronize()?;
        op(self.inner).map_err(explain)
    }
}

impl Backend for Direct<'_> {
    fn fill_zeros(&self, dst: BufMut) -> Result<()> {
        super::zero_on_stream(self.device, dst)
    }
    fn barrier(&self, comm: Comm) -> Result<()> {
        self.inner.barrier(comm)
    }
    fn allreduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.call(|b| b.allreduce(comm, send, recv, op))
    }
    fn reduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp, root: i32) -> Result<()> {
        self.call(|b| b.reduce(comm, send, recv, op, root))
    }
    fn scan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.call(|b| b.scan(comm, send, recv, op))
    }
    fn exscan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.call(|b| b.exscan(comm, send, recv, op))
    }
    fn reduce_scatter(&self, comm: Comm, send: Buf, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.call(|b| b.reduce_scatter(comm, send, recv, op))
    }
    fn bcast(&self, comm: Comm, buf: Broadcast, root: i32) -> Result<()> {
        self.call(|b| b.bcast(comm, buf, root))
    }
    fn gather(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        self.call(|b| b.gather(comm, send, recv, root))
    }
    fn allgather(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        self.call(|b| b.allgather(comm, send, recv))
    }
    fn scatter(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        self.call(|b| b.scatter(comm, send, recv, root))
    }
    fn alltoall(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        self.call(|b| b.alltoall(comm, send, recv))
    }
    fn gatherv(&self, comm: Comm, send: Buf, recv: PartitionMut, root: i32) -> Result<()> {
        self.call(|b| b.gatherv(comm, send, recv, root))
    }
    fn allgatherv(&self, comm: Comm, send: Buf, recv: PartitionMut) -> Result<()> {
        self.call(|b| b.allgatherv(comm, send, recv))
    }
    fn scatterv(&self, comm: Comm, send: Partition, recv: BufMut, root: i32) -> Result<()> {
        self.call(|b| b.scatterv(comm, send, recv, root))
    }
    fn alltoallv(&self, comm: Comm, send: Partition, recv: PartitionMut) -> Result<()> {
        self.call(|b| b.alltoallv(comm, send, recv))
    }
    fn send(&self, comm: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<()> {
        self.call(|b| b.send(comm, buf, dest, tag))
    }
    fn recv(&self, comm: Comm, buf: BufMut, source: Peer, tag: Option<i32>) -> Result<Status> {
        self.call(|b| b.recv(comm, buf, source, tag))
    }
    fn sendrecv(&self, sendbuf: Input, recvbuf: BufMut, envelope: Envelope) -> Result<Status> {
        self.call(|b| b.sendrecv(sendbuf, recvbuf, envelope))
    }
    host_requests_only!();
}
