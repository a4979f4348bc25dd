//! The MPI functions jaxmpi calls, resolved once when the library is loaded.
//!
//! Prototypes are written against a generic handle type `H`, so one table serves every
//! family: MPICH's `int` handles and the pointer-sized ones of Open MPI and the MPI-5 ABI.

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

use super::interpose::{self, Interposed};

/// `MPI_Count` is a 64-bit integer in every family.
pub type Count = i64;
/// `MPI_Aint` is pointer-sized in every family.
pub type Aint = isize;
/// Pointer to a family's `MPI_Status` (see `RawStatus`).
pub type StatusPtr = *mut c_void;
/// `MPI_User_function`. The datatype argument is a pointer to a handle; jaxmpi's callbacks
/// never read it, so one type serves all families.
pub type UserFunction = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut c_void);

/// The function `name` of `lib` as jaxmpi calls it: the library's own definition, or that
/// of a profiling tool loaded ahead of the library (`interpose.rs` says when), noted in
/// `interposed`. The one place every function pointer of the tables comes from.
///
/// # Safety
/// `F` must be the exact C prototype of the symbol `name`.
unsafe fn resolve<F: Copy>(
    lib: &Library,
    name: &str,
    interposed: &mut Interposed,
) -> Result<F, String> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    // SAFETY: a lookup of a symbol's address; the library outlives the copy because
    // backends keep it loaded for the life of the process.
    let own = match unsafe { lib.get::<*mut c_void>(&cname) } {
        Ok(symbol) if !symbol.is_null() => *symbol,
        _ => return Err(name.to_string()),
    };
    let chosen = interpose::definition(own, name, interposed);
    // SAFETY: `chosen` is the address of a definition of `name`, the library's or a tool's
    // with the same prototype (a tool stands in for the function it defines); the caller
    // guarantees `F` is that prototype, a function pointer of `chosen`'s size (asserted).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&chosen) })
}

/// Declares a struct of function pointers and a `load` that resolves all of them, failing
/// with the name of the first one missing.
macro_rules! function_table {
    ($(#[$doc:meta])* struct $table:ident<$h:ident> { $($(#[$field:meta])* $name:ident($($arg:ty),* $(,)?);)* }) => {
        $(#[$doc])*
        #[allow(non_snake_case)]
        pub struct $table<$h> {
            $($(#[$field])* pub $name: unsafe extern "C" fn($($arg),*) -> c_int,)*
        }

        impl<$h: Copy> $table<$h> {
            /// Resolves every function (`resolve`), noting in `interposed` those a
            /// profiling tool took over.
            pub fn load(lib: &Library, interposed: &mut Interposed) -> Result<Self, String> {
                // SAFETY: every prototype above is the one the MPI standard gives for
                // that name, with handles as `H`.
                unsafe { Ok($table { $($name: resolve(lib, stringify!($name), interposed)?,)* }) }
            }
        }
    };
    (linked $(#[$doc:meta])* struct $table:ident<$h:ident> { $($(#[$field:meta])* $name:ident($($arg:ty),* $(,)?);)* }) => {
        function_table! { $(#[$doc])* struct $table<$h> { $($(#[$field])* $name($($arg),*);)* } }

        #[cfg(feature = "linked")]
        impl $table<super::abi::linked::Handle> {
            /// The table filled from the library linked at build time: each name must
            /// exist in its `mpi.h` for this to compile, and the linker binds it.
            pub fn linked() -> Self {
                type $h = super::abi::linked::Handle;
                // SAFETY: as for `load`: each mpi-sys function has the standard's prototype
                // with its own handle types, which share `H`'s representation.
                unsafe {
                    $table {
                        $($name: std::mem::transmute::<*const (), unsafe extern "C" fn($($arg),*) -> c_int>(
                            mpi_sys::$name as *const (),
                        ),)*
                    }
                }
            }
        }
    };
}

function_table! {
    linked
    /// Every function of MPI 3.0 jaxmpi needs; a library lacking one is not usable.
    struct Functions<H> {
        MPI_Get_version(*mut c_int, *mut c_int);
        MPI_Get_library_version(*mut c_char, *mut c_int);
        MPI_Initialized(*mut c_int);
        MPI_Finalized(*mut c_int);
        MPI_Init_thread(*mut c_int, *mut *mut *mut c_char, c_int, *mut c_int);
        MPI_Query_thread(*mut c_int);
        MPI_Finalize();
        MPI_Error_string(c_int, *mut c_char, *mut c_int);
        MPI_Error_class(c_int, *mut c_int);

        MPI_Comm_rank(H, *mut c_int);
        MPI_Comm_size(H, *mut c_int);
        MPI_Comm_dup(H, *mut H);
        MPI_Comm_split(H, c_int, c_int, *mut H);
        MPI_Comm_split_type(H, c_int, c_int, H, *mut H);
        MPI_Comm_free(*mut H);
        // The callbacks' pointers as addresses: their prototypes take the family's handle.
        MPI_Comm_create_keyval(*const c_void, *const c_void, *mut c_int, *mut c_void);
        MPI_Comm_get_attr(H, c_int, *mut c_void, *mut c_int);
        MPI_Comm_set_attr(H, c_int, *mut c_void);
        MPI_Comm_group(H, *mut H);
        MPI_Group_incl(H, c_int, *const c_int, *mut H);
        MPI_Group_free(*mut H);
        MPI_Comm_create_group(H, H, c_int, *mut H);
        MPI_Comm_test_inter(H, *mut c_int);
        MPI_Comm_set_errhandler(H, H);
        MPI_Comm_get_errhandler(H, *mut H);
        MPI_Errhandler_free(*mut H);
        MPI_Abort(H, c_int);

        MPI_Op_create(UserFunction, c_int, *mut H);
        MPI_Op_free(*mut H);
        MPI_Type_contiguous(c_int, H, *mut H);
        MPI_Type_create_struct(c_int, *const c_int, *const Aint, *const H, *mut H);
        MPI_Type_commit(*mut H);
        MPI_Type_free(*mut H);
        MPI_Get_elements_x(StatusPtr, H, *mut Count);

        MPI_Barrier(H);
        MPI_Allreduce(*const c_void, *mut c_void, c_int, H, H, H);
        MPI_Reduce_local(*const c_void, *mut c_void, c_int, H, H);
        MPI_Reduce(*const c_void, *mut c_void, c_int, H, H, c_int, H);
        MPI_Scan(*const c_void, *mut c_void, c_int, H, H, H);
        MPI_Exscan(*const c_void, *mut c_void, c_int, H, H, H);
        MPI_Reduce_scatter_block(*const c_void, *mut c_void, c_int, H, H, H);
        MPI_Bcast(*mut c_void, c_int, H, c_int, H);
        MPI_Gather(*const c_void, c_int, H, *mut c_void, c_int, H, c_int, H);
        MPI_Allgather(*const c_void, c_int, H, *mut c_void, c_int, H, H);
        MPI_Scatter(*const c_void, c_int, H, *mut c_void, c_int, H, c_int, H);
        MPI_Alltoall(*const c_void, c_int, H, *mut c_void, c_int, H, H);
        MPI_Gatherv(*const c_void, c_int, H, *mut c_void, *const c_int, *const c_int, H, c_int, H);
        MPI_Allgatherv(*const c_void, c_int, H, *mut c_void, *const c_int, *const c_int, H, H);
        MPI_Scatterv(*const c_void, *const c_int, *const c_int, H, *mut c_void, c_int, H, c_int, H);
        MPI_Alltoallv(
            *const c_void, *const c_int, *const c_int, H,
            *mut c_void, *const c_int, *const c_int, H, H,
        );
        MPI_Send(*const c_void, c_int, H, c_int, c_int, H);
        MPI_Recv(*mut c_void, c_int, H, c_int, c_int, H, StatusPtr);
        MPI_Sendrecv(
            *const c_void, c_int, H, c_int, c_int,
            *mut c_void, c_int, H, c_int, c_int, H, StatusPtr,
        );
        MPI_Sendrecv_replace(*mut c_void, c_int, H, c_int, c_int, c_int, c_int, H, StatusPtr);
        // The non-blocking twins of the calls above (`starting.rs`), MPI 3.0's.
        MPI_Iallreduce(*const c_void, *mut c_void, c_int, H, H, H, *mut H);
        MPI_Ireduce(*const c_void, *mut c_void, c_int, H, H, c_int, H, *mut H);
        MPI_Iscan(*const c_void, *mut c_void, c_int, H, H, H, *mut H);
        MPI_Iexscan(*const c_void, *mut c_void, c_int, H, H, H, *mut H);
        MPI_Ireduce_scatter_block(*const c_void, *mut c_void, c_int, H, H, H, *mut H);
        MPI_Ibcast(*mut c_void, c_int, H, c_int, H, *mut H);
        MPI_Igather(*const c_void, c_int, H, *mut c_void, c_int, H, c_int, H, *mut H);
        MPI_Iallgather(*const c_void, c_int, H, *mut c_void, c_int, H, H, *mut H);
        MPI_Iscatter(*const c_void, c_int, H, *mut c_void, c_int, H, c_int, H, *mut H);
        MPI_Ialltoall(*const c_void, c_int, H, *mut c_void, c_int, H, H, *mut H);
        MPI_Igatherv(
            *const c_void, c_int, H, *mut c_void, *const c_int, *const c_int, H, c_int, H, *mut H,
        );
        MPI_Iallgatherv(
            *const c_void, c_int, H, *mut c_void, *const c_int, *const c_int, H, H, *mut H,
        );
        MPI_Iscatterv(
            *const c_void, *const c_int, *const c_int, H, *mut c_void, c_int, H, c_int, H, *mut H,
        );
        MPI_Ialltoallv(
            *const c_void, *const c_int, *const c_int, H,
            *mut c_void, *const c_int, *const c_int, H, H, *mut H,
        );
        MPI_Isend(*const c_void, c_int, H, c_int, c_int, H, *mut H);
        MPI_Irecv(*mut c_void, c_int, H, c_int, c_int, H, *mut H);
        MPI_Test(*mut H, *mut c_int, StatusPtr);
        MPI_Wait(*mut H, StatusPtr);
        MPI_Cancel(*mut H);
        MPI_Request_free(*mut H);

        // Not used by the ops; the probe cross-checks the handle tables with them.
        MPI_Type_size(H, *mut c_int);
        MPI_Type_get_name(H, *mut c_char, *mut c_int);
        #[cfg_attr(not(feature = "linked"), allow(dead_code))] // the oracle's
        MPI_Comm_compare(H, H, *mut c_int);
    }
}

function_table! {
    /// MPI-4 large-count variants of the data-moving ops. All or none: a library either
    /// implements MPI-4 large counts or it does not.
    struct LargeCountFunctions<H> {
        MPI_Bcast_c(*mut c_void, Count, H, c_int, H);
        MPI_Gather_c(*const c_void, Count, H, *mut c_void, Count, H, c_int, H);
        MPI_Allgather_c(*const c_void, Count, H, *mut c_void, Count, H, H);
        MPI_Scatter_c(*const c_void, Count, H, *mut c_void, Count, H, c_int, H);
        MPI_Alltoall_c(*const c_void, Count, H, *mut c_void, Count, H, H);
        MPI_Gatherv_c(*const c_void, Count, H, *mut c_void, *const Count, *const Aint, H, c_int, H);
        MPI_Allgatherv_c(*const c_void, Count, H, *mut c_void, *const Count, *const Aint, H, H);
        MPI_Scatterv_c(*const c_void, *const Count, *const Aint, H, *mut c_void, Count, H, c_int, H);
        MPI_Alltoallv_c(
            *const c_void, *const Count, *const Aint, H,
            *mut c_void, *const Count, *const Aint, H, H,
        );
        MPI_Send_c(*const c_void, Count, H, c_int, c_int, H);
        MPI_Recv_c(*mut c_void, Count, H, c_int, c_int, H, StatusPtr);
        MPI_Sendrecv_c(
            *const c_void, Count, H, c_int, c_int,
            *mut c_void, Count, H, c_int, c_int, H, StatusPtr,
        );
        MPI_Sendrecv_replace_c(*mut c_void, Count, H, c_int, c_int, c_int, c_int, H, StatusPtr);
        MPI_Isend_c(*const c_void, Count, H, c_int, c_int, H, *mut H);
        MPI_Irecv_c(*mut c_void, Count, H, c_int, c_int, H, *mut H);
    }
}

/// Resolves an optional function that is not part of a table, e.g. `MPI_Abi_get_version`
/// or the MPIX CUDA queries, by the same rule as the tables' (a tool's definition where
/// `interpose.rs` takes it).
///
/// # Safety
/// `F` must be the exact C prototype of the symbol `name`.
pub unsafe fn optional<F: Copy>(lib: &Library, name: &str) -> Option<F> {
    // SAFETY: forwarded to the caller.
    unsafe { resolve(lib, name, &mut Interposed::new()).ok() }
}
