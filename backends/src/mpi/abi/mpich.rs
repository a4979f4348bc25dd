//! MPICH family (MPICH, Intel MPI, MVAPICH, Cray MPICH): 32-bit integer handles whose bits
//! encode the object kind; predefined handles are constants.

use std::ffi::c_int;

use jaxmpi_core::Family;
use libloading::Library;

use super::{Abi, Predefined};

pub struct Mpich;

/// Bits 26..30 of an MPICH handle name the object kind; 1 is a communicator.
const KIND_SHIFT: u32 = 26;
const KIND_COMM: u32 = 1;

impl Abi for Mpich {
    type Handle = c_int;

    const FAMILY: Family = Family::Mpich;
    const IN_PLACE: usize = usize::MAX; // (void*)-1
    const ANY_SOURCE: c_int = -2;
    const ANY_TAG: c_int = -1;
    const PROC_NULL: c_int = -1;
    const THREAD_LEVELS: [c_int; 4] = [0, 1, 2, 3];
    const STATUS_SOURCE: usize = 8;
    const STATUS_TAG: usize = 12;
    const STATUS_SIZE: usize = 20;
    const STATUS_ERROR: usize = 16;
    const COMM_TYPE_SHARED: c_int = 1;
    // Cray MPICH; Intel MPI.
    const CUDA_HINTS: &'static [&'static str] = &["MPICH_GPU_SUPPORT_ENABLED", "I_MPI_OFFLOAD"];

    fn predefined(_lib: &Library) -> Result<Predefined<c_int>, String> {
        Ok(Predefined {
            comm_world: 0x4400_0000,
            comm_self: 0x4400_0001,
            comm_null: 0x0400_0000,
            op_null: 0x1800_0000,
            datatype_null: 0x0c00_0000,
            errors_return: 0x5400_0001,
            info_null: 0x1c00_0000,
            datatypes: [
                0x4c00_013f, // C_BOOL
                0x4c00_0137, // INT8_T
                0x4c00_0238, // INT16_T
                0x4c00_0439, // INT32_T
                0x4c00_083a, // INT64_T
                0x4c00_013b, // UINT8_T
                0x4c00_023c, // UINT16_T
                0x4c00_043d, // UINT32_T
                0x4c00_083e, // UINT64_T
                0x4c00_023c, // float16 as UINT16_T
                0x4c00_023c, // bfloat16 as UINT16_T
                0x4c00_040a, // FLOAT
                0x4c00_080b, // DOUBLE
                0x4c00_0840, // C_FLOAT_COMPLEX
                0x4c00_1041, // C_DOUBLE_COMPLEX
            ],
            ops: [
                0x5800_0003, // SUM
                0x5800_0004, // PROD
                0x5800_0002, // MIN
                0x5800_0001, // MAX
                0x5800_0005, // LAND
                0x5800_0007, // LOR
                0x5800_0009, // LXOR
                0x5800_0006, // BAND
                0x5800_0008, // BOR
                0x5800_000a, // BXOR
            ],
        })
    }

    fn handle_from_raw(raw: usize) -> Result<c_int, String> {
        // mpi4py hands out the int sign-extended to 64 bits: user communicators are negative.
        let high = (raw as u64) >> 32;
        if high != 0 && high != 0xFFFF_FFFF {
            return Err(format!(
                "{raw:#x} is a pointer, as Open MPI and the MPI-5 ABI use; MPICH-family handles are 32-bit integers"
            ));
        }
        let handle = raw as u32;
        if handle >> 30 == 0 {
            return Err(format!("{raw:#x} is not an MPICH-family handle"));
        }
        Ok(handle as c_int)
    }

    fn handle_to_raw(handle: c_int) -> usize {
        handle as isize as usize
    }

    fn check_comm_object(_lib: &Library, comm: c_int) -> Result<(), String> {
        if (comm as u32 >> KIND_SHIFT) & 0xF != KIND_COMM {
            return Err(format!(
                "{comm:#x} is an MPICH handle, but not of a communicator"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_handles_truncate_to_i32_and_pointers_are_refused() {
        assert_eq!(Mpich::handle_from_raw(0x4400_0000), Ok(0x4400_0000));
        let user_comm = 0xFFFF_FFFF_8400_0002_u64 as usize;
        assert_eq!(
            Mpich::handle_from_raw(user_comm),
            Ok(0x8400_0002_u32 as c_int)
        );
        assert_eq!(Mpich::handle_to_raw(0x8400_0002_u32 as c_int), user_comm);
        let err = Mpich::handle_from_raw(0x7f3a_1c00_4e80).unwrap_err();
        assert!(err.contains("is a pointer"), "{err}");
        assert!(Mpich::handle_from_raw(5).is_err());
    }
}
