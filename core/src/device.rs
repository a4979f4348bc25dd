//! Device (GPU) execution as core sees it: core knows no CUDA. A backend crate installs one
//! `DeviceRuntime`; a device handler hands it XLA's stream and the op body, and the runtime
//! runs the body against a `Backend` that can take device buffers on that stream (staged
//! through host memory, or passed straight to a device-aware MPI), wrapping the library's
//! host `Backend`.

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::{Backend, Error, Library, Result};

/// XLA's stream for this call (a `CUstream` on CUDA), opaque to core.
#[derive(Clone, Copy, Debug)]
pub struct Stream(pub *mut c_void);

pub trait DeviceRuntime: Send + Sync {
    /// Runs `body` with a backend for buffers that live on the device of `stream`, with
    /// `library` (the process's MPI library) doing the communication.
    fn run(
        &self,
        stream: Stream,
        library: &dyn Library,
        body: &mut dyn FnMut(&dyn Backend) -> Result<()>,
    ) -> Result<()>;
}

static DEVICE_RUNTIME: OnceLock<&'static dyn DeviceRuntime> = OnceLock::new();

/// Installs the process-wide device runtime; the first one installed stays (as the library
/// does), so installing again is harmless.
pub fn install_device_runtime(runtime: &'static dyn DeviceRuntime) {
    DEVICE_RUNTIME.get_or_init(|| runtime);
}

/// The installed device runtime, for device handlers.
pub fn device_runtime() -> Result<&'static dyn DeviceRuntime> {
    match DEVICE_RUNTIME.get() {
        Some(runtime) => Ok(*runtime),
        None => Err(Error::library(
            "device",
            "a jaxmpi op ran on a GPU, but no device runtime was installed \
             (import jaxmpi before running GPU ops)",
        )),
    }
}
