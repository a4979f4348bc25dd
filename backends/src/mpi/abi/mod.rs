//! What differs between the MPI ABI families, and nothing else: constants, the handle type
//! and its conversion from the pointer-sized integers mpi4py hands out, the predefined
//! handles, and the status layout. Behaviour lives in `MpiLibrary`, written once.

#[cfg(feature = "linked")]
pub mod linked;
mod memory;
mod mpich;
mod openmpi;
mod standard;

#[cfg(feature = "linked")]
pub use linked::Linked;
pub use mpich::Mpich;
pub use openmpi::OpenMpi;
pub use standard::Standard;

use std::ffi::c_int;
use std::fmt;

use jaxmpi_core::{Dtype, Family, ReduceOp};
use libloading::Library;

pub trait Abi: Send + Sync + 'static {
    /// The C type of every handle (MPI_Comm, MPI_Datatype, MPI_Op, MPI_Errhandler).
    type Handle: Copy + PartialEq + Send + Sync + fmt::Debug + 'static;

    const FAMILY: Family;
    /// `MPI_IN_PLACE` as an address.
    const IN_PLACE: usize;
    const ANY_SOURCE: c_int;
    const ANY_TAG: c_int;
    const PROC_NULL: c_int;
    /// MPI_THREAD_SINGLE, FUNNELED, SERIALIZED, MULTIPLE in that order.
    const THREAD_LEVELS: [c_int; 4];
    /// Byte offsets of MPI_SOURCE, MPI_TAG and MPI_ERROR inside `MPI_Status`.
    const STATUS_SOURCE: usize;
    const STATUS_TAG: usize;
    const STATUS_ERROR: usize;
    /// `sizeof(MPI_Status)`.
    const STATUS_SIZE: usize;
    /// `MPI_COMM_TYPE_SHARED`: the split type that groups the ranks of one node.
    const COMM_TYPE_SHARED: c_int;
    /// Env variables with which this family's libraries switch their CUDA support on or
    /// off at run time (read by `cuda_aware::decide`).
    const CUDA_HINTS: &'static [&'static str];

    /// The predefined handles; Open MPI's are addresses of symbols in the library.
    fn predefined(lib: &Library) -> Result<Predefined<Self::Handle>, String>;

    /// Reads a pointer-sized raw handle (mpi4py's `.handle`), refusing values that cannot
    /// be a handle of this family.
    fn handle_from_raw(raw: usize) -> Result<Self::Handle, String>;
    fn handle_to_raw(handle: Self::Handle) -> usize;

    /// A family-specific check that a communicator handle points at a live communicator,
    /// for handles whose shape alone proves nothing. Default: shape checks only.
    fn check_comm_object(_lib: &Library, _comm: Self::Handle) -> Result<(), String> {
        Ok(())
    }
}

/// The predefined handles jaxmpi uses, in one family's representation.
#[derive(Clone, Copy, Debug)]
pub struct Predefined<H> {
    pub comm_world: H,
    pub comm_self: H,
    pub comm_null: H,
    pub op_null: H,
    pub datatype_null: H,
    pub errors_return: H,
    pub info_null: H,
    /// Indexed by `Dtype::ALL` order. The 16-bit floats travel as UINT16_T: no family has a
    /// portable type for both, and jaxmpi reduces them with its own ops.
    pub datatypes: [H; 15],
    /// Indexed by `ReduceOp::PREDEFINED` order.
    pub ops: [H; 10],
}

impl<H: Copy> Predefined<H> {
    pub fn datatype(&self, dtype: Dtype) -> H {
        let index = Dtype::ALL.iter().position(|&d| d == dtype);
        // Dtype::ALL lists every variant, so the position always exists.
        self.datatypes[index.unwrap_or_default()]
    }

    /// The handle of a predefined op; `None` for a user op.
    pub fn op(&self, op: ReduceOp) -> Option<H> {
        ReduceOp::PREDEFINED
            .iter()
            .position(|&p| p == op)
            .map(|i| self.ops[i])
    }
}

/// Storage for any family's `MPI_Status` (the largest, MPI-5's, is 32 bytes).
#[derive(Clone, Copy, Default)]
#[repr(C, align(8))]
pub struct RawStatus([u8; 32]);

impl RawStatus {
    pub fn as_mut_ptr(&mut self) -> *mut std::ffi::c_void {
        self.0.as_mut_ptr().cast()
    }

    pub fn bytes(&self) -> [u8; 32] {
        self.0
    }

    pub fn field(&self, offset: usize) -> c_int {
        let bytes = &self.0[offset..offset + 4];
        c_int::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

/// Handle check shared by the families whose handles are small integer constants or
/// pointers: zero is never a handle.
fn nonzero(raw: usize) -> Result<usize, String> {
    if raw == 0 {
        Err("0 is not a valid handle".into())
    } else {
        Ok(raw)
    }
}
