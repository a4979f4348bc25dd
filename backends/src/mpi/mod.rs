//! The dlopen backend: one generic `MpiLibrary<A>` over the three ABI families.

pub mod abi;
pub mod cuda_aware;
pub(crate) mod functions;
#[cfg(feature = "linked")]
pub mod inspect;
mod library;
mod ops;
mod own_ops;
mod quirks;

#[cfg(feature = "linked")]
pub(crate) use library::c_string;
pub use library::{one_line, MpiLibrary};
