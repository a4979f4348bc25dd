//! The MPI-5 standard ABI (`libmpi_abi.so.1`): pointer-sized opaque handles; predefined
//! handles are small integer constants fixed by the standard.

use std::ffi::{c_int, c_void};

use jaxmpi_core::Family;
use libloading::Library;

use super::{nonzero, Abi, Predefined};

pub struct Standard;

impl Standard {
    /// The predefined handles, fixed by the standard (also the encoding of jaxmpi's plug-in
    /// for jaxlib, `xla_plugin`, whose tests check it against `mpi_abi.h`).
    pub const PREDEFINED: Predefined<Handle> = Predefined {
        comm_world: 0x101,
        comm_self: 0x102,
        comm_null: 0x100,
        op_null: 0x020,
        datatype_null: 0x200,
        errors_return: 0x143,
        info_null: 0x130,
        datatypes: [
            0x238, // C_BOOL
            0x240, // INT8_T
            0x248, // INT16_T
            0x250, // INT32_T
            0x258, // INT64_T
            0x241, // UINT8_T
            0x249, // UINT16_T
            0x251, // UINT32_T
            0x259, // UINT64_T
            0x249, // float16 as UINT16_T
            0x249, // bfloat16 as UINT16_T
            0x210, // FLOAT
            0x214, // DOUBLE
            0x212, // C_FLOAT_COMPLEX
            0x216, // C_DOUBLE_COMPLEX
        ],
        ops: [
            0x21, // SUM
            0x24, // PROD
            0x22, // MIN
            0x23, // MAX
            0x30, // LAND
            0x31, // LOR
            0x32, // LXOR
            0x28, // BAND
            0x29, // BOR
            0x2a, // BXOR
        ],
    };
}

/// Pointer-sized handle; `usize` rather than a pointer type so it is `Send + Sync`.
/// The C functions take it in the same register either way.
pub type Handle = usize;

impl Abi for Standard {
    type Handle = Handle;

    const FAMILY: Family = Family::MpiAbi;
    const IN_PLACE: usize = 1;
    const ANY_SOURCE: c_int = -1;
    const ANY_TAG: c_int = -2;
    const PROC_NULL: c_int = -3;
    const THREAD_LEVELS: [c_int; 4] = [0, 1024, 2048, 4096];
    const STATUS_SOURCE: usize = 0;
    const STATUS_TAG: usize = 4;
    const STATUS_SIZE: usize = 32;
    const STATUS_ERROR: usize = 8;
    const COMM_TYPE_SHARED: c_int = 221;
    // The implementation behind the standard ABI may be of either family.
    const CUDA_HINTS: &'static [&'static str] = &[
        "MPICH_GPU_SUPPORT_ENABLED",
        "I_MPI_OFFLOAD",
        "OMPI_MCA_opal_cuda_support",
    ];

    fn predefined(_lib: &Library) -> Result<Predefined<Handle>, String> {
        Ok(Self::PREDEFINED)
    }

    fn handle_from_raw(raw: usize) -> Result<Handle, String> {
        nonzero(raw)
    }

    fn handle_to_raw(handle: Handle) -> usize {
        handle
    }

    /// Predefined handles are small constants; any other handle points at a library object.
    /// An unreadable address (such as an MPICH-family integer handle) is refused before
    /// MPI sees it, since MPI would abort on it.
    fn check_comm_object(_lib: &Library, comm: Handle) -> Result<(), String> {
        if comm < PREDEFINED_LIMIT {
            return match comm {
                0x101 | 0x102 => Ok(()),
                _ => Err(format!(
                    "{comm:#x} is a predefined MPI-5 ABI handle, but not of a communicator"
                )),
            };
        }
        let mut header = [0usize; 1];
        if !super::memory::read_own_memory(comm, &mut header) {
            return Err(format!(
                "{comm:#x} is not an MPI-5 ABI communicator (not the address of an object; \
                 MPICH-family handles are 32-bit integers)"
            ));
        }
        Ok(())
    }
}

/// The standard reserves handle values below 2^10 for predefined handles.
const PREDEFINED_LIMIT: usize = 0x400;

// The C prototypes take `void*`-sized handles; `usize` must be exactly that wide.
const _: () = assert!(std::mem::size_of::<Handle>() == std::mem::size_of::<*mut c_void>());
