//! Bugs of particular MPI library versions, which the probe would otherwise blame on the
//! backend. Each was reproduced with a plain C program against the library: the backend
//! passes these calls through unchanged, so the wrong result (or crash) is the library's.
//!
//! A wrong-result bug only excuses a mismatch, so a library that gets it right, or a
//! backend that learns to work around it, still passes. A crashing bug skips the call.
//! Either way the summary line names the bug.

use jaxmpi_core::{Family, LibraryInfo};

type Version = (u32, u32, u32);

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

/// MIN and MAX compare unsigned integers as signed ones (MPICH 4.0; seen in Debian's
/// 4.0.2 with 2 and 3 ranks).
pub const UNSIGNED_MIN_MAX: Bug = Bug {
    id: "pmodels/mpich#6083",
    affects: |info| mpich_between(info, (4, 0, 0), (4, 1, 0)),
};

/// MPI_Reduce with MPI_IN_PLACE at a root other than 0 reads from the MPI_IN_PLACE
/// address and segfaults once the message exceeds a few KiB (fixed in MPICH 4.1.2).
pub const REDUCE_IN_PLACE_AT_NONZERO_ROOT: Bug = Bug {
    id: "pmodels/mpich#6540",
    affects: |info| mpich_between(info, (4, 0, 0), (4, 1, 2)),
};

/// Intel MPI's MPI-5 ABI library (seen in 2021.18) accepts MPI_ERRORS_RETURN on a
/// communicator, reports it back, and still aborts the job on the next error.
pub const INTEL_ABI_ERRORS_RETURN: Bug = Bug {
    id: "intel-mpi-abi-errors-return",
    affects: |info| {
        info.family == Family::MpiAbi && info.version_string.contains("Intel(R) MPI Library")
    },
};

fn mpich_between(info: &LibraryInfo, from: Version, to: Version) -> bool {
    mpich_version(&info.version_string).is_some_and(|v| from <= v && v < to)
}

/// "MPICH Version: 4.0.2" gives (4, 0, 2). Derivatives (Intel MPI, Cray MPICH) word their
/// versions differently and are never matched.
fn mpich_version(text: &str) -> Option<Version> {
    let word = text
        .split("MPICH Version:")
        .nth(1)?
        .split_whitespace()
        .next()?;
    let mut numbers = word.split('.').map(|part| {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    let major = numbers.next()??;
    let mut next = || numbers.next().flatten().unwrap_or(0);
    Some((major, next(), next()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_library_strings() {
        let debian = "MPICH Version:\t4.0.2\nMPICH Release date: Thu Apr  7 2022";
        assert_eq!(mpich_version(debian), Some((4, 0, 2)));
        assert_eq!(mpich_version("MPICH Version: 4.1a1 x"), Some((4, 1, 0)));
        assert_eq!(mpich_version("Open MPI v4.1.4, package: Debian"), None);
    }
}
