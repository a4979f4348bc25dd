//! A process of a simulated cluster, for the planning benchmark (`planning_bench.rs`): a
//! `Library` and `Backend` whose MPI calls are counted and move nothing, so that the
//! device-rank layer's own work per call (its plans, packing, lists of messages) can be
//! measured at 16 k ranks on one machine. Nothing else here is simulated: the collectives
//! run their real code on real buffers of this process's devices.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{
    Backend, Broadcast, Buf, BufMut, Comm, Dtype, Envelope, Error, Family, Input, Library,
    LibraryInfo, Partition, PartitionMut, Peer, Progress, ReduceOp, Request, Result, Status,
    ThreadLevel,
};

/// This process of the simulated cluster: how many MPI calls the layer made through it.
pub struct Simulated {
    info: LibraryInfo,
    calls: AtomicUsize,
}

impl Simulated {
    pub fn new() -> Simulated {
        Simulated {
            info: LibraryInfo {
                family: Family::Mpich,
                path: PathBuf::from("simulated"),
                version_string: "a simulated cluster: MPI calls counted, nothing moved".into(),
                standard_version: (4, 1),
                chosen_by: "planning_bench".into(),
                any_source: -2,
                proc_null: -1,
                any_tag: -1,
                interposed: None,
            },
            calls: AtomicUsize::new(0),
        }
    }

    /// MPI calls made so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }

    fn call(&self) -> Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn call_returning<T>(&self, value: T) -> Result<T> {
        self.call().map(|()| value)
    }
}

/// What the layer must never ask of a simulated process (nothing it does per call).
fn not_simulated(what: &'static str) -> Error {
    Error::unsupported(what, "not part of the simulated cluster")
}

impl Library for Simulated {
    fn info(&self) -> &LibraryInfo {
        &self.info
    }
    fn thread_level(&self) -> ThreadLevel {
        ThreadLevel::Multiple
    }
    fn initialized_here(&self) -> bool {
        false
    }
    fn finalize(&self) -> Result<()> {
        Ok(())
    }
    fn finalized(&self) -> bool {
        false
    }
    fn cuda_aware(&self) -> bool {
        false
    }
    fn cuda_aware_reason(&self) -> &str {
        "simulated"
    }
    fn cuda_aware_checks_buffers(&self) -> bool {
        false
    }
    fn reduces_on_host(&self, _: Dtype, _: ReduceOp) -> bool {
        false
    }
    fn reduce_in_place_reads_host(&self, _: i32) -> bool {
        false
    }
    fn abort(&self, code: i32) -> ! {
        panic!("the simulated cluster aborted with code {code}")
    }
    fn return_errors_on(&self, _: Comm) -> Result<Option<usize>> {
        Ok(None)
    }
    fn restore_errhandler(&self, _: Comm, _: usize) {}
    fn world(&self) -> Comm {
        Comm(0)
    }
    fn check_comm(&self, _: Comm) -> Result<()> {
        Ok(())
    }
    fn comm_rank(&self, _: Comm) -> Result<i32> {
        Ok(0)
    }
    fn comm_size(&self, _: Comm) -> Result<i32> {
        Err(not_simulated("comm_size"))
    }
    fn comm_dup(&self, _: Comm) -> Result<Comm> {
        Err(not_simulated("comm_dup"))
    }
    fn comm_split(&self, _: Comm, _: Option<i32>, _: i32) -> Result<Option<Comm>> {
        Err(not_simulated("comm_split"))
    }
    fn comm_free(&self, _: Comm) -> Result<()> {
        Err(not_simulated("comm_free"))
    }
    fn comm_create_group(&self, _: &[i32], _: i32) -> Result<Comm> {
        Err(not_simulated("comm_create_group"))
    }
    fn node_local_rank(&self, _: Comm) -> Result<(i32, i32)> {
        Err(not_simulated("node_local_rank"))
    }
    fn backend(&self) -> &dyn Backend {
        self
    }
}

impl Backend for Simulated {
    fn reduce_local(&self, _: Buf, _: BufMut, _: ReduceOp) -> Result<()> {
        self.call()
    }
    fn barrier(&self, _: Comm) -> Result<()> {
        self.call()
    }
    fn allreduce(&self, _: Comm, _: Input, _: BufMut, _: ReduceOp) -> Result<()> {
        self.call()
    }
    fn reduce(&self, _: Comm, _: Input, _: BufMut, _: ReduceOp, _: i32) -> Result<()> {
        self.call()
    }
    fn scan(&self, _: Comm, _: Input, _: BufMut, _: ReduceOp) -> Result<()> {
        self.call()
    }
    fn exscan(&self, _: Comm, _: Input, _: BufMut, _: ReduceOp) -> Result<()> {
        self.call()
    }
    fn reduce_scatter(&self, _: Comm, _: Buf, _: BufMut, _: ReduceOp) -> Result<()> {
        self.call()
    }
    fn bcast(&self, _: Comm, _: Broadcast, _: i32) -> Result<()> {
        self.call()
    }
    fn gather(&self, _: Comm, _: Buf, _: BufMut, root: i32) -> Result<bool> {
        self.call_returning(root == 0)
    }
    fn allgather(&self, _: Comm, _: Buf, _: BufMut) -> Result<()> {
        self.call()
    }
    fn scatter(&self, _: Comm, _: Buf, _: BufMut, _: i32) -> Result<()> {
        self.call()
    }
    fn alltoall(&self, _: Comm, _: Buf, _: BufMut) -> Result<()> {
        self.call()
    }
    fn gatherv(&self, _: Comm, _: Buf, _: PartitionMut, root: i32) -> Result<bool> {
        self.call_returning(root == 0)
    }
    fn allgatherv(&self, _: Comm, _: Buf, _: PartitionMut) -> Result<()> {
        self.call()
    }
    fn scatterv(&self, _: Comm, _: Partition, _: BufMut, _: i32) -> Result<()> {
        self.call()
    }
    fn alltoallv(&self, _: Comm, _: Partition, _: PartitionMut) -> Result<()> {
        self.call()
    }
    fn send(&self, _: Comm, _: Buf, _: Peer, _: i32) -> Result<()> {
        self.call()
    }
    fn recv(&self, _: Comm, _: BufMut, _: Peer, _: Option<i32>) -> Result<Status> {
        self.call_returning(Status::not_yet())
    }
    fn sendrecv(&self, _: Input, _: BufMut, _: Envelope) -> Result<Status> {
        self.call_returning(Status::not_yet())
    }
    unsafe fn isend(&self, _: Comm, _: Buf, _: Peer, _: i32) -> Result<Request> {
        self.call_returning(Request {
            raw: 1,
            receives: None,
        })
    }
    unsafe fn irecv(&self, _: Comm, buf: BufMut, _: Peer, _: Option<i32>) -> Result<Request> {
        self.call_returning(Request {
            raw: 1,
            receives: Some(buf.dtype()),
        })
    }
    fn test(&self, _: &mut Request) -> Result<Progress> {
        self.call_returning(Progress::Sent)
    }
    fn wait(&self, _: &mut Request) -> Result<Progress> {
        self.call_returning(Progress::Sent)
    }
    fn abandon(&self, _: Request) -> Result<()> {
        self.call()
    }
}
