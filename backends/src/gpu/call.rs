//! One op on GPU buffers, from this rank's prepared stream to its end, whatever the GPU
//! (CUDA's `CudaRuntime`, or a fake one in tests): the part of the GPU runtime that decides
//! which ranks learn of a failure.
//!
//! Before the verdict, this rank waits for the work XLA queued on the stream, in either
//! mode. A failure there (a kernel of XLA's that faulted leaves a sticky error: the likely
//! way a GPU fails inside an op) then reaches the call's start verdict like a failed
//! preparation: every rank of a collective raises and none makes the op's MPI call. Staged
//! copies would have waited for that work anyway; a CUDA-aware MPI must.
//!
//! After the verdict, a failure reaches every rank only where MPI carries it (a collective
//! MPI returns an error from on every rank). A GPU failure in the op's own copies, and an
//! MPI error one rank alone sees (a truncated receive), raise on that rank: it still
//! makes every MPI call of the op (`staged.rs`), and the others complete with data from it
//! that is undefined. Point to point, where no verdict is taken, a rank that cannot start
//! makes the op's calls on host scratch memory (`unusable.rs`), with the same result for
//! its partner. The docs (docs/guides/gpus.md, "When a GPU fails on one rank") say so.

use jaxmpi_core::gpu::Agree;
use jaxmpi_core::{Backend, Library, Result};

use super::unusable::without_gpu;
use super::{Direct, GpuMemory, PinnedPool, Placement, Staged, Stats};

/// Runs `body` (one op, on the backend it is given) on `gpu`, this rank's prepared stream
/// or why it could not be prepared; `agree` is the call's start verdict, where it takes
/// one. `pool` and `stats` are the process's.
pub fn run_on(
    gpu: Result<&dyn GpuMemory>,
    library: &dyn Library,
    pool: &PinnedPool,
    stats: &Stats,
    agree: Option<Agree>,
    body: &mut dyn FnMut(&dyn Backend) -> Result<()>,
) -> Result<()> {
    let gpu = match gpu.and_then(|gpu| gpu.synchronize().map(|()| gpu)) {
        Ok(gpu) => gpu,
        Err(err) => {
            return match agree {
                // Every rank returns an error then; this one its own.
                Some(agree) => agree(Some(&err)).and(Err(err)),
                None => without_gpu(library, err, body),
            };
        }
    };
    if let Some(agree) = agree {
        agree(None)?;
    }
    let outcome = if library.cuda_aware() {
        let placement = if library.cuda_aware_checks_buffers() {
            Placement::IpcShareable
        } else {
            Placement::Any
        };
        body(&Direct::new(library, gpu, pool, stats, placement))
    } else {
        body(&Staged::new(library, gpu, pool, stats))
    };
    // Events of this call must not be in use after it returns.
    outcome.and(gpu.synchronize())
}

#[cfg(test)]
#[path = "call_tests.rs"]
mod tests;
