//! `Direct`: GPU pointers straight to a CUDA-aware MPI. MPI runs on the host thread and
//! knows nothing of XLA's stream, so the stream is synchronized first; the MPI call returns
//! once the GPU buffers are read or written.
//!
//! Some calls are staged all the same, because a CUDA-aware MPI taking GPU pointers
//! does not make host code able to read them: reductions that run jaxmpi's own functions
//! or a user's op on the host (float16, bfloat16, user ops, the unsigned MIN/MAX of some
//! MPICH versions), a library quirk's workaround that copies a buffer on the host, and an
//! in-place sendrecv (`MPI_Sendrecv_replace` packs the buffer into host memory it
//! allocates, in MPICH and its derivatives, Intel MPI among them: a host read of GPU
//! memory wherever that pack is not GPU-aware, and no MPI's query says whether it is).
//! Decided automatically (`Placement::IpcShareable`), buffers that legacy CUDA IPC cannot
//! share are staged too (`cuda_aware.rs` says why), and so are those whose sharing the
//! driver cannot say. Every rank cuts allreduce and bcast into the same MPI calls
//! whichever way it goes (`chunks`), so ranks may differ in this.
//!
//! Nothing here refuses a call before its MPI calls, which would leave the other ranks
//! waiting in theirs: where the stream cannot be synchronized, the op runs staged, which
//! makes every MPI call of it and returns the GPU's error at the end (`staged.rs`).

use jaxmpi_core::{
    Backend, Broadcast, Buf, BufMut, Comm, Dtype, Envelope, Error, Input, Library, Partition,
    PartitionMut, Peer, Progress, ReduceOp, Request, Result, Status,
};

use super::{GpuMemory, PinnedPool, Staged, Stats};

/// Which GPU buffers go to MPI as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every buffer (the user said the MPI takes them).
    Any,
    /// Buffers that legacy CUDA IPC can share; the others are staged.
    IpcShareable,
}

pub struct Direct<'a> {
    library: &'a dyn Library,
    gpu: &'a dyn GpuMemory,
    staged: Staged<'a>,
    stats: &'a Stats,
    placement: Placement,
}

/// A failure with GPU pointers may mean the MPI is not CUDA-aware after all.
fn explain(err: Error) -> Error {
    if err.mpi_class().is_none() {
        return err;
    }
    err.context(
        "MPI failed on GPU buffers passed directly (CUDA-aware mode); if this MPI is not \
         CUDA-aware, set JAXMPI_CUDA_AWARE=0 to stage through host memory",
    )
}

/// How one call goes.
enum Route {
    Direct,
    Staged,
}

impl<'a> Direct<'a> {
    pub fn new(
        library: &'a dyn Library,
        gpu: &'a dyn GpuMemory,
        pool: &'a PinnedPool,
        stats: &'a Stats,
        placement: Placement,
    ) -> Self {
        Direct {
            library,
            gpu,
            staged: Staged::new(library, gpu, pool, stats),
            stats,
            placement,
        }
    }

    /// Direct unless a buffer of the call (its address, `len` bytes) may not go to MPI.
    fn route(&self, buffers: &[(*const u8, usize)]) -> Route {
        if self.placement == Placement::IpcShareable {
            for &(ptr, len) in buffers {
                // A buffer the driver cannot say IPC can share is staged too (and counted
                // with those it says it cannot): staging takes any buffer, and failing
                // here, before the MPI call, would leave the other ranks waiting.
                if len > 0 && !self.gpu.shareable_by_ipc(ptr).unwrap_or(false) {
                    Stats::bump(&self.stats.staged_not_ipc);
                    return Route::Staged;
                }
            }
        }
        Route::Direct
    }

    /// Staged when host code would compute on the buffers, else as `route` says.
    fn route_reduction(&self, dtype: Dtype, op: ReduceOp, buffers: &[(*const u8, usize)]) -> Route {
        if self.library.reduces_on_host(dtype, op) {
            Stats::bump(&self.stats.staged_host_code);
            return Route::Staged;
        }
        self.route(buffers)
    }

    /// Runs `op` (one op, on the backend it is given) the way `route` says. Direct, XLA's
    /// work on the buffers must be done first; where the stream cannot be waited for, the
    /// op's staged form runs instead: it makes the same MPI calls and returns the GPU's
    /// error at the end.
    fn run<R>(&self, route: Route, op: impl FnOnce(&dyn Backend) -> Result<R>) -> Result<R> {
        if let Route::Direct = route {
            if self.gpu.synchronize().is_ok() {
                Stats::bump(&self.stats.direct);
                return op(self.library.backend()).map_err(explain);
            }
        }
        op(&self.staged)
    }
}

fn of(buf: &Buf) -> (*const u8, usize) {
    (buf.ptr(), buf.len_bytes())
}

fn of_mut(buf: &BufMut) -> (*const u8, usize) {
    (buf.ptr().cast_const(), buf.len_bytes())
}

fn of_input(input: &Input) -> (*const u8, usize) {
    match input {
        Input::Data(buf) => of(buf),
        Input::InPlace => (std::ptr::null(), 0),
    }
}

impl Backend for Direct<'_> {
    fn fill_zeros(&self, dst: BufMut) -> Result<()> {
        super::zero_on_stream(self.gpu, dst)
    }
    fn barrier(&self, comm: Comm) -> Result<()> {
        self.host_backend().barrier(comm)
    }
    fn allreduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let route = self.route_reduction(recv.dtype(), op, &[of_input(&send), of_mut(&recv)]);
        self.run(route, |b| b.allreduce(comm, send, recv, op))
    }
    fn reduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp, root: i32) -> Result<()> {
        let quirk = matches!(send, Input::InPlace) && self.library.reduce_in_place_reads_host(root);
        if quirk {
            Stats::bump(&self.stats.staged_host_code);
            return self.run(Route::Staged, |b| b.reduce(comm, send, recv, op, root));
        }
        let dtype = match &send {
            Input::Data(buf) => buf.dtype(),
            Input::InPlace => recv.dtype(),
        };
        let route = self.route_reduction(dtype, op, &[of_input(&send), of_mut(&recv)]);
        self.run(route, |b| b.reduce(comm, send, recv, op, root))
    }
    fn scan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let route = self.route_reduction(recv.dtype(), op, &[of_input(&send), of_mut(&recv)]);
        self.run(route, |b| b.scan(comm, send, recv, op))
    }
    fn exscan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let route = self.route_reduction(recv.dtype(), op, &[of_input(&send), of_mut(&recv)]);
        self.run(route, |b| b.exscan(comm, send, recv, op))
    }
    fn reduce_scatter(&self, comm: Comm, send: Buf, recv: BufMut, op: ReduceOp) -> Result<()> {
        let route = self.route_reduction(recv.dtype(), op, &[of(&send), of_mut(&recv)]);
        self.run(route, |b| b.reduce_scatter(comm, send, recv, op))
    }
    fn bcast(&self, comm: Comm, buf: Broadcast, root: i32) -> Result<()> {
        let at = match &buf {
            Broadcast::Root(b) => of(b),
            Broadcast::Receiver(b) | Broadcast::InPlace(b) => of_mut(b),
        };
        let route = self.route(&[at]);
        self.run(route, |b| b.bcast(comm, buf, root))
    }
    fn gather(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<bool> {
        let route = self.route(&[of(&send), of_mut(&recv)]);
        self.run(route, |b| b.gather(comm, send, recv, root))
    }
    fn allgather(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        let route = self.route(&[of(&send), of_mut(&recv)]);
        self.run(route, |b| b.allgather(comm, send, recv))
    }
    fn scatter(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        let route = self.route(&[of(&send), of_mut(&recv)]);
        self.run(route, |b| b.scatter(comm, send, recv, root))
    }
    fn alltoall(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        let route = self.route(&[of(&send), of_mut(&recv)]);
        self.run(route, |b| b.alltoall(comm, send, recv))
    }
    fn gatherv(&self, comm: Comm, send: Buf, recv: PartitionMut, root: i32) -> Result<bool> {
        let route = self.route(&[of(&send), of_mut(&recv.buf)]);
        self.run(route, |b| b.gatherv(comm, send, recv, root))
    }
    fn allgatherv(&self, comm: Comm, send: Buf, recv: PartitionMut) -> Result<()> {
        let route = self.route(&[of(&send), of_mut(&recv.buf)]);
        self.run(route, |b| b.allgatherv(comm, send, recv))
    }
    fn scatterv(&self, comm: Comm, send: Partition, recv: BufMut, root: i32) -> Result<()> {
        let route = self.route(&[of(&send.buf), of_mut(&recv)]);
        self.run(route, |b| b.scatterv(comm, send, recv, root))
    }
    fn alltoallv(&self, comm: Comm, send: Partition, recv: PartitionMut) -> Result<()> {
        let route = self.route(&[of(&send.buf), of_mut(&recv.buf)]);
        self.run(route, |b| b.alltoallv(comm, send, recv))
    }
    fn send(&self, comm: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<()> {
        let route = self.route(&[of(&buf)]);
        self.run(route, |b| b.send(comm, buf, dest, tag))
    }
    fn recv(&self, comm: Comm, buf: BufMut, source: Peer, tag: Option<i32>) -> Result<Status> {
        let route = self.route(&[of_mut(&buf)]);
        self.run(route, |b| b.recv(comm, buf, source, tag))
    }
    fn sendrecv(&self, sendbuf: Input, recvbuf: BufMut, envelope: Envelope) -> Result<Status> {
        let route = match sendbuf {
            // Staged, the copy through the host is jaxmpi's own, on pinned memory: what the
            // library would do at best anyway (see the module's note).
            Input::InPlace => {
                Stats::bump(&self.stats.staged_in_place);
                Route::Staged
            }
            _ => self.route(&[of_input(&sendbuf), of_mut(&recvbuf)]),
        };
        self.run(route, |b| b.sendrecv(sendbuf, recvbuf, envelope))
    }
    host_requests_only!();
}

impl Direct<'_> {
    fn host_backend(&self) -> &dyn Backend {
        self.library.backend()
    }
}

#[cfg(test)]
#[path = "direct_tests.rs"]
mod tests;
