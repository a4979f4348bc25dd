//! jaxmpi-backends: the MPI libraries jaxmpi drives, loaded at run time.
//!
//! `select` chooses and loads the process's library; `mpi` is the one generic backend over
//! the three ABI families; `gpu` runs the same ops on GPU buffers (staged through host
//! memory, or passed straight to a CUDA-aware MPI), with `gpu::cuda` for NVIDIA GPUs.
//! `xla_plugin` is the second front end: the MPI calls XLA's MPI backend makes for JAX's
//! collectives, which jaxlib's MPItrampoline forwards to this library.

pub mod chunks;
pub mod gpu;
pub mod mpi;
pub mod select;
pub mod xla_plugin;

pub use select::{select, select_with};
