//! CUDA through the driver API, loaded at run time by cudarc (dynamic loading: the built
//! module links no CUDA library). Nothing here runs until a GPU handler does, so a machine
//! without CUDA never loads libcuda.
//!
//! `CudaRuntime` is the device runtime core calls for GPU ops: it binds XLA's stream and
//! runs the op on `Direct` when the MPI is CUDA-aware, else on `Staged`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys::{self, CUresult};
use jaxmpi_core::device::{install_device_runtime, DeviceRuntime, Stream};
use jaxmpi_core::{Backend, Error, Library, Result};

use super::{DeviceMemory, Direct, Marker, PinnedBuffer, PinnedPool, Staged};

const STEP: &str = "cuda";

fn check(what: &str, rc: CUresult) -> Result<()> {
    if rc == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::library(STEP, format!("{what} failed: {rc:?}")))
}

/// Loads libcuda and initializes the driver, once per process.
pub fn load_driver() -> Result<()> {
    static LOADED: OnceLock<Result<()>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: tries to dlopen libcuda under its usual names; no CUDA call yet.
            if !unsafe { sys::is_culib_present() } {
                return Err(Error::library(
                    STEP,
                    "arrays live on a GPU but the CUDA driver library (libcuda.so.1) cannot be \
                     loaded: install the NVIDIA driver or add its directory to LD_LIBRARY_PATH, \
                     or run on CPU with JAX_PLATFORMS=cpu",
                ));
            }
            // SAFETY: the documented first call of the driver API.
            check("cuInit", unsafe { sys::cuInit(0) })
        })
        .clone()
}

/// GPUs the driver sees (after CUDA_VISIBLE_DEVICES).
pub fn device_count() -> Result<i32> {
    load_driver()?;
    let mut count = 0;
    // SAFETY: the driver is initialized; writes one int.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    Ok(count)
}

/// -1: no check; else the device ordinal this rank's arrays must be on.
static RANK_DEVICE: AtomicI32 = AtomicI32::new(-1);

/// Records the GPU this rank uses; GPU ops on arrays elsewhere are refused.
pub fn set_rank_device(ordinal: Option<i32>) {
    RANK_DEVICE.store(ordinal.unwrap_or(-1), Ordering::SeqCst);
}

/// XLA's context made current on this thread for one call; the previous one comes back.
struct CurrentContext;

impl CurrentContext {
    fn of(stream: sys::CUstream) -> Result<(CurrentContext, i32)> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        let mut device = 0;
        // SAFETY: `stream` is the live stream XLA gave this call; each call writes one value.
        unsafe {
            check("cuStreamGetCtx", sys::cuStreamGetCtx(stream, &mut ctx))?;
            check("cuCtxPushCurrent", sys::cuCtxPushCurrent_v2(ctx))?;
            let guard = CurrentContext;
            check("cuCtxGetDevice", sys::cuCtxGetDevice(&mut device))?;
            Ok((guard, device))
        }
    }
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context `of` pushed on this thread.
        unsafe { sys::cuCtxPopCurrent_v2(&mut ctx) };
    }
}

/// XLA's stream as a `DeviceMemory`. Markers are events recorded on it.
struct CudaStream {
    stream: sys::CUstream,
    events: Mutex<Vec<sys::CUevent>>,
}

// SAFETY: CUDA streams and events may be used from any thread; the event list is locked.
unsafe impl Send for CudaStream {}
// SAFETY: as above.
unsafe impl Sync for CudaStream {}

unsafe fn free_pinned(ptr: *mut u8, _len: usize) {
    // SAFETY: memory from cuMemHostAlloc, freed once.
    unsafe { sys::cuMemFreeHost(ptr.cast()) };
}

fn device_ptr(ptr: *const u8) -> sys::CUdeviceptr {
    ptr as usize as sys::CUdeviceptr
}

impl DeviceMemory for CudaStream {
    fn copy_to_host_async(&self, host: *mut u8, device: *const u8, len: usize) -> Result<()> {
        // SAFETY: `host` is pinned memory of `len` bytes, `device` a live device buffer.
        let rc =
            unsafe { sys::cuMemcpyDtoHAsync_v2(host.cast(), device_ptr(device), len, self.stream) };
        check("cuMemcpyDtoHAsync", rc)
    }
    fn copy_to_device_async(&self, device: *mut u8, host: *const u8, len: usize) -> Result<()> {
        // SAFETY: as above, the other way.
        let rc =
            unsafe { sys::cuMemcpyHtoDAsync_v2(device_ptr(device), host.cast(), len, self.stream) };
        check("cuMemcpyHtoDAsync", rc)
    }
    fn zero_async(&self, device: *mut u8, len: usize) -> Result<()> {
        // SAFETY: a live device buffer of `len` bytes.
        let rc = unsafe { sys::cuMemsetD8Async(device_ptr(device), 0, len, self.stream) };
        check("cuMemsetD8Async", rc)
    }
    fn mark(&self) -> Result<Marker> {
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: creates an event (no timing: cheaper) and records it on the live stream.
        unsafe {
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            check("cuEventCreate", sys::cuEventCreate(&mut event, flags))?;
            let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
            events.push(event);
            check("cuEventRecord", sys::cuEventRecord(event, self.stream))?;
            Ok(Marker(events.len() - 1))
        }
    }
    fn wait(&self, marker: Marker) -> Result<()> {
        let event = self.events.lock().unwrap_or_else(|e| e.into_inner())[marker.0];
        // SAFETY: an event this stream recorded and has not destroyed.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(event)
        })
    }
    fn synchronize(&self) -> Result<()> {
        // SAFETY: the live stream of this call.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // PORTABLE: pinned for every context, so the pool serves any stream.
        const CU_MEMHOSTALLOC_PORTABLE: u32 = 1;
        // SAFETY: writes the address of `len` new bytes of pinned host memory.
        let rc = unsafe { sys::cuMemHostAlloc(&mut ptr, len, CU_MEMHOSTALLOC_PORTABLE) };
        check("cuMemHostAlloc (pinned staging buffer)", rc)?;
        // SAFETY: `len` bytes freed once by `free_pinned`.
        Ok(unsafe { PinnedBuffer::from_raw(ptr.cast(), len, free_pinned) })
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        for &event in self
            .events
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            // SAFETY: events created by `mark`; the stream was synchronized past them.
            unsafe { sys::cuEventDestroy_v2(event) };
        }
    }
}

#[derive(Default)]
struct CudaRuntime {
    pool: PinnedPool,
}

impl DeviceRuntime for CudaRuntime {
    fn run(
        &self,
        stream: Stream,
        library: &dyn Library,
        body: &mut dyn FnMut(&dyn Backend) -> Result<()>,
    ) -> Result<()> {
        load_driver()?;
        let stream = stream.0 as sys::CUstream;
        let (_current, device) = CurrentContext::of(stream)?;
        let expected = RANK_DEVICE.load(Ordering::SeqCst);
        if expected >= 0 && device != expected {
            return Err(Error::invalid_argument(
                STEP,
                format!(
                    "the arrays are on GPU {device}, but this rank uses GPU {expected}: put them \
                     on the rank's GPU (jax.device_put), or choose the rank's GPU with JAXMPI_GPU \
                     or CUDA_VISIBLE_DEVICES"
                ),
            ));
        }
        let device = CudaStream {
            stream,
            events: Mutex::new(Vec::new()),
        };
        let host = library.backend();
        let outcome = if library.cuda_aware() {
            body(&Direct::new(host, &device))
        } else {
            body(&Staged::new(host, &device, &self.pool))
        };
        // Events and pinned buffers of this call must not be in use after it returns.
        outcome.and(device.synchronize())
    }
}

/// The process's one CUDA runtime: its pool of pinned buffers lives as long as the process.
static RUNTIME: OnceLock<CudaRuntime> = OnceLock::new();

/// Installs the CUDA device runtime (cheap: loads nothing until a GPU op runs).
pub fn install() {
    install_device_runtime(RUNTIME.get_or_init(CudaRuntime::default));
}

/// Frees the pinned staging buffers (at exit).
pub fn release() {
    if let Some(runtime) = RUNTIME.get() {
        runtime.pool.release();
    }
}
