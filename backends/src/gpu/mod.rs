//! GPU buffers over MPI: the memory operations a GPU offers (`GpuMemory`), the pool
//! of pinned host buffers staging reuses, and the two backend decorators that take GPU
//! buffers: `Staged` (through host copies) and `Direct` (GPU pointers to a CUDA-aware
//! MPI, staging what MPI cannot take that way). `Stats` counts which way each op went.
//! `unusable` stands in for a GPU a rank could not prepare, so that the rank still
//! makes the op's MPI calls.

/// The non-blocking ops of a GPU decorator: a started request is only a host handle
/// (test, wait and abandon go to the host backend), but starting one on GPU memory is
/// refused: the buffer would need staging that lives until the wait, not built yet.
macro_rules! host_requests_only {
    () => {
        unsafe fn isend(&self, _: Comm, _: Buf, _: Peer, _: i32) -> Result<Request> {
            Err(super::gpu_requests_refused("isend"))
        }
        unsafe fn irecv(&self, _: Comm, _: BufMut, _: Peer, _: Option<i32>) -> Result<Request> {
            Err(super::gpu_requests_refused("irecv"))
        }
        fn test(&self, request: &mut Request) -> Result<Progress> {
            self.host_backend().test(request)
        }
        fn wait(&self, request: &mut Request) -> Result<Progress> {
            self.host_backend().wait(request)
        }
        fn abandon(&self, request: Request) -> Result<()> {
            self.host_backend().abandon(request)
        }
    };
}

mod call;
pub mod cuda;
pub mod cuda_info;
mod direct;
pub mod driver;
pub mod fake;
mod pool;
mod staged;
mod stats;
#[cfg(test)]
mod test_mpi;
#[cfg(test)]
mod test_ranks;
pub mod unusable;

pub use direct::{Direct, Placement};
pub use pool::{PinnedBuffer, PinnedPool};
pub use staged::Staged;
pub use stats::Stats;

use jaxmpi_core::{BufMut, Error, Result};

fn gpu_requests_refused(op: &'static str) -> Error {
    Error::unsupported(
        op,
        "non-blocking transfers of GPU arrays are not supported yet: use jaxmpi.sendrecv, \
         or move the array to the host (jax.device_put(x, jax.devices(\"cpu\")[0]))",
    )
}

/// A point in a stream's work queue: waiting on it waits for everything enqueued before.
#[derive(Clone, Copy, Debug)]
pub struct Marker(pub usize);

/// One GPU stream's memory operations. "Async" operations are queued on the stream
/// (after the work XLA queued there) and may complete any time before a `wait`/`synchronize`
/// that covers them. Addresses are raw: GPU addresses for `gpu`, host for `host`.
pub trait GpuMemory: Send + Sync {
    fn copy_to_host_async(&self, host: *mut u8, gpu: *const u8, len: usize) -> Result<()>;
    fn copy_to_gpu_async(&self, gpu: *mut u8, host: *const u8, len: usize) -> Result<()>;
    fn zero_async(&self, gpu: *mut u8, len: usize) -> Result<()>;
    /// Marks the current end of the queue.
    fn mark(&self) -> Result<Marker>;
    /// Blocks until the work before `marker` is done.
    fn wait(&self, marker: Marker) -> Result<()>;
    /// Blocks until everything queued so far is done.
    fn synchronize(&self) -> Result<()>;
    /// Page-locked host memory: the only kind the GPU copies at full speed, asynchronously.
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer>;
    /// Whether legacy CUDA IPC (`cuIpcGetMemHandle`), which CUDA-aware MPIs use between
    /// ranks of one node, can share the allocation holding `gpu`.
    fn shareable_by_ipc(&self, gpu: *const u8) -> Result<bool>;
}

/// Zeroes GPU memory an op body fills itself, queued on the stream so that XLA's later
/// work sees it (both decorators' `fill_zeros`).
fn zero_on_stream(gpu: &dyn GpuMemory, dst: BufMut) -> Result<()> {
    if dst.len_bytes() > 0 {
        gpu.zero_async(dst.ptr(), dst.len_bytes())?;
    }
    Ok(())
}
