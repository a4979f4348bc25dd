//! jaxmpi-core: the portable heart of jaxmpi.
//!
//! This crate knows no MPI library and no Python. At its root is the vocabulary every layer
//! shares: the values that cross them (`Dtype`, `ReduceOp`, `Comm`, `Peer`, `Status`), the
//! buffers handed to a backend, the object-safe [`Library`] and [`Backend`] traits each MPI
//! library implements, the process-wide slot holding the one library chosen at run time,
//! the GPU seam, and the single error type. `xla` is the front end XLA calls.

mod backend;
mod buffer;
mod error;
pub mod gpu;
mod types;
pub mod xla;

pub use backend::{install_library, library, Backend, Envelope, ErrorsReturned, Library};
pub use buffer::{Blocks, Broadcast, Buf, BufMut, Extent, Input, Partition, PartitionMut};
pub use error::{Error, ErrorKind, Result};
pub use types::{
    Comm, Dtype, Family, LibraryInfo, NativeStatus, Peer, Progress, ReduceOp, Request, Started,
    Status, ThreadLevel,
};
