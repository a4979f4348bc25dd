//! Bugs of particular MPI library versions that jaxmpi works around, so that users of
//! those libraries (Debian 12 ships MPICH 4.0.2) still get correct results, and choices of
//! a library that cost jaxmpi's own ops speed. Each was reproduced with a plain C program
//! against the library.

use jaxmpi_core::{Family, LibraryInfo};

type Version = (u32, u32, u32);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quirks {
    /// MIN and MAX compare unsigned integers as signed ones (pmodels/mpich#6083, MPICH
    /// 4.0.x): jaxmpi reduces them with its own ops.
    pub unsigned_min_max_as_signed: bool,
    /// MPI_Reduce with MPI_IN_PLACE at a root other than 0 reads the MPI_IN_PLACE address
    /// and crashes above a few KiB (pmodels/mpich#6540, MPICH 4.0 to 4.1.1): jaxmpi passes
    /// a copy of the input instead.
    pub reduce_in_place_off_rank_0_crashes: bool,
    /// MPI_Allreduce of a user-defined op runs by recursive doubling, every rank combining
    /// the whole vector, where a predefined op's goes by reduce-scatter + allgather, each
    /// combining its share (MPICH, every version: `maint/tuning/coll/mpir/generic.json`;
    /// no CVAR chooses per op): jaxmpi makes the two steps itself for its own ops on
    /// large buffers (`reductions::large_allreduce`, `ring.rs`).
    pub user_op_allreduce_by_recursive_doubling: bool,
}

impl Quirks {
    pub fn of(info: &LibraryInfo) -> Quirks {
        // MPICH under any ABI (its standard-ABI library says the same version).
        let any_mpich = mpich_version(&info.version_string);
        let mpich = any_mpich.filter(|_| info.family == Family::Mpich);
        let between = |from: Version, to: Version| mpich.is_some_and(|v| from <= v && v < to);
        Quirks {
            unsigned_min_max_as_signed: between((4, 0, 0), (4, 1, 0)),
            reduce_in_place_off_rank_0_crashes: between((4, 0, 0), (4, 1, 2)),
            user_op_allreduce_by_recursive_doubling: any_mpich.is_some(),
        }
    }
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

    fn info(family: Family, version: &str) -> LibraryInfo {
        LibraryInfo {
            family,
            path: "/lib/libmpi.so.12".into(),
            version_string: version.into(),
            standard_version: (4, 0),
            chosen_by: String::new(),
            any_source: -2,
            proc_null: -1,
            any_tag: -1,
            interposed: Some(Vec::new()),
        }
    }

    #[test]
    fn versions_parse_from_library_strings() {
        assert_eq!(
            mpich_version("MPICH Version:\t4.0.2\nMPICH Release date: Thu Apr  7 2022"),
            Some((4, 0, 2))
        );
        assert_eq!(mpich_version("MPICH Version: 4.1a1 x"), Some((4, 1, 0)));
        assert_eq!(mpich_version("Open MPI v4.1.4, package: Debian"), None);
    }

    #[test]
    fn only_the_affected_versions_get_workarounds() {
        let debian = Quirks::of(&info(Family::Mpich, "MPICH Version:\t4.0.2\n"));
        assert!(debian.unsigned_min_max_as_signed && debian.reduce_in_place_off_rank_0_crashes);
        let mpich_4_1_1 = Quirks::of(&info(Family::Mpich, "MPICH Version: 4.1.1\n"));
        assert!(
            !mpich_4_1_1.unsigned_min_max_as_signed
                && mpich_4_1_1.reduce_in_place_off_rank_0_crashes
        );
        let mpich_5 = Quirks {
            user_op_allreduce_by_recursive_doubling: true,
            ..Quirks::default()
        };
        assert_eq!(
            Quirks::of(&info(Family::Mpich, "MPICH Version: 5.0.2\n")),
            mpich_5
        );
        // The standard ABI's library of MPICH chooses as MPICH does; Intel MPI is not
        // MPICH's tuning.
        assert_eq!(
            Quirks::of(&info(Family::MpiAbi, "MPICH Version: 5.0.2\n")),
            mpich_5
        );
        assert_eq!(
            Quirks::of(&info(Family::Mpich, "Intel(R) MPI Library 2021.18")),
            Quirks::default()
        );
        assert_eq!(
            Quirks::of(&info(Family::OpenMpi, "Open MPI v4.1.4")),
            Quirks::default()
        );
    }
}
