//! Open MPI 3 to 5: a handle is the address of the object; predefined handles are the
//! addresses of data symbols such as `ompi_mpi_comm_world`.

use std::ffi::{c_int, c_void, CStr};

use jaxmpi_core::Family;
use libloading::Library;

use super::{nonzero, Abi, Predefined};

pub struct OpenMpi;

/// Pointer-sized handle kept as `usize` so it is `Send + Sync`.
pub type Handle = usize;

/// The address of a data symbol, which is the handle Open MPI's `mpi.h` would produce.
fn symbol_address(lib: &Library, name: &CStr) -> Result<Handle, String> {
    // SAFETY: we read the symbol's address only (libloading yields it as the pointer
    // value), never the object behind it.
    let symbol = unsafe { lib.get::<*mut c_void>(name.to_bytes_with_nul()) };
    match symbol {
        Ok(address) => Ok(*address as Handle),
        Err(_) => Err(format!(
            "the library exports no `{}`, which every Open MPI 3-5 has",
            name.to_string_lossy()
        )),
    }
}

impl Abi for OpenMpi {
    type Handle = Handle;

    const FAMILY: Family = Family::OpenMpi;
    const IN_PLACE: usize = 1;
    const ANY_SOURCE: c_int = -1;
    const ANY_TAG: c_int = -1;
    const PROC_NULL: c_int = -2;
    const THREAD_LEVELS: [c_int; 4] = [0, 1, 2, 3];
    const STATUS_SOURCE: usize = 0;
    const STATUS_TAG: usize = 4;
    const STATUS_SIZE: usize = 24;
    const STATUS_ERROR: usize = 8;
    const COMM_TYPE_SHARED: c_int = 0;
    const CUDA_HINTS: &'static [&'static str] = &["OMPI_MCA_opal_cuda_support"];

    fn predefined(lib: &Library) -> Result<Predefined<Handle>, String> {
        let s = |name: &CStr| symbol_address(lib, name);
        Ok(Predefined {
            comm_world: s(c"ompi_mpi_comm_world")?,
            comm_self: s(c"ompi_mpi_comm_self")?,
            comm_null: s(c"ompi_mpi_comm_null")?,
            op_null: s(c"ompi_mpi_op_null")?,
            datatype_null: s(c"ompi_mpi_datatype_null")?,
            errors_return: s(c"ompi_mpi_errors_return")?,
            info_null: s(c"ompi_mpi_info_null")?,
            datatypes: [
                s(c"ompi_mpi_c_bool")?,
                s(c"ompi_mpi_int8_t")?,
                s(c"ompi_mpi_int16_t")?,
                s(c"ompi_mpi_int32_t")?,
                s(c"ompi_mpi_int64_t")?,
                s(c"ompi_mpi_uint8_t")?,
                s(c"ompi_mpi_uint16_t")?,
                s(c"ompi_mpi_uint32_t")?,
                s(c"ompi_mpi_uint64_t")?,
                s(c"ompi_mpi_uint16_t")?, // float16
                s(c"ompi_mpi_uint16_t")?, // bfloat16
                s(c"ompi_mpi_float")?,
                s(c"ompi_mpi_double")?,
                s(c"ompi_mpi_c_float_complex")?,
                s(c"ompi_mpi_c_double_complex")?,
            ],
            ops: [
                s(c"ompi_mpi_op_sum")?,
                s(c"ompi_mpi_op_prod")?,
                s(c"ompi_mpi_op_min")?,
                s(c"ompi_mpi_op_max")?,
                s(c"ompi_mpi_op_land")?,
                s(c"ompi_mpi_op_lor")?,
                s(c"ompi_mpi_op_lxor")?,
                s(c"ompi_mpi_op_band")?,
                s(c"ompi_mpi_op_bor")?,
                s(c"ompi_mpi_op_bxor")?,
            ],
        })
    }

    fn handle_from_raw(raw: usize) -> Result<Handle, String> {
        let raw = nonzero(raw)?;
        if raw % std::mem::align_of::<*const c_void>() != 0 {
            return Err(format!(
                "{raw:#x} is not an Open MPI handle (not an aligned address; MPICH-family \
                 and MPI-5 ABI handles are small integers)"
            ));
        }
        Ok(raw)
    }

    fn handle_to_raw(handle: Handle) -> usize {
        handle
    }

    /// Every Open MPI object starts with its class pointer (after a magic word in debug
    /// builds): a communicator's is `&ompi_communicator_t_class`. Reading it through
    /// `process_vm_readv` turns a stray address into an error instead of a crash.
    fn check_comm_object(lib: &Library, comm: Handle) -> Result<(), String> {
        let class = symbol_address(lib, c"ompi_communicator_t_class")?;
        let mut header = [0usize; 2];
        if !super::memory::read_own_memory(comm, &mut header) {
            return Err(format!(
                "{comm:#x} is not the address of an Open MPI object"
            ));
        }
        if !header.contains(&class) {
            return Err(format!(
                "{comm:#x} is not a live Open MPI communicator (was it freed?)"
            ));
        }
        Ok(())
    }
}
