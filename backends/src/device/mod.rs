//! Device buffers over MPI: the memory operations a device offers (`DeviceMemory`), the pool
//! of pinned host buffers staging reuses, and the two backend decorators that take device
//! buffers: `Staged` (through host copies) and `Direct` (device pointers to a CUDA-aware MPI).

/// The `Backend` methods both device decorators share: everything that touches no message
/// buffer goes to the host backend (`self.inner`); zeroing is queued on the stream
/// (`self.device`).
macro_rules! host_methods {
    () => {
        fn info(&self) -> &jaxmpi_core::LibraryInfo {
            self.inner.info()
        }
        fn thread_level(&self) -> jaxmpi_core::ThreadLevel {
            self.inner.thread_level()
        }
        fn initialized_here(&self) -> bool {
            self.inner.initialized_here()
        }
        fn is_finalized(&self) -> bool {
            self.inner.is_finalized()
        }
        fn abort(&self, code: i32) -> ! {
            self.inner.abort(code)
        }
        fn return_errors_on(&self, comm: Comm) -> Result<Option<usize>> {
            self.inner.return_errors_on(comm)
        }
        fn restore_errhandler(&self, comm: Comm, handler: usize) {
            self.inner.restore_errhandler(comm, handler)
        }
        fn cuda_aware_reason(&self) -> &str {
            self.inner.cuda_aware_reason()
        }
        fn fill_zeros(&self, dst: BufMut) -> Result<()> {
            if dst.len_bytes() > 0 {
                self.device.zero_async(dst.ptr(), dst.len_bytes())?;
            }
            Ok(())
        }
        fn world(&self) -> Comm {
            self.inner.world()
        }
        fn check_comm(&self, comm: Comm) -> Result<()> {
            self.inner.check_comm(comm)
        }
        fn comm_rank(&self, comm: Comm) -> Result<i32> {
            self.inner.comm_rank(comm)
        }
        fn comm_size(&self, comm: Comm) -> Result<i32> {
            self.inner.comm_size(comm)
        }
        fn comm_dup(&self, comm: Comm) -> Result<Comm> {
            self.inner.comm_dup(comm)
        }
        fn comm_split(&self, comm: Comm, color: Option<i32>, key: i32) -> Result<Option<Comm>> {
            self.inner.comm_split(comm, color, key)
        }
        fn comm_free(&self, comm: Comm) -> Result<()> {
            self.inner.comm_free(comm)
        }
        fn node_local_rank(&self, comm: Comm) -> Result<(i32, i32)> {
            self.inner.node_local_rank(comm)
        }
        fn barrier(&self, comm: Comm) -> Result<()> {
            self.inner.barrier(comm)
        }
    };
}

mod direct;
#[cfg(test)]
mod fake;
mod pool;
mod staged;

pub use direct::Direct;
pub use pool::{PinnedBuffer, PinnedPool};
pub use staged::Staged;

use jaxmpi_core::Result;

/// A point in a stream's work queue: waiting on it waits for everything enqueued before.
#[derive(Clone, Copy, Debug)]
pub struct Marker(pub usize);

/// One device stream's memory operations. "Async" operations are queued on the stream
/// (after the work XLA queued there) and may complete any time before a `wait`/`synchronize`
/// that covers them. Addresses are raw: device addresses for `device`, host for `host`.
pub trait DeviceMemory: Send + Sync {
    fn copy_to_host_async(&self, host: *mut u8, device: *const u8, len: usize) -> Result<()>;
    fn copy_to_device_async(&self, device: *mut u8, host: *const u8, len: usize) -> Result<()>;
    fn zero_async(&self, device: *mut u8, len: usize) -> Result<()>;
    /// Marks the current end of the queue.
    fn mark(&self) -> Result<Marker>;
    /// Blocks until the work before `marker` is done.
    fn wait(&self, marker: Marker) -> Result<()>;
    /// Blocks until everything queued so far is done.
    fn synchronize(&self) -> Result<()>;
    /// Page-locked host memory: the only kind the device copies at full speed, asynchronously.
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer>;
}
