//! The MPI linked at build time (feature `linked`): every constant, handle and the status
//! layout come from the library's own `mpi.h` through mpi-sys, never from the hand-written
//! tables of the other families. That makes it usable where run-time detection cannot
//! name the library, and an independent oracle for those tables (`jaxmpi-probe --oracle`).

use std::ffi::c_int;
use std::mem::{offset_of, size_of};

use jaxmpi_core::Family;
use libloading::Library;
use mpi_sys as sys;

use super::{Abi, Mpich, OpenMpi, Predefined};

pub struct Linked;

/// Every handle kind of `mpi.h` (MPI_Comm, MPI_Datatype, MPI_Op, MPI_Errhandler) is one
/// `int` (MPICH family) or one pointer (Open MPI), and mpi-sys wraps each in a transparent
/// newtype; the function table passes all of them as this one type.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Handle(sys::MPI_Comm);

// SAFETY: a handle is a name for an MPI object, not an owned pointer; MPI (initialized with
// MPI_THREAD_MULTIPLE) accepts it from any thread.
unsafe impl Send for Handle {}
// SAFETY: as above; a handle is never dereferenced on the Rust side.
unsafe impl Sync for Handle {}

const WIDTH: usize = size_of::<Handle>();
const _: () = assert!(WIDTH == 4 || WIDTH == 8);

/// Reinterprets any `mpi.h` handle (or an integer of its width) as `Handle`.
fn handle<T: Copy>(value: T) -> Handle {
    assert_eq!(size_of::<T>(), WIDTH, "mpi.h handle types have one width");
    // SAFETY: same size (checked above), and every bit pattern of an int or a pointer is a
    // valid value of the transparent newtype around one.
    unsafe { std::mem::transmute_copy(&value) }
}

/// The handle as the pointer-sized integer mpi4py uses (ints sign-extended, as MPICH's).
fn bits(handle: Handle) -> usize {
    if WIDTH == 4 {
        // SAFETY: Handle is 4 bytes wide here.
        unsafe { std::mem::transmute_copy::<Handle, c_int>(&handle) as isize as usize }
    } else {
        // SAFETY: Handle is pointer-sized here.
        unsafe { std::mem::transmute_copy::<Handle, usize>(&handle) }
    }
}

fn from_bits(raw: usize) -> Handle {
    if WIDTH == 4 {
        handle(raw as u32)
    } else {
        handle(raw)
    }
}

impl Abi for Linked {
    type Handle = Handle;

    /// Integer handles are the MPICH family's; pointer handles Open MPI's. (An MPI-5 ABI
    /// `mpi.h` also has pointer handles: `load_linked` refuses it by its symbols.)
    const FAMILY: Family = if WIDTH == 4 {
        Family::Mpich
    } else {
        Family::OpenMpi
    };
    /// `MPI_IN_PLACE` is a cast macro, which bindgen cannot evaluate: the one constant
    /// taken from the family's table (in-place results in the probe cover it).
    const IN_PLACE: usize = match Self::FAMILY {
        Family::Mpich => Mpich::IN_PLACE,
        _ => OpenMpi::IN_PLACE,
    };
    const COMM_TYPE_SHARED: c_int = sys::MPI_COMM_TYPE_SHARED as c_int;
    /// Which variables hint at GPU support is the family's convention, not mpi.h's.
    const CUDA_HINTS: &'static [&'static str] = match Self::FAMILY {
        Family::Mpich => Mpich::CUDA_HINTS,
        _ => OpenMpi::CUDA_HINTS,
    };
    const ANY_SOURCE: c_int = sys::MPI_ANY_SOURCE as c_int;
    const ANY_TAG: c_int = sys::MPI_ANY_TAG as c_int;
    const PROC_NULL: c_int = sys::MPI_PROC_NULL as c_int;
    const THREAD_LEVELS: [c_int; 4] = [
        sys::MPI_THREAD_SINGLE as c_int,
        sys::MPI_THREAD_FUNNELED as c_int,
        sys::MPI_THREAD_SERIALIZED as c_int,
        sys::MPI_THREAD_MULTIPLE as c_int,
    ];
    const STATUS_SOURCE: usize = offset_of!(sys::MPI_Status, MPI_SOURCE);
    const STATUS_TAG: usize = offset_of!(sys::MPI_Status, MPI_TAG);
    const STATUS_ERROR: usize = offset_of!(sys::MPI_Status, MPI_ERROR);
    const STATUS_SIZE: usize = size_of::<sys::MPI_Status>();

    fn predefined(lib: &Library) -> Result<Predefined<Handle>, String> {
        // mpi.h has MPI_OP_NULL and MPI_DATATYPE_NULL only as cast macros and mpi-sys
        // exports no copy of them; jaxmpi uses them only as initial values of out-parameters.
        let (op_null, datatype_null) = match Self::FAMILY {
            Family::Mpich => {
                let table = Mpich::predefined(lib)?;
                let bits = |h: c_int| from_bits(h as u32 as usize);
                (bits(table.op_null), bits(table.datatype_null))
            }
            _ => {
                let table = OpenMpi::predefined(lib)?;
                (from_bits(table.op_null), from_bits(table.datatype_null))
            }
        };
        // SAFETY: mpi-sys's C shim defines each of these as a constant initialized from
        // the mpi.h macro of the same name; reading them has no side effect.
        let p = unsafe {
            Predefined {
                comm_world: handle(sys::RSMPI_COMM_WORLD),
                comm_self: handle(sys::RSMPI_COMM_SELF),
                comm_null: handle(sys::RSMPI_COMM_NULL),
                op_null,
                datatype_null,
                errors_return: handle(sys::RSMPI_ERRORS_RETURN),
                info_null: handle(sys::RSMPI_INFO_NULL),
                datatypes: [
                    handle(sys::RSMPI_C_BOOL),
                    handle(sys::RSMPI_INT8_T),
                    handle(sys::RSMPI_INT16_T),
                    handle(sys::RSMPI_INT32_T),
                    handle(sys::RSMPI_INT64_T),
                    handle(sys::RSMPI_UINT8_T),
                    handle(sys::RSMPI_UINT16_T),
                    handle(sys::RSMPI_UINT32_T),
                    handle(sys::RSMPI_UINT64_T),
                    handle(sys::RSMPI_UINT16_T), // float16
                    handle(sys::RSMPI_UINT16_T), // bfloat16
                    handle(sys::RSMPI_FLOAT),
                    handle(sys::RSMPI_DOUBLE),
                    handle(sys::RSMPI_FLOAT_COMPLEX), // MPI_C_FLOAT_COMPLEX
                    handle(sys::RSMPI_DOUBLE_COMPLEX), // MPI_C_DOUBLE_COMPLEX
                ],
                ops: [
                    handle(sys::RSMPI_SUM),
                    handle(sys::RSMPI_PROD),
                    handle(sys::RSMPI_MIN),
                    handle(sys::RSMPI_MAX),
                    handle(sys::RSMPI_LAND),
                    handle(sys::RSMPI_LOR),
                    handle(sys::RSMPI_LXOR),
                    handle(sys::RSMPI_BAND),
                    handle(sys::RSMPI_BOR),
                    handle(sys::RSMPI_BXOR),
                ],
            }
        };
        Ok(p)
    }

    /// The shape checks are the family's: they judge a raw integer, not mpi.h.
    fn handle_from_raw(raw: usize) -> Result<Handle, String> {
        match Self::FAMILY {
            Family::Mpich => Mpich::handle_from_raw(raw).map(|h| from_bits(h as u32 as usize)),
            _ => OpenMpi::handle_from_raw(raw).map(from_bits),
        }
    }

    fn handle_to_raw(handle: Handle) -> usize {
        bits(handle)
    }

    fn check_comm_object(lib: &Library, comm: Handle) -> Result<(), String> {
        match Self::FAMILY {
            Family::Mpich => Mpich::check_comm_object(lib, bits(comm) as c_int),
            _ => OpenMpi::check_comm_object(lib, bits(comm)),
        }
    }
}

/// The `mpicc` the build used (build-probe-mpi's choice: `$MPICC`, else `mpicc`), for
/// messages naming the build-time MPI.
pub const BUILD_MPICC: &str = env!("JAXMPI_LINKED_MPICC");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_handles_round_trip_through_the_mpi_h_representation() {
        let world = Linked::predefined(&Library::from(libloading::os::unix::Library::this()))
            .map(|p| p.comm_world);
        // Open MPI's predefined handles need its symbols, which a unit test process has.
        let world = world.expect("the linked library's predefined handles");
        let raw = Linked::handle_to_raw(world);
        assert_eq!(Linked::handle_from_raw(raw), Ok(world));
        assert!(Linked::handle_from_raw(0).is_err());
    }
}
