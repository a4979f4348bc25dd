//! A GPU for tests (the unit tests, and the probe's runs under real MPI): "GPU"
//! memory is host memory and every async operation is deferred until a
//! `wait`/`synchronize` covers it, so a missing synchronization shows up as stale data
//! instead of passing by luck. Failures can be injected, to test what a failing GPU does
//! to the other ranks.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use jaxmpi_core::{Error, Result};

use super::{GpuMemory, Marker, PinnedBuffer};

enum Pending {
    Copy { dst: usize, src: usize, len: usize },
    Zero { dst: usize, len: usize },
}

pub struct FakeGpu {
    queue: Mutex<Vec<Pending>>,
    /// Operations run so far (the queue's done prefix).
    done: Mutex<usize>,
    pub pinned_allocations: Mutex<usize>,
    /// What `shareable_by_ipc` answers for every buffer.
    pub ipc_capable: AtomicBool,
    /// `shareable_by_ipc` fails (the driver cannot say).
    pub fail_ipc_query: AtomicBool,
    /// Copies queued after this many succeed fail, as on a GPU that hit an error.
    pub copies_before_failing: AtomicUsize,
    /// `synchronize` fails (the stream can no longer be waited for).
    pub fail_synchronize: AtomicBool,
    /// Whether `alloc_pinned` fails (no pinned memory left).
    pub fail_pinning: AtomicBool,
    copies: AtomicUsize,
    to_host: AtomicUsize,
}

impl Default for FakeGpu {
    fn default() -> Self {
        FakeGpu {
            queue: Mutex::default(),
            done: Mutex::default(),
            pinned_allocations: Mutex::default(),
            ipc_capable: AtomicBool::new(true),
            fail_ipc_query: AtomicBool::new(false),
            copies_before_failing: AtomicUsize::new(usize::MAX),
            fail_synchronize: AtomicBool::new(false),
            fail_pinning: AtomicBool::new(false),
            copies: AtomicUsize::new(0),
            to_host: AtomicUsize::new(0),
        }
    }
}

/// What fresh pinned memory holds, so data read before its copy arrived is recognizable.
pub const GARBAGE: u8 = 0xAA;

unsafe fn free_boxed(ptr: *mut u8, len: usize) {
    // SAFETY: made by `alloc_pinned` from a boxed slice of `len` bytes.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
}

impl FakeGpu {
    fn push(&self, op: Pending) -> Result<()> {
        if let Pending::Copy { .. } = op {
            let made = self.copies.fetch_add(1, Ordering::SeqCst);
            if made >= self.copies_before_failing.load(Ordering::SeqCst) {
                return Err(Error::library(
                    "cuda",
                    "cuMemcpyAsync failed: CUDA_ERROR_ILLEGAL_ADDRESS (injected by the test)",
                ));
            }
        }
        self.queue.lock().unwrap().push(op);
        Ok(())
    }

    fn run_until(&self, end: usize) {
        let queue = self.queue.lock().unwrap();
        let mut done = self.done.lock().unwrap();
        while *done < end.min(queue.len()) {
            // SAFETY: tests pass live, distinct buffers of at least `len` bytes.
            unsafe {
                match queue[*done] {
                    Pending::Copy { dst, src, len } => {
                        std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len)
                    }
                    Pending::Zero { dst, len } => std::ptr::write_bytes(dst as *mut u8, 0, len),
                }
            }
            *done += 1;
        }
    }

    /// Copies asked for so far, failed ones included.
    pub fn copies_queued(&self) -> usize {
        self.copies.load(Ordering::SeqCst)
    }

    /// Bytes asked to be copied GPU→host so far, failed copies included.
    pub fn bytes_to_host(&self) -> usize {
        self.to_host.load(Ordering::SeqCst)
    }

    /// Operations queued and not yet run.
    pub fn pending(&self) -> usize {
        self.queue.lock().unwrap().len() - *self.done.lock().unwrap()
    }
}

impl GpuMemory for FakeGpu {
    fn copy_to_host_async(&self, host: *mut u8, gpu: *const u8, len: usize) -> Result<()> {
        self.to_host.fetch_add(len, Ordering::SeqCst);
        self.push(Pending::Copy {
            dst: host as usize,
            src: gpu as usize,
            len,
        })
    }
    fn copy_to_gpu_async(&self, gpu: *mut u8, host: *const u8, len: usize) -> Result<()> {
        self.push(Pending::Copy {
            dst: gpu as usize,
            src: host as usize,
            len,
        })
    }
    fn zero_async(&self, gpu: *mut u8, len: usize) -> Result<()> {
        self.push(Pending::Zero {
            dst: gpu as usize,
            len,
        })
    }
    fn mark(&self) -> Result<Marker> {
        Ok(Marker(self.queue.lock().unwrap().len()))
    }
    fn wait(&self, marker: Marker) -> Result<()> {
        self.run_until(marker.0);
        Ok(())
    }
    fn synchronize(&self) -> Result<()> {
        if self.fail_synchronize.load(Ordering::SeqCst) {
            return Err(Error::library(
                "cuda",
                "cuStreamSynchronize failed: CUDA_ERROR_LAUNCH_FAILED (injected by the test)",
            ));
        }
        self.run_until(usize::MAX);
        Ok(())
    }
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer> {
        if self.fail_pinning.load(Ordering::SeqCst) {
            return Err(Error::library(
                "cuda",
                "cuMemHostAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (injected by the test)",
            ));
        }
        *self.pinned_allocations.lock().unwrap() += 1;
        let memory = Box::into_raw(vec![GARBAGE; len].into_boxed_slice()) as *mut u8;
        // SAFETY: a boxed slice of `len` bytes, freed once by `free_boxed`.
        Ok(unsafe { PinnedBuffer::from_raw(memory, len, free_boxed) })
    }
    fn shareable_by_ipc(&self, _gpu: *const u8) -> Result<bool> {
        if self.fail_ipc_query.load(Ordering::SeqCst) {
            return Err(Error::library(
                "cuda",
                "cuPointerGetAttribute failed: CUDA_ERROR_INVALID_VALUE (injected by the test)",
            ));
        }
        Ok(self.ipc_capable.load(Ordering::SeqCst))
    }
}
