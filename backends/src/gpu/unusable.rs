//! `Unusable`: the GPU of a rank whose part of a call could not be prepared (XLA gave
//! no stream, its context could not be made current, the arrays are on another GPU than
//! the rank's, ...). Where the call's ranks take no start verdict (point to point; every
//! op with start verdicts off: `jaxmpi_core::gpu`), returning that error at once would
//! leave the other ranks waiting in MPI calls this one never makes. So the op's body still
//! runs, on `Staged` over this GPU (`without_gpu`): every GPU operation fails with
//! the preparation's error, so staging never touches the GPU arrays and hands MPI host
//! scratch memory instead (pageable: pinning fails too), and makes every MPI call of the
//! op. The other ranks complete; this one returns its error, saying what it did.

use jaxmpi_core::{Backend, Error, Library, Result};

use super::{GpuMemory, Marker, PinnedBuffer, PinnedPool, Staged, Stats};

/// A GPU every memory operation of which fails with the same error.
pub struct Unusable {
    why: Error,
}

impl Unusable {
    pub fn new(why: Error) -> Self {
        Unusable { why }
    }

    fn refuse<T>(&self) -> Result<T> {
        Err(self.why.clone())
    }
}

impl GpuMemory for Unusable {
    fn copy_to_host_async(&self, _: *mut u8, _: *const u8, _: usize) -> Result<()> {
        self.refuse()
    }
    fn copy_to_gpu_async(&self, _: *mut u8, _: *const u8, _: usize) -> Result<()> {
        self.refuse()
    }
    fn zero_async(&self, _: *mut u8, _: usize) -> Result<()> {
        self.refuse()
    }
    fn mark(&self) -> Result<Marker> {
        self.refuse()
    }
    /// Nothing was ever queued, so nothing is left to wait for. (Failing here would also
    /// make staging keep its host buffers from the pool for good, as it must where copies
    /// may still be queued on them.)
    fn wait(&self, _: Marker) -> Result<()> {
        Ok(())
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn alloc_pinned(&self, _: usize) -> Result<PinnedBuffer> {
        self.refuse()
    }
    fn shareable_by_ipc(&self, _: *const u8) -> Result<bool> {
        Ok(false)
    }
}

/// Runs `body` (an op, on the backend it is given) over `library`'s host ops on host
/// scratch memory in place of the GPU's, for a rank whose part could not be prepared
/// (`why`): every MPI call of the op is made, and `why` is returned after.
pub fn without_gpu(
    library: &dyn Library,
    why: Error,
    body: &mut dyn FnMut(&dyn Backend) -> Result<()>,
) -> Result<()> {
    let gpu = Unusable::new(why.clone());
    // Of this op alone: its scratch memory is pageable, freed as it returns.
    let (pool, stats) = (PinnedPool::default(), Stats::default());
    let outcome = body(&Staged::new(library, &gpu, &pool, &stats));
    let mut err = why;
    err.message.push_str(
        "; this rank still made the op's MPI calls, with host scratch memory in place of \
         its GPU arrays (no other rank waits for it), so what it sent is undefined and its \
         results were not written",
    );
    // Staging reports the GPU's failure over the op's own; an MPI failure is worth
    // telling too.
    match outcome {
        Err(mpi) if mpi.mpi_class().is_some() => {
            err.message
                .push_str(&format!("; the MPI calls failed too: {mpi}"));
        }
        _ => {}
    }
    Err(err)
}

#[cfg(test)]
#[path = "unusable_tests.rs"]
mod tests;
