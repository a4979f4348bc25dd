//! GPU execution as core sees it: core knows no CUDA. A backend crate installs one
//! `GpuRuntime`; a GPU handler hands it XLA's stream and the op body, and the runtime
//! runs the body against a `Backend` that can take GPU buffers on that stream (staged
//! through host memory, or passed straight to a GPU-aware MPI), wrapping the library's
//! host `Backend`.
//!
//! Before the body, the runtime prepares this rank's part (the stream's context, the
//! rank's GPU, ...), and that can fail on one rank alone. No rank may then be left waiting
//! in an MPI call another never makes, so a failed preparation goes one of two ways:
//! - where the call has an [`Agree`] (a collective, with start verdicts on:
//!   `xla::handlers::services::start_verdict`), every rank of the call learns it before
//!   anyone calls MPI, and every rank returns an error;
//! - elsewhere (point to point; collectives with start verdicts off) the rank still runs
//!   the op's body, making every MPI call of it with host scratch memory, and returns its
//!   error after.

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::{Backend, Error, Library, Result};

/// XLA's stream for this call (a `CUstream` on CUDA), opaque to core.
#[derive(Clone, Copy, Debug)]
pub struct Stream(pub *mut c_void);

/// How the ranks of one call agree that each can start its part, before the op's first MPI
/// call: given why this rank cannot (`None`: it can), Ok only when every rank can.
pub type Agree<'a> = &'a mut dyn FnMut(Option<&Error>) -> Result<()>;

pub trait GpuRuntime: Send + Sync {
    /// Runs `body` with a backend for buffers that live on the GPU of `stream`, with
    /// `library` (the process's MPI library) doing the communication. `stream` is Err where
    /// XLA could not give it: a failed preparation like the runtime's own. `agree`, where
    /// the call has one, runs once, after this rank's preparation and before `body` (see
    /// the module's note for a call without).
    fn run(
        &self,
        stream: Result<Stream>,
        library: &dyn Library,
        agree: Option<Agree>,
        body: &mut dyn FnMut(&dyn Backend) -> Result<()>,
    ) -> Result<()>;
}

static GPU_RUNTIME: OnceLock<&'static dyn GpuRuntime> = OnceLock::new();

/// Installs the process-wide GPU runtime; the first one installed stays (as the library
/// does), so installing again is harmless.
pub fn install_gpu_runtime(runtime: &'static dyn GpuRuntime) {
    GPU_RUNTIME.get_or_init(|| runtime);
}

/// The installed GPU runtime, for GPU handlers.
pub fn gpu_runtime() -> Result<&'static dyn GpuRuntime> {
    match GPU_RUNTIME.get() {
        Some(runtime) => Ok(*runtime),
        None => Err(Error::library(
            "gpu",
            "a jaxmpi op ran on a GPU, but no GPU runtime was installed \
             (import jaxmpi before running GPU ops)",
        )),
    }
}
