//! What `jaxmpi-probe --oracle` compares between the linked backend and the dlopened one of
//! the same library: the predefined handles as the library sees them, and the constants.

use std::ffi::c_int;

use jaxmpi_core::{Comm, Dtype, Library, Result};

use super::abi::Abi;
use super::MpiLibrary;

/// One backend's view of the library's predefined objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// (dtype, MPI_Type_size, MPI_Type_get_name) of its datatype, in `Dtype::ALL` order.
    pub datatypes: Vec<(Dtype, usize, String)>,
    /// The integer constants and the `MPI_Status` layout the backend passes to MPI. Not
    /// `MPI_IN_PLACE`: the linked backend takes that one from the family table too.
    pub constants: Vec<(&'static str, i64)>,
    pub world: Comm,
    pub self_comm: Comm,
}

pub trait Inspect: Send + Sync {
    fn library(&self) -> &dyn Library;
    fn facts(&self) -> Result<Facts>;
    /// Whether `MPI_Comm_compare(a, b)` through this backend's handles is MPI_IDENT.
    fn comm_ident(&self, a: Comm, b: Comm) -> Result<bool>;
}

impl<A: Abi> Inspect for MpiLibrary<A> {
    fn library(&self) -> &dyn Library {
        self
    }

    fn facts(&self) -> Result<Facts> {
        let mut datatypes = Vec::new();
        for dtype in Dtype::ALL {
            let handle = self.pre.datatype(dtype);
            datatypes.push((dtype, self.element_size(handle)?, self.name_of(handle)));
        }
        let constants = vec![
            ("MPI_ANY_SOURCE", A::ANY_SOURCE.into()),
            ("MPI_ANY_TAG", A::ANY_TAG.into()),
            ("MPI_PROC_NULL", A::PROC_NULL.into()),
            ("MPI_THREAD_SINGLE", A::THREAD_LEVELS[0].into()),
            ("MPI_THREAD_FUNNELED", A::THREAD_LEVELS[1].into()),
            ("MPI_THREAD_SERIALIZED", A::THREAD_LEVELS[2].into()),
            ("MPI_THREAD_MULTIPLE", A::THREAD_LEVELS[3].into()),
            ("offsetof(MPI_Status, MPI_SOURCE)", A::STATUS_SOURCE as i64),
            ("offsetof(MPI_Status, MPI_TAG)", A::STATUS_TAG as i64),
            ("offsetof(MPI_Status, MPI_ERROR)", A::STATUS_ERROR as i64),
            ("sizeof(MPI_Status)", A::STATUS_SIZE as i64),
            ("MPI_COMM_TYPE_SHARED", A::COMM_TYPE_SHARED.into()),
            // Handles that are no communicator, datatype or op: compared by value.
            ("MPI_INFO_NULL", A::handle_to_raw(self.pre.info_null) as i64),
            (
                "MPI_ERRORS_RETURN",
                A::handle_to_raw(self.pre.errors_return) as i64,
            ),
            ("MPI_COMM_NULL", A::handle_to_raw(self.pre.comm_null) as i64),
        ];
        Ok(Facts {
            datatypes,
            constants,
            world: self.to_comm(self.pre.comm_world),
            self_comm: self.to_comm(self.pre.comm_self),
        })
    }

    fn comm_ident(&self, a: Comm, b: Comm) -> Result<bool> {
        let (a, b) = (self.comm(a)?, self.comm(b)?);
        let mut result: c_int = -1;
        // SAFETY: two communicator handles of this library; writes one int.
        self.check("MPI_Comm_compare", unsafe {
            (self.fns.MPI_Comm_compare)(a, b, &mut result)
        })?;
        Ok(result == mpi_sys::MPI_IDENT as c_int)
    }
}
