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

static DEVICE_RUNTIME: OnceLock<Result<Box<dyn DeviceRuntime>, Error>> = OnceLock::new();

/// Installs the process-wide device runtime the first time only (as `install_library`).
pub fn install_device_runtime(
    make: impl FnOnce() -> Result<Box<dyn DeviceRuntime>>,
) -> Result<&'static dyn DeviceRuntime> {
    match DEVICE_RUNTIME.get_or_init(make) {
        Ok(runtime) => Ok(runtime.as_ref()),
        Err(err) => Err(err.clone()),
    }
}

/// The installed device runtime, for device handlers.
pub fn device_runtime() -> Result<&'static dyn DeviceRuntime> {
    match DEVICE_RUNTIME.get() {
        Some(Ok(runtime)) => Ok(runtime.as_ref()),
        Some(Err(err)) => Err(err.clone()),
        None => Err(Error::library(
            "device",
            "a jaxmpi op ran on a GPU, but no device runtime was installed \
             (import jaxmpi before running GPU ops)",
        )),
    }
}
