//! The dlopen backend: one generic `MpiLibrary<A>` over the three ABI families.

pub mod abi;
mod calls;
mod collectives;
mod comms;
mod counts;
pub mod cuda_aware;
pub(crate) mod functions;
mod handles;
#[cfg(feature = "linked")]
pub mod inspect;
mod library;
mod ops;
mod own_ops;
mod p2p;
mod quirks;
mod reductions;
mod vector;

#[cfg(feature = "linked")]
pub(crate) use library::c_string;
pub use library::{one_line, MpiLibrary};
