//! Test doubles for staging at any rank: a library that says which rank of how many this
//! is (all staging asks of it), and that it is not CUDA-aware (what the GPU runtime asks),
//! over a host backend that records what it is asked for.

use std::sync::Mutex;

use jaxmpi_core::{
    Backend, Broadcast, Buf, BufMut, Comm, Dtype, Envelope, Input, Library, LibraryInfo,
    NativeStatus, Partition, PartitionMut, Peer, Progress, ReduceOp, Request, Result, Status,
    ThreadLevel,
};

/// Rank `rank` of `size` on every communicator, with `backend` as its host ops.
pub struct Ranked<B> {
    pub rank: i32,
    pub size: i32,
    pub backend: B,
}

impl<B: Backend> Library for Ranked<B> {
    fn comm_rank(&self, _: Comm) -> Result<i32> {
        Ok(self.rank)
    }
    fn comm_size(&self, _: Comm) -> Result<i32> {
        Ok(self.size)
    }
    fn world(&self) -> Comm {
        Comm(0)
    }
    fn backend(&self) -> &dyn Backend {
        &self.backend
    }

    fn info(&self) -> &LibraryInfo {
        unreachable!("staging asks only for ranks")
    }
    fn thread_level(&self) -> ThreadLevel {
        unreachable!("staging asks only for ranks")
    }
    fn initialized_here(&self) -> bool {
        unreachable!("staging asks only for ranks")
    }
    fn finalize(&self) -> Result<()> {
        unreachable!("staging asks only for ranks")
    }
    fn finalized(&self) -> bool {
        unreachable!("staging asks only for ranks")
    }
    fn cuda_aware(&self) -> bool {
        false
    }
    fn cuda_aware_reason(&self) -> &str {
        unreachable!("staging asks only for ranks")
    }
    fn cuda_aware_checks_buffers(&self) -> bool {
        false
    }
    fn reduces_on_host(&self, _: Dtype, _: ReduceOp) -> bool {
        unreachable!("staging asks only for ranks")
    }
    fn reduce_in_place_reads_host(&self, _: i32) -> bool {
        unreachable!("staging asks only for ranks")
    }
    fn abort(&self, _: i32) -> ! {
        unreachable!("staging asks only for ranks")
    }
    fn return_errors_on(&self, _: Comm) -> Result<Option<usize>> {
        unreachable!("staging asks only for ranks")
    }
    fn restore_errhandler(&self, _: Comm, _: usize) {
        unreachable!("staging asks only for ranks")
    }
    fn check_comm(&self, _: Comm) -> Result<()> {
        unreachable!("staging asks only for ranks")
    }
    fn comm_dup(&self, _: Comm) -> Result<Comm> {
        unreachable!("staging asks only for ranks")
    }
    fn comm_split(&self, _: Comm, _: Option<i32>, _: i32) -> Result<Option<Comm>> {
        unreachable!("staging asks only for ranks")
    }
    fn comm_free(&self, _: Comm) -> Result<()> {
        unreachable!("staging asks only for ranks")
    }
    fn comm_create_group(&self, _: &[i32], _: i32) -> Result<Comm> {
        unreachable!("staging asks only for ranks")
    }
    fn node_local_rank(&self, _: Comm) -> Result<(i32, i32)> {
        unreachable!("staging asks only for ranks")
    }
}

/// A host backend that records the calls it is asked for, (op, elements), and does
/// nothing else.
#[derive(Default)]
pub struct Recording {
    calls: Mutex<Vec<(&'static str, usize)>>,
    tables: Mutex<Vec<usize>>,
}

impl Recording {
    fn record(&self, op: &'static str, count: usize) -> Result<()> {
        self.calls.lock().unwrap().push((op, count));
        Ok(())
    }
    fn received(&self, op: &'static str, count: usize) -> Result<Status> {
        self.record(op, count)?;
        Ok(Status {
            source: Peer::Rank(0),
            tag: Some(0),
            error: 0,
            count,
            native: NativeStatus {
                bytes: [0; 32],
                len: 0,
            },
        })
    }
    pub fn calls(&self) -> Vec<(&'static str, usize)> {
        self.calls.lock().unwrap().clone()
    }
    /// The send elements each scatter and scatterv was given: the root's table, or none.
    pub fn tables(&self) -> Vec<usize> {
        self.tables.lock().unwrap().clone()
    }
}

impl Backend for Recording {
    fn barrier(&self, _: Comm) -> Result<()> {
        self.record("barrier", 0)
    }
    fn allreduce(&self, _: Comm, _: Input, recv: BufMut, _: ReduceOp) -> Result<()> {
        self.record("allreduce", recv.count())
    }
    fn reduce(&self, _: Comm, _: Input, recv: BufMut, _: ReduceOp, _: i32) -> Result<()> {
        self.record("reduce", recv.count())
    }
    fn scan(&self, _: Comm, _: Input, recv: BufMut, _: ReduceOp) -> Result<()> {
        self.record("scan", recv.count())
    }
    fn exscan(&self, _: Comm, _: Input, recv: BufMut, _: ReduceOp) -> Result<()> {
        self.record("exscan", recv.count())
    }
    fn reduce_scatter(&self, _: Comm, send: Buf, _: BufMut, _: ReduceOp) -> Result<()> {
        self.record("reduce_scatter", send.count())
    }
    fn bcast(&self, _: Comm, buf: Broadcast, _: i32) -> Result<()> {
        self.record("bcast", buf.count())
    }
    fn gather(&self, _: Comm, send: Buf, _: BufMut, _: i32) -> Result<bool> {
        self.record("gather", send.count()).map(|()| false)
    }
    fn allgather(&self, _: Comm, send: Buf, _: BufMut) -> Result<()> {
        self.record("allgather", send.count())
    }
    fn scatter(&self, _: Comm, send: Buf, recv: BufMut, _: i32) -> Result<()> {
        self.tables.lock().unwrap().push(send.count());
        self.record("scatter", recv.count())
    }
    fn alltoall(&self, _: Comm, send: Buf, _: BufMut) -> Result<()> {
        self.record("alltoall", send.count())
    }
    fn gatherv(&self, _: Comm, send: Buf, _: PartitionMut, _: i32) -> Result<bool> {
        self.record("gatherv", send.count()).map(|()| false)
    }
    fn allgatherv(&self, _: Comm, send: Buf, _: PartitionMut) -> Result<()> {
        self.record("allgatherv", send.count())
    }
    fn scatterv(&self, _: Comm, send: Partition, recv: BufMut, _: i32) -> Result<()> {
        self.tables.lock().unwrap().push(send.buf.count());
        self.record("scatterv", recv.count())
    }
    fn alltoallv(&self, _: Comm, send: Partition, _: PartitionMut) -> Result<()> {
        self.record("alltoallv", send.buf.count())
    }
    fn send(&self, _: Comm, buf: Buf, _: Peer, _: i32) -> Result<()> {
        self.record("send", buf.count())
    }
    fn recv(&self, _: Comm, buf: BufMut, _: Peer, _: Option<i32>) -> Result<Status> {
        self.received("recv", buf.count())
    }
    fn sendrecv(&self, _: Input, recvbuf: BufMut, _: Envelope) -> Result<Status> {
        self.received("sendrecv", recvbuf.count())
    }
    unsafe fn isend(&self, _: Comm, _: Buf, _: Peer, _: i32) -> Result<Request> {
        unreachable!("staging starts nothing")
    }
    unsafe fn irecv(&self, _: Comm, _: BufMut, _: Peer, _: Option<i32>) -> Result<Request> {
        unreachable!("staging starts nothing")
    }
    fn test(&self, _: &mut Request) -> Result<Progress> {
        unreachable!("staging starts nothing")
    }
    fn wait(&self, _: &mut Request) -> Result<Progress> {
        unreachable!("staging starts nothing")
    }
    fn abandon(&self, _: Request) -> Result<()> {
        unreachable!("staging starts nothing")
    }
}
