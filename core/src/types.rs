//! Portable values: what an op means, independent of which MPI library carries it out.

use std::fmt;
use std::path::PathBuf;

/// Element type of a buffer. The set JAX arrays can have and jaxmpi can move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

impl Dtype {
    pub const ALL: [Dtype; 15] = [
        Dtype::Bool,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::U8,
        Dtype::U16,
        Dtype::U32,
        Dtype::U64,
        Dtype::F16,
        Dtype::BF16,
        Dtype::F32,
        Dtype::F64,
        Dtype::C64,
        Dtype::C128,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::I8 | Dtype::U8 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 | Dtype::C64 => 8,
            Dtype::C128 => 16,
        }
    }

    /// The numpy name, as users see it in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
            Dtype::U64 => "uint64",
            Dtype::F16 => "float16",
            Dtype::BF16 => "bfloat16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::C64 => "complex64",
            Dtype::C128 => "complex128",
        }
    }

    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    pub const fn is_integer(self) -> bool {
        matches!(
            self,
            Dtype::I8
                | Dtype::I16
                | Dtype::I32
                | Dtype::I64
                | Dtype::U8
                | Dtype::U16
                | Dtype::U32
                | Dtype::U64
        )
    }

    pub const fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
    }

    pub const fn is_complex(self) -> bool {
        matches!(self, Dtype::C64 | Dtype::C128)
    }

    /// 16-bit floats: no MPI family has a predefined reduction for both, so backends
    /// reduce them through their own user-defined operations.
    pub const fn is_half(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction: one of MPI's predefined operations, or a user-created `MPI_Op` passed
/// through by its raw handle (as mpi4py's `Op.handle` gives it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    Land,
    Lor,
    Lxor,
    Band,
    Bor,
    Bxor,
    User(usize),
}

impl ReduceOp {
    pub const PREDEFINED: [ReduceOp; 10] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Land,
        ReduceOp::Lor,
        ReduceOp::Lxor,
        ReduceOp::Band,
        ReduceOp::Bor,
        ReduceOp::Bxor,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "SUM",
            ReduceOp::Prod => "PROD",
            ReduceOp::Min => "MIN",
            ReduceOp::Max => "MAX",
            ReduceOp::Land => "LAND",
            ReduceOp::Lor => "LOR",
            ReduceOp::Lxor => "LXOR",
            ReduceOp::Band => "BAND",
            ReduceOp::Bor => "BOR",
            ReduceOp::Bxor => "BXOR",
            ReduceOp::User(_) => "user-defined op",
        }
    }

    pub fn from_name(name: &str) -> Option<ReduceOp> {
        ReduceOp::PREDEFINED
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(name))
    }

    /// Whether MPI defines this predefined op on this element type (MPI-4.0 §6.9.2), with
    /// jaxmpi's own SUM/PROD/MIN/MAX for the 16-bit floats. User ops accept anything: only
    /// their author knows.
    pub const fn supports(self, dtype: Dtype) -> bool {
        let int = dtype.is_integer();
        match self {
            ReduceOp::Sum | ReduceOp::Prod => int || dtype.is_float() || dtype.is_complex(),
            ReduceOp::Min | ReduceOp::Max => int || dtype.is_float(),
            ReduceOp::Land | ReduceOp::Lor | ReduceOp::Lxor => int || matches!(dtype, Dtype::Bool),
            ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => int,
            ReduceOp::User(_) => true,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceOp::User(handle) => write!(f, "user-defined op {handle:#x}"),
            op => f.write_str(op.name()),
        }
    }
}

/// A communicator as a pointer-sized raw handle, exactly as mpi4py's `Comm.handle` gives
/// it. Only the backend that owns the library knows how to read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Comm(pub usize);

/// The other end of a point-to-point transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    Rank(i32),
    /// MPI_ANY_SOURCE: valid only as a source.
    Any,
    /// MPI_PROC_NULL: the transfer completes at once and moves nothing.
    Null,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Rank(rank) => write!(f, "{rank}"),
            Peer::Any => f.write_str("ANY_SOURCE"),
            Peer::Null => f.write_str("PROC_NULL"),
        }
    }
}

/// A started non-blocking transfer, as its library's `MPI_Request` handle (an integer or an
/// address, carried as `usize`); `receives` is the dtype of the buffer a receive fills
/// (what its status counts in), `None` for a send.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub raw: usize,
    pub receives: Option<Dtype>,
}

/// Where a started transfer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    Pending,
    Sent,
    Received(Status),
}

/// What a receive reports about the message it matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub source: Peer,
    /// `None` for a receive from `Peer::Null` (MPI reports MPI_ANY_TAG there).
    pub tag: Option<i32>,
    /// The MPI error code the library stored in the status (0 is MPI_SUCCESS everywhere).
    pub error: i32,
    /// Elements received, in units of the receive buffer's dtype.
    pub count: usize,
    /// The library's own `MPI_Status`, byte for byte, for callers that hand it on to code
    /// built against that library (e.g. an mpi4py `Status` object).
    pub native: NativeStatus,
}

impl Status {
    /// What a receive reports that was started, not completed (`Backend::start`): nothing
    /// yet. Its request's completion reports the message.
    pub fn not_yet() -> Status {
        Status {
            source: Peer::Null,
            tag: None,
            error: 0,
            count: 0,
            native: NativeStatus {
                bytes: [0; 32],
                len: 0,
            },
        }
    }
}

/// What starting ops left in flight (`Backend::start`): their requests, and whatever else
/// MPI reads until those complete (a v-op's counts, say), to be dropped only then.
#[derive(Default)]
pub struct Started {
    pub requests: Vec<Request>,
    pub keep: Vec<Box<dyn std::any::Any + Send>>,
}

/// An `MPI_Status` in its library's layout; opaque here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeStatus {
    pub bytes: [u8; 32],
    /// `sizeof(MPI_Status)` of the library: 20, 24 or 32.
    pub len: usize,
}

impl NativeStatus {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// MPI thread support levels, ordered from least to most permissive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ThreadLevel {
    Single,
    Funneled,
    Serialized,
    Multiple,
}

impl ThreadLevel {
    pub const fn name(self) -> &'static str {
        match self {
            ThreadLevel::Single => "MPI_THREAD_SINGLE",
            ThreadLevel::Funneled => "MPI_THREAD_FUNNELED",
            ThreadLevel::Serialized => "MPI_THREAD_SERIALIZED",
            ThreadLevel::Multiple => "MPI_THREAD_MULTIPLE",
        }
    }
}

/// The three binary interfaces an MPI library can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// MPICH and its derivatives: Intel MPI, MVAPICH, Cray MPICH (`libmpi.so.12`).
    Mpich,
    /// Open MPI 3 to 5 (`libmpi.so.40`).
    OpenMpi,
    /// The MPI-5 standard ABI (`libmpi_abi.so.1`).
    MpiAbi,
}

impl Family {
    /// The name `JAXMPI_MPI` uses for this family.
    pub const fn name(self) -> &'static str {
        match self {
            Family::Mpich => "mpich",
            Family::OpenMpi => "openmpi",
            Family::MpiAbi => "mpiabi",
        }
    }

    pub fn from_name(name: &str) -> Option<Family> {
        [Family::Mpich, Family::OpenMpi, Family::MpiAbi]
            .into_iter()
            .find(|f| f.name() == name)
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which library a backend drives and why it was chosen: what `python -m jaxmpi info`
/// prints and what a bug report needs.
#[derive(Clone, Debug)]
pub struct LibraryInfo {
    pub family: Family,
    /// The file the library was loaded from.
    pub path: PathBuf,
    /// `MPI_Get_library_version`, trimmed.
    pub version_string: String,
    /// `MPI_Get_version`: the standard version the library implements.
    pub standard_version: (i32, i32),
    /// How selection arrived at this library, in words.
    pub chosen_by: String,
    /// The library's own values of MPI_ANY_SOURCE, MPI_PROC_NULL and MPI_ANY_TAG, so that
    /// jaxmpi's Python constants equal mpi4py's.
    pub any_source: i32,
    pub proc_null: i32,
    pub any_tag: i32,
    /// The MPI functions jaxmpi calls through a profiling tool loaded ahead of the library
    /// (an `LD_PRELOAD`ed mpiP, Score-P, TAU, ...) instead of the library's own definition:
    /// `(function, the file defining what is called)`. None where the linker bound the
    /// functions (the `linked` backend: a preloaded tool interposes as on any program).
    pub interposed: Option<Vec<(String, PathBuf)>>,
}
