//! The dlopen backend: one generic `MpiLibrary<A>` over the three ABI families.

pub mod abi;
pub mod cuda_aware;
mod functions;
mod library;
mod ops;
mod own_ops;
mod quirks;

pub use library::{one_line, MpiLibrary};
