//! jaxmpi-core: the portable heart of jaxmpi.
//!
//! This crate knows neither MPI nor Python. It defines the values that cross every layer
//! (`Dtype`, `ReduceOp`, `Comm`, `Peer`, `Status`), the buffers handed to a backend, the
//! object-safe [`Library`] and [`Backend`] traits that each MPI library implements, the
//! process-wide slot holding the one library chosen at run time, and the single error type.

mod backend;
mod buffer;
pub mod device;
mod error;
pub mod handlers;
mod monitor;
mod types;
mod watchdog;
pub mod xla_ffi;

pub use backend::{install_library, library, Backend, Envelope, Library};
pub use buffer::{Blocks, Broadcast, Buf, BufMut, Extent, Input, Partition, PartitionMut};
pub use error::{Error, ErrorKind, Result};
pub use types::{
    Comm, Dtype, Family, LibraryInfo, NativeStatus, Peer, ReduceOp, Status, ThreadLevel,
};
