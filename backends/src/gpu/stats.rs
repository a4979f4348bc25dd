//! What the GPU decorators did, counted: which way each op on GPU buffers went. A
//! GPU run asserts these instead of trusting the mode it asked for (a staged op that
//! should have been direct gives the same numbers), and `info` shows them.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default, Debug)]
pub struct Stats {
    /// Ops whose GPU buffers went to MPI as they are (CUDA-aware MPI).
    pub direct: AtomicU64,
    /// Ops run on host copies of their GPU buffers.
    pub staged: AtomicU64,
    /// MPI calls that staged allreduce and bcast made, one per chunk.
    pub staged_chunks: AtomicU64,
    /// Of `staged`: ops a CUDA-aware MPI would get, staged because host code computes on
    /// their buffers (jaxmpi's own reductions, user ops, a library quirk's workaround).
    pub staged_host_code: AtomicU64,
    /// Of `staged`: ops `auto` staged because a buffer cannot be shared by legacy CUDA IPC.
    pub staged_not_ipc: AtomicU64,
    /// Of `staged`: in-place sendrecvs a CUDA-aware MPI would get, staged because
    /// `MPI_Sendrecv_replace` copies the buffer through host memory of its own.
    pub staged_in_place: AtomicU64,
    /// Host buffers that could not be pinned, so pageable memory served instead.
    pub pageable: AtomicU64,
    /// Staging buffers kept out of the pool because a failure left copies queued on them.
    pub withheld: AtomicU64,
}

impl Stats {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Every counter by name, for Python.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("direct", get(&self.direct)),
            ("staged", get(&self.staged)),
            ("staged_chunks", get(&self.staged_chunks)),
            ("staged_host_code", get(&self.staged_host_code)),
            ("staged_not_ipc", get(&self.staged_not_ipc)),
            ("staged_in_place", get(&self.staged_in_place)),
            ("pageable", get(&self.pageable)),
            ("withheld", get(&self.withheld)),
        ]
    }
}
