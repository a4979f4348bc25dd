//! The dlopen backend: one generic `MpiLibrary<A>` over the three ABI families.

pub mod abi;
mod functions;
mod half;
mod library;
mod ops;

pub use library::{one_line, MpiLibrary};
