//! Bugs of particular MPI library versions that the backend cannot work around, which the
//! probe would otherwise blame on it. Each was reproduced with a plain C program against
//! the library. The probe skips what such a bug breaks and names the bug in its summary.
//! (Bugs the backend does work around, in `backends/src/mpi/quirks.rs`, are not excused:
//! the probe checks that the workaround gives the right results.)

use jaxmpi_core::{Family, LibraryInfo};

pub struct Bug {
    /// The upstream issue (or a short name where there is no public tracker), as the
    /// summary line names it.
    pub id: &'static str,
    affects: fn(&LibraryInfo) -> bool,
}

impl Bug {
    pub fn affects(&self, info: &LibraryInfo) -> bool {
        (self.affects)(info)
    }
}

/// Intel MPI's MPI-5 ABI library (seen in 2021.18) accepts MPI_ERRORS_RETURN on a
/// communicator, reports it back, and still aborts the job on the next error.
pub const INTEL_ABI_ERRORS_RETURN: Bug = Bug {
    id: "intel-mpi-abi-errors-return",
    affects: |info| {
        info.family == Family::MpiAbi && info.version_string.contains("Intel(R) MPI Library")
    },
};
