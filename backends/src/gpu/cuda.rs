//! CUDA through the driver API (`driver`, loaded at run time: the built module links no
//! CUDA library). Nothing here loads libcuda until a GPU handler runs or Python asks (which
//! it does only where CUDA is wanted), so a machine without CUDA never loads it.
//!
//! `CudaRuntime` is the GPU runtime core calls for GPU ops: it prepares this rank's part
//! (XLA's stream and its context made current, the arrays checked to be on the rank's GPU,
//! the context owning the pinned pool), then `call::run_on` waits for the stream and runs
//! the op on `Direct` when the MPI is CUDA-aware, else on `Staged`. A failed preparation is
//! this rank's alone: it goes to the call's start verdict where the call takes one, so
//! every rank learns it before anyone calls MPI; elsewhere the op still runs, on host
//! scratch memory (`unusable.rs`), so that no other rank waits for this one.
//!
//! Pinned staging memory belongs to the context current when it is allocated, and dies
//! with it. It is allocated in the GPU's primary context (the one XLA uses), which
//! jaxmpi retains for as long as it holds the memory: XLA releasing its own reference
//! (`jax.clear_backends()`) then frees nothing under the pool, and the pool's teardown
//! makes that context current to free it.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

use jaxmpi_core::gpu::{install_gpu_runtime, Agree, GpuRuntime, Stream};
use jaxmpi_core::{Backend, Error, Library, Result};

use super::call::run_on;
use super::driver::{
    self, attribute, CuContext, CuDevice, CuDevicePtr, CuEvent, CuStream, Driver,
    EVENT_DISABLE_TIMING, MEMHOSTALLOC_PORTABLE,
};
use super::{GpuMemory, Marker, PinnedBuffer, PinnedPool, Stats};

const STEP: &str = "cuda";

/// Loads libcuda and initializes the driver, once per process.
pub fn load_driver() -> Result<()> {
    driver::driver().map(|_| ())
}

/// -1: no check; else the GPU ordinal this rank's arrays must be on.
static RANK_GPU: AtomicI32 = AtomicI32::new(-1);

/// Records the GPU this rank uses; GPU ops on arrays elsewhere are refused.
pub fn set_rank_gpu(ordinal: Option<i32>) {
    RANK_GPU.store(ordinal.unwrap_or(-1), Ordering::SeqCst);
}

/// The primary context of one GPU, retained by jaxmpi: it owns the pinned pool.
#[derive(Clone, Copy)]
struct Owner {
    gpu: CuDevice,
    context: CuContext,
}

// SAFETY: a CUDA context handle may be used from any thread.
unsafe impl Send for Owner {}
// SAFETY: as above.
unsafe impl Sync for Owner {}

static OWNER: OnceLock<Owner> = OnceLock::new();

/// The primary context of `ordinal`, retained (once per process: later calls get the first
/// GPU's, which still serves, pinned memory being portable across contexts).
fn owner(d: &Driver, ordinal: i32) -> Result<Owner> {
    if let Some(owner) = OWNER.get() {
        return Ok(*owner);
    }
    let mut gpu = 0;
    let mut context: CuContext = std::ptr::null_mut();
    // SAFETY: out-pointers to one value each; the retained reference is kept in OWNER.
    unsafe {
        d.check("cuDeviceGet", (d.api.cuDeviceGet)(&mut gpu, ordinal))?;
        d.check(
            "cuDevicePrimaryCtxRetain",
            (d.api.cuDevicePrimaryCtxRetain)(&mut context, gpu),
        )?;
    }
    if OWNER.set(Owner { gpu, context }).is_err() {
        // Another thread retained one first: give this reference back.
        // SAFETY: releases the reference taken just above.
        unsafe { (d.api.cuDevicePrimaryCtxRelease_v2)(gpu) };
    }
    Ok(*OWNER.get().expect("set above"))
}

/// Makes GPU `ordinal` this thread's current GPU (its primary context, as
/// `cudaSetDevice` does), before MPI initializes: MPIs that set up CUDA in `MPI_Init` bind
/// to the current GPU, GPU 0 when none is.
pub fn use_gpu(ordinal: i32) -> Result<()> {
    let d = driver::driver()?;
    let owner = owner(d, ordinal)?;
    // SAFETY: a context retained by `owner`.
    d.check("cuCtxSetCurrent", unsafe {
        (d.api.cuCtxSetCurrent)(owner.context)
    })
}

/// A context made current on this thread for a while; the previous one comes back.
struct Pushed<'d>(&'d Driver);

impl<'d> Pushed<'d> {
    fn context(d: &'d Driver, context: CuContext) -> Result<Self> {
        // SAFETY: a live context (XLA's, or the one jaxmpi retained).
        d.check("cuCtxPushCurrent", unsafe {
            (d.api.cuCtxPushCurrent_v2)(context)
        })?;
        Ok(Pushed(d))
    }

    /// XLA's context, the one of `stream`, and its GPU.
    fn of_stream(d: &'d Driver, stream: CuStream) -> Result<(Self, i32)> {
        let mut context: CuContext = std::ptr::null_mut();
        // SAFETY: `stream` is the live stream XLA gave this call; writes one value.
        d.check("cuStreamGetCtx", unsafe {
            (d.api.cuStreamGetCtx)(stream, &mut context)
        })?;
        let pushed = Pushed::context(d, context)?;
        let mut gpu = 0;
        // SAFETY: a context is current; writes one int.
        d.check("cuCtxGetDevice", unsafe {
            (d.api.cuCtxGetDevice)(&mut gpu)
        })?;
        Ok((pushed, gpu))
    }
}

impl Drop for Pushed<'_> {
    fn drop(&mut self) {
        let mut context: CuContext = std::ptr::null_mut();
        // SAFETY: pops the context this value pushed on this thread.
        unsafe { (self.0.api.cuCtxPopCurrent_v2)(&mut context) };
    }
}

/// XLA's stream as a `GpuMemory`. Markers are events recorded on it.
struct CudaStream {
    driver: &'static Driver,
    stream: CuStream,
    owner: Owner,
    events: Mutex<Vec<CuEvent>>,
}

// SAFETY: CUDA streams and events may be used from any thread; the event list is locked.
unsafe impl Send for CudaStream {}
// SAFETY: as above.
unsafe impl Sync for CudaStream {}

/// Frees pinned memory in the context that owns it (the call may come at exit, on a thread
/// where no context is current).
unsafe fn free_pinned(ptr: *mut u8, _len: usize) {
    let (Ok(d), Some(owner)) = (driver::driver(), OWNER.get()) else {
        return;
    };
    if let Ok(_pushed) = Pushed::context(d, owner.context) {
        // SAFETY: memory from cuMemHostAlloc in this context, freed once.
        unsafe { (d.api.cuMemFreeHost)(ptr.cast()) };
    }
}

fn gpu_ptr(ptr: *const u8) -> CuDevicePtr {
    ptr as usize as CuDevicePtr
}

/// One attribute of the allocation holding `ptr`. Whatever the attribute's C type (an
/// int, a bool, a pointer or a size: the driver writes at most 8 bytes), it lands in the
/// low bytes of a zeroed u64 on these little-endian targets.
fn pointer_attribute(d: &Driver, ptr: *const u8, which: u32) -> Result<u64> {
    let mut value = [0u64; 2];
    // SAFETY: 16 writable bytes, more than any attribute asked for here takes.
    let rc =
        unsafe { (d.api.cuPointerGetAttribute)(value.as_mut_ptr().cast(), which, gpu_ptr(ptr)) };
    d.check("cuPointerGetAttribute", rc)?;
    Ok(value[0])
}

impl GpuMemory for CudaStream {
    fn copy_to_host_async(&self, host: *mut u8, gpu: *const u8, len: usize) -> Result<()> {
        let d = self.driver;
        // SAFETY: `host` is host memory of `len` bytes, `gpu` a live GPU buffer.
        let rc =
            unsafe { (d.api.cuMemcpyDtoHAsync_v2)(host.cast(), gpu_ptr(gpu), len, self.stream) };
        d.check("cuMemcpyDtoHAsync", rc)
    }
    fn copy_to_gpu_async(&self, gpu: *mut u8, host: *const u8, len: usize) -> Result<()> {
        let d = self.driver;
        // SAFETY: as above, the other way.
        let rc =
            unsafe { (d.api.cuMemcpyHtoDAsync_v2)(gpu_ptr(gpu), host.cast(), len, self.stream) };
        d.check("cuMemcpyHtoDAsync", rc)
    }
    fn zero_async(&self, gpu: *mut u8, len: usize) -> Result<()> {
        let d = self.driver;
        // SAFETY: a live GPU buffer of `len` bytes.
        let rc = unsafe { (d.api.cuMemsetD8Async)(gpu_ptr(gpu), 0, len, self.stream) };
        d.check("cuMemsetD8Async", rc)
    }
    fn mark(&self) -> Result<Marker> {
        let d = self.driver;
        let mut event: CuEvent = std::ptr::null_mut();
        // SAFETY: creates an event (no timing: cheaper) and records it on the live stream;
        // it is destroyed with this value.
        unsafe {
            d.check(
                "cuEventCreate",
                (d.api.cuEventCreate)(&mut event, EVENT_DISABLE_TIMING),
            )?;
            let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
            events.push(event);
            d.check("cuEventRecord", (d.api.cuEventRecord)(event, self.stream))?;
            Ok(Marker(events.len() - 1))
        }
    }
    fn wait(&self, marker: Marker) -> Result<()> {
        let d = self.driver;
        let event = self.events.lock().unwrap_or_else(|e| e.into_inner())[marker.0];
        // SAFETY: an event this stream recorded and has not destroyed.
        d.check("cuEventSynchronize", unsafe {
            (d.api.cuEventSynchronize)(event)
        })
    }
    fn synchronize(&self) -> Result<()> {
        let d = self.driver;
        // SAFETY: the live stream of this call.
        d.check("cuStreamSynchronize", unsafe {
            (d.api.cuStreamSynchronize)(self.stream)
        })
    }
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer> {
        let d = self.driver;
        let _owner = Pushed::context(d, self.owner.context)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes the address of `len` new bytes of pinned host memory.
        let rc = unsafe { (d.api.cuMemHostAlloc)(&mut ptr, len, MEMHOSTALLOC_PORTABLE) };
        d.check("cuMemHostAlloc (pinned staging buffer)", rc)?;
        // SAFETY: `len` bytes freed once by `free_pinned`, in the owner's context.
        Ok(unsafe { PinnedBuffer::from_raw(ptr.cast(), len, free_pinned) })
    }
    fn shareable_by_ipc(&self, gpu: *const u8) -> Result<bool> {
        pointer_attribute(self.driver, gpu, attribute::IS_LEGACY_CUDA_IPC_CAPABLE).map(|v| v != 0)
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        let events = self.events.get_mut().unwrap_or_else(|e| e.into_inner());
        for &event in events.iter() {
            // SAFETY: events created by `mark`; the stream was synchronized past them
            // (or failed, when the driver frees them with the context).
            unsafe { (self.driver.api.cuEventDestroy_v2)(event) };
        }
    }
}

#[derive(Default)]
struct CudaRuntime {
    pool: PinnedPool,
    stats: Stats,
}

/// This rank's part of a call, ready for the op's MPI calls. (Fields drop in order: the
/// stream's events while XLA's context is still current.)
struct Prepared {
    gpu: CudaStream,
    _current: Pushed<'static>,
}

/// Makes this rank's part of a call on `stream` ready: what can fail on one rank alone
/// before the op's MPI calls, but for the wait for XLA's work (`call::run_on`).
fn prepare(stream: Stream) -> Result<Prepared> {
    let d = driver::driver()?;
    let stream = stream.0 as CuStream;
    let (current, gpu) = Pushed::of_stream(d, stream)?;
    let expected = RANK_GPU.load(Ordering::SeqCst);
    if expected >= 0 && gpu != expected {
        return Err(Error::invalid_argument(
            STEP,
            format!(
                "the arrays are on GPU {gpu}, but this rank uses GPU {expected}: put them \
                 on the rank's GPU (jax.device_put), or choose the rank's GPU with JAXMPI_GPU \
                 or CUDA_VISIBLE_DEVICES"
            ),
        ));
    }
    let gpu = CudaStream {
        driver: d,
        stream,
        owner: owner(d, gpu)?,
        events: Mutex::new(Vec::new()),
    };
    Ok(Prepared {
        gpu,
        _current: current,
    })
}

impl GpuRuntime for CudaRuntime {
    fn run(
        &self,
        stream: Result<Stream>,
        library: &dyn Library,
        agree: Option<Agree>,
        body: &mut dyn FnMut(&dyn Backend) -> Result<()>,
    ) -> Result<()> {
        // Held to the end of the call: XLA's context stays current on this thread.
        let prepared = stream.and_then(prepare);
        let gpu = prepared
            .as_ref()
            .map(|prepared| &prepared.gpu as &dyn GpuMemory)
            .map_err(Error::clone);
        run_on(gpu, library, &self.pool, &self.stats, agree, body)
    }
}

/// The process's one CUDA runtime: its pool of pinned buffers lives as long as the process.
static RUNTIME: OnceLock<CudaRuntime> = OnceLock::new();

fn runtime() -> &'static CudaRuntime {
    RUNTIME.get_or_init(CudaRuntime::default)
}

/// Installs the CUDA `GpuRuntime` (cheap: loads nothing until a GPU op runs).
pub fn install() {
    install_gpu_runtime(runtime());
}

/// Frees the pinned staging buffers (at exit) in the context that owns them, then gives
/// that context back.
pub fn release() {
    let Some(runtime) = RUNTIME.get() else { return };
    runtime.pool.release();
    if let (Ok(d), Some(owner)) = (driver::driver(), OWNER.get()) {
        // The pool is empty and stays so at exit: nothing needs the context any more.
        // SAFETY: releases the reference `owner` retained.
        unsafe { (d.api.cuDevicePrimaryCtxRelease_v2)(owner.gpu) };
    }
}

/// What the GPU decorators did so far (`Stats`), and the pinned pool's state.
pub fn counters() -> Vec<(&'static str, u64)> {
    let runtime = runtime();
    let mut all = runtime.stats.snapshot();
    all.push(("pinned_allocations", runtime.pool.allocations()));
    all.push(("pinned_bytes", runtime.pool.held_bytes() as u64));
    all
}

/// What the driver says of the allocation holding GPU address `ptr`: (attribute, value
/// or the driver's error), for the GPU run's probe of XLA's allocator.
pub fn pointer_attributes(ptr: usize) -> Result<Vec<(&'static str, Result<u64>)>> {
    let d = driver::driver()?;
    let ordinal = RANK_GPU.load(Ordering::SeqCst).max(0);
    let _current = Pushed::context(d, owner(d, ordinal)?.context)?;
    let ptr = ptr as *const u8;
    Ok([
        ("memory_type", attribute::MEMORY_TYPE),
        ("device_ordinal", attribute::DEVICE_ORDINAL),
        (
            "is_legacy_cuda_ipc_capable",
            attribute::IS_LEGACY_CUDA_IPC_CAPABLE,
        ),
        ("range_size", attribute::RANGE_SIZE),
        ("mapped", attribute::MAPPED),
        ("allowed_handle_types", attribute::ALLOWED_HANDLE_TYPES),
        (
            "is_gpu_direct_rdma_capable",
            attribute::IS_GPU_DIRECT_RDMA_CAPABLE,
        ),
        ("mempool_handle", attribute::MEMPOOL_HANDLE),
    ]
    .into_iter()
    .map(|(name, which)| (name, pointer_attribute(d, ptr, which)))
    .collect())
}
