//! The dlopen backend: one generic `MpiLibrary<A>` over the three ABI families.
//!
//! `library.rs` loads and initializes it; `impl_library.rs` and `impl_backend.rs` implement
//! core's two traits, the ops living in the file of their kind (`reductions`,
//! `collectives`, `vector`, `p2p`); those call the MPI functions of `count_agnostic.rs`,
//! which pick classic or large-count functions (`counts.rs`), or their non-blocking twins
//! in starting mode (`starting.rs`); `requests.rs` completes the requests either way.
//! `ring.rs` makes the allreduce of jaxmpi's own ops itself where MPICH would combine the
//! whole vector on every rank.
//! `handles.rs` converts values, `abi/` holds each family's constants. `interpose.rs`
//! decides, for every function the tables take, whether jaxmpi calls the library's own
//! definition or a profiling tool's loaded ahead of it.

pub mod abi;
mod collectives;
mod count_agnostic;
mod counts;
pub mod cuda_aware;
pub(crate) mod functions;
mod handles;
mod impl_backend;
mod impl_library;
#[cfg(feature = "linked")]
pub mod inspect;
mod interpose;
mod library;
mod own_reductions;
mod p2p;
mod quirks;
mod reductions;
mod requests;
mod ring;
mod starting;
mod vector;

#[cfg(feature = "linked")]
pub(crate) use library::c_string;
pub use library::{one_line, MpiLibrary};
