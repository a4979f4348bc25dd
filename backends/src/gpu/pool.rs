//! Pinned host buffers, reused across calls: pinning is slow (milliseconds), so staging
//! keeps what it allocated and grows a buffer only when a larger message comes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use jaxmpi_core::Result;

use super::GpuMemory;

/// Page-locked host memory of `len` bytes, freed by `free` when dropped.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
    free: unsafe fn(*mut u8, usize),
}

// SAFETY: plain host memory owned by this value alone.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// # Safety
    /// `ptr` must be host memory of `len` bytes owned by the caller, that `free(ptr, len)`
    /// releases exactly once.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize, free: unsafe fn(*mut u8, usize)) -> Self {
        PinnedBuffer { ptr, len, free }
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: `from_raw`'s contract.
        unsafe { (self.free)(self.ptr, self.len) }
    }
}

/// Free pinned buffers. A call takes what it needs and gives it back when done.
#[derive(Default)]
pub struct PinnedPool {
    free: Mutex<Vec<PinnedBuffer>>,
    allocations: AtomicU64,
}

impl PinnedPool {
    /// A buffer of at least `len` bytes: the smallest free one that fits, else the largest
    /// free one is replaced by a new one (growing by at least 2x so growth is rare).
    pub fn take(&self, gpu: &dyn GpuMemory, len: usize) -> Result<PinnedBuffer> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.sort_by_key(PinnedBuffer::len);
        if let Some(i) = free.iter().position(|b| b.len() >= len) {
            return Ok(free.remove(i));
        }
        let old = free.pop();
        drop(free); // pinning takes milliseconds: other calls may take and give meanwhile
        let grown = old.as_ref().map_or(len, |old| len.max(2 * old.len()));
        match gpu.alloc_pinned(grown.max(1)) {
            Ok(buffer) => {
                self.allocations.fetch_add(1, Ordering::Relaxed);
                Ok(buffer)
            }
            Err(err) => {
                // The old buffer stays for the sizes it fits.
                if let Some(old) = old {
                    self.give_back(old);
                }
                Err(err)
            }
        }
    }

    pub fn give_back(&self, buffer: PinnedBuffer) {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buffer);
    }

    /// Frees every pooled buffer (at exit, in the context that owns them).
    pub fn release(&self) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Total bytes held, for tests and `info`.
    pub fn held_bytes(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.iter().map(PinnedBuffer::len).sum()
    }

    /// Pinned allocations made so far: flat over repeated calls of the same sizes.
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }
}
