//! Choosing the MPI library, once per process, the way the user and mpi4py expect.
//!
//! Order for `JAXMPI_MPI=auto`: an MPI already loaded in the process (e.g. by mpi4py), then
//! mpi4py's own variables (`MPI4PY_LIBMPI`, `MPI4PY_MPIABI`) so both packages agree, then
//! the launcher's environment, then mpi4py's search path (the environment's `lib/` first).

use std::path::{Path, PathBuf};

use jaxmpi_core::{Error, Family, Result};

use super::loaded::canonical;

const STEP: &str = "select MPI";

/// What the user asked for through `JAXMPI_MPI`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Auto,
    Family(Family),
    Path(PathBuf),
    /// The MPI linked at build time (feature `linked`).
    Linked,
}

impl Request {
    pub fn parse(value: &str) -> Result<Request> {
        let value = value.trim();
        if value.is_empty() || value == "auto" {
            return Ok(Request::Auto);
        }
        if value == "linked" {
            return Ok(Request::Linked);
        }
        if let Some(family) = Family::from_name(value) {
            return Ok(Request::Family(family));
        }
        if value.contains('/') || value.contains(".so") {
            return Ok(Request::Path(PathBuf::from(value)));
        }
        Err(Error::invalid_argument(
            "JAXMPI_MPI",
            format!("unknown value {value:?}: use auto, mpich, openmpi, mpiabi, the path of an MPI library, or linked (source builds)"),
        ))
    }

    pub fn from_env() -> Result<Request> {
        Request::parse(&std::env::var("JAXMPI_MPI").unwrap_or_default())
    }
}

/// Where to look for libraries: environment prefixes whose `lib/` is searched before the
/// system path, in order (mpi4py: the venv, the user base, the base prefix).
#[derive(Clone, Debug, Default)]
pub struct SearchPath {
    pub prefixes: Vec<PathBuf>,
}

impl SearchPath {
    /// The prefixes a plain process can know: the active virtualenv and conda environment.
    pub fn from_env() -> SearchPath {
        let prefixes = ["VIRTUAL_ENV", "CONDA_PREFIX"]
            .iter()
            .filter_map(std::env::var_os)
            .map(PathBuf::from)
            .collect();
        SearchPath { prefixes }
    }
}

/// A library to open and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// A path, or a bare soname for the system search path.
    pub library: PathBuf,
    /// The family it must turn out to be, when the request named one.
    pub family: Option<Family>,
    pub reason: String,
}

/// Sonames of each family, most specific first. Debian's MPICH has only libmpich.so.12
/// and Cray's libmpi_cray.so.12: no symlink is needed to find either.
fn sonames(family: Family) -> &'static [&'static str] {
    match family {
        Family::Mpich => &["libmpi.so.12", "libmpich.so.12", "libmpi_cray.so.12"],
        Family::OpenMpi => &["libmpi.so.40"],
        // MPICH 5.0.0 and 5.0.1 (their PyPI wheels, and source builds of those releases)
        // name it .so.0 by a slip (mpich#7928); only 5.0.2 has .so.1.
        Family::MpiAbi => &["libmpi_abi.so.1", "libmpi_abi.so.0", "libmpi_abi.so"],
    }
}

/// Why a family's library was found under a name other than its usual one, for `info`.
fn fallback_note(library: &Path) -> Option<&'static str> {
    match library.file_name()?.to_str()? {
        "libmpi_abi.so.0" => Some(
            "no libmpi_abi.so.1 before it; .so.0 is the standard ABI's library of MPICH \
             5.0.0 and 5.0.1",
        ),
        "libmpi_abi.so" => Some("no versioned libmpi_abi.so.1 or .so.0 before it"),
        _ => None,
    }
}

/// mpi4py's probing order when nothing says which family.
const ANY_SONAMES: [&str; 6] = [
    "libmpi.so",
    "libmpi.so.12",
    "libmpich.so.12",
    "libmpi.so.40",
    "libmpi_abi.so.1",
    "libmpi_cray.so.12",
];

/// The family the launcher that started us implies, from variables it sets in every rank.
pub(crate) fn launcher_hint() -> Option<(Family, &'static str)> {
    let set = |name: &str| std::env::var_os(name).is_some();
    if set("OMPI_COMM_WORLD_SIZE") {
        Some((
            Family::OpenMpi,
            "Open MPI's launcher (OMPI_COMM_WORLD_SIZE is set)",
        ))
    } else if set("PMI_SIZE") || set("PMI_RANK") || set("HYDI_CONTROL_FD") || set("PMI_FD") {
        Some((Family::Mpich, "an MPICH-family launcher (PMI_* is set)"))
    } else {
        None
    }
}

/// The number of ranks the launcher started, and the variable that says so.
#[cfg(feature = "linked")]
pub(crate) fn launcher_size() -> Option<(i32, &'static str)> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .into_iter()
        .find_map(|name| {
            let size = std::env::var(name).ok()?.trim().parse().ok()?;
            Some((size, name))
        })
}

/// What `JAXMPI_MPI=linked` gives in a build without the feature.
pub fn linked_not_built() -> Error {
    Error::invalid_argument(
        "JAXMPI_MPI",
        "linked: this jaxmpi was built without the `linked` feature, so it has no MPI linked in. \
         Build it from source against your MPI (`maturin build --release --features linked` in \
         python/, with that MPI's mpicc on PATH or in MPICC), or use JAXMPI_MPI=auto",
    )
}

/// Every place `names` could be: each prefix's lib/, then the bare names for the system.
fn candidates(search: &SearchPath, names: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for prefix in &search.prefixes {
        for name in names {
            let path = prefix.join("lib").join(name);
            if path.exists() {
                found.push(path);
            }
        }
    }
    found.extend(names.iter().map(PathBuf::from));
    found
}

/// Decides which library to open. Pure apart from reading the environment and the list of
/// loaded objects, so each rule can be tested.
pub fn choose(request: &Request, search: &SearchPath, loaded: &[PathBuf]) -> Result<Vec<Choice>> {
    if loaded.len() > 1 {
        return Err(Error::library(
            STEP,
            format!("two MPI libraries are already loaded in this process ({}); that cannot work. Load only one", list(loaded)),
        ));
    }
    if let Some(already) = loaded.first() {
        let reason = "it is already loaded in this process (e.g. by mpi4py)".to_string();
        return match request {
            Request::Auto => Ok(vec![Choice {
                library: already.clone(),
                family: None,
                reason,
            }]),
            Request::Family(family) => Ok(vec![Choice {
                library: already.clone(),
                family: Some(*family),
                reason: format!("JAXMPI_MPI={family} and {reason}"),
            }]),
            Request::Path(path) if canonical(path) == *already => Ok(vec![Choice {
                library: already.clone(),
                family: None,
                reason: format!("JAXMPI_MPI={}", path.display()),
            }]),
            Request::Path(path) => Err(second_library(already, &path.display().to_string())),
            Request::Linked => Err(linked_not_built()),
        };
    }
    let by_family = |family: Family, why: String| -> Vec<Choice> {
        candidates(search, sonames(family))
            .into_iter()
            .map(|library| Choice {
                reason: match fallback_note(&library) {
                    Some(note) => format!("{why} ({note})"),
                    None => why.clone(),
                },
                library,
                family: Some(family),
            })
            .collect()
    };
    match request {
        Request::Linked => Err(linked_not_built()),
        Request::Path(path) => {
            if !path.exists() {
                return Err(Error::invalid_argument(
                    "JAXMPI_MPI",
                    format!("{} does not exist; give the path of an MPI library (e.g. .../lib/libmpi.so.12)", path.display()),
                ));
            }
            Ok(vec![Choice {
                library: path.clone(),
                family: None,
                reason: format!("JAXMPI_MPI={}", path.display()),
            }])
        }
        Request::Family(family) => Ok(by_family(*family, format!("JAXMPI_MPI={family}"))),
        Request::Auto => {
            if let Ok(names) = std::env::var("MPI4PY_LIBMPI") {
                let names: Vec<&str> = names
                    .split([',', ':'])
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .collect();
                let paths = candidates(search, &names);
                let reason = "MPI4PY_LIBMPI names it, so jaxmpi and mpi4py agree".to_string();
                return Ok(paths
                    .into_iter()
                    .map(|library| Choice {
                        library,
                        family: None,
                        reason: reason.clone(),
                    })
                    .collect());
            }
            if let Ok(abi) = std::env::var("MPI4PY_MPIABI") {
                let family = Family::from_name(abi.trim()).ok_or_else(|| {
                    Error::invalid_argument(
                        "MPI4PY_MPIABI",
                        format!("unknown value {abi:?}: use mpich, openmpi or mpiabi"),
                    )
                })?;
                return Ok(by_family(
                    family,
                    format!("MPI4PY_MPIABI={family}, so jaxmpi and mpi4py agree"),
                ));
            }
            let mut choices = Vec::new();
            if let Some((family, launcher)) = launcher_hint() {
                choices.extend(by_family(
                    family,
                    format!("the job was started by {launcher}"),
                ));
            }
            let reason = "it is the first MPI library on mpi4py's search path".to_string();
            choices.extend(
                candidates(search, &ANY_SONAMES)
                    .into_iter()
                    .map(|library| Choice {
                        library,
                        family: None,
                        reason: reason.clone(),
                    }),
            );
            Ok(choices)
        }
    }
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" and ")
}

pub fn second_library(loaded: &Path, requested: &str) -> Error {
    Error::library(
        STEP,
        format!(
            "{} is already loaded in this process, but {requested} was requested; two MPI libraries \
             in one process cannot work. Unset JAXMPI_MPI or make it name the loaded library \
             (or make mpi4py load the one you want, e.g. with MPI4PY_LIBMPI)",
            loaded.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_documented_value_and_refuses_others() {
        assert_eq!(Request::parse("").unwrap(), Request::Auto);
        assert_eq!(Request::parse("auto").unwrap(), Request::Auto);
        assert_eq!(
            Request::parse("openmpi").unwrap(),
            Request::Family(Family::OpenMpi)
        );
        assert_eq!(
            Request::parse("mpiabi").unwrap(),
            Request::Family(Family::MpiAbi)
        );
        assert_eq!(
            Request::parse("/opt/x/libmpi.so.12").unwrap(),
            Request::Path("/opt/x/libmpi.so.12".into())
        );
        assert_eq!(Request::parse(" linked ").unwrap(), Request::Linked);
        let err = Request::parse("intel").unwrap_err().to_string();
        assert!(
            err.contains("unknown value \"intel\"") && err.contains("auto, mpich, openmpi, mpiabi"),
            "{err}"
        );
    }

    #[test]
    fn an_already_loaded_library_wins_and_a_different_path_is_refused() {
        let loaded = vec![PathBuf::from("/venv/lib/libmpi.so.12")];
        let search = SearchPath::default();
        let auto = choose(&Request::Auto, &search, &loaded).unwrap();
        assert_eq!(auto[0].library, loaded[0]);
        let family = choose(&Request::Family(Family::OpenMpi), &search, &loaded).unwrap();
        assert_eq!((family.len(), family[0].family), (1, Some(Family::OpenMpi)));
        let err = choose(
            &Request::Path("/usr/lib/libmpi.so.40".into()),
            &search,
            &loaded,
        )
        .unwrap_err();
        assert!(
            err.message
                .contains("/venv/lib/libmpi.so.12 is already loaded"),
            "{err}"
        );
        assert!(
            err.message.contains("/usr/lib/libmpi.so.40 was requested"),
            "{err}"
        );
        let two = [loaded[0].clone(), PathBuf::from("/usr/lib/libmpi.so.40")];
        assert!(choose(&Request::Auto, &search, &two)
            .unwrap_err()
            .message
            .contains("two MPI libraries"));
    }

    #[test]
    #[cfg(not(feature = "linked"))]
    fn linked_in_a_build_without_the_feature_says_how_to_get_it() {
        let err = choose(&Request::Linked, &SearchPath::default(), &[]).unwrap_err();
        assert_eq!(err.op, "JAXMPI_MPI");
        for part in [
            "built without the `linked` feature",
            "--features linked",
            "JAXMPI_MPI=auto",
        ] {
            assert!(err.message.contains(part), "{err}");
        }
    }

    #[test]
    fn a_missing_path_is_named() {
        let err = choose(
            &Request::Path("/nope/libmpi.so".into()),
            &SearchPath::default(),
            &[],
        )
        .unwrap_err();
        assert!(
            err.message.contains("/nope/libmpi.so does not exist"),
            "{err}"
        );
    }

    #[test]
    fn the_standard_abi_is_found_under_mpich_5_0_1s_name_too_and_says_so() {
        let dir = std::env::temp_dir().join(format!("jaxmpi-abi-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        std::fs::write(dir.join("lib/libmpi_abi.so.0"), b"").unwrap();
        let search = SearchPath {
            prefixes: vec![dir.clone()],
        };
        let choices = choose(&Request::Family(Family::MpiAbi), &search, &[]).unwrap();
        assert_eq!(choices[0].library, dir.join("lib/libmpi_abi.so.0"));
        assert!(
            choices[0]
                .reason
                .starts_with("JAXMPI_MPI=mpiabi (no libmpi_abi.so.1 before it")
                && choices[0].reason.contains("MPICH 5.0.0 and 5.0.1"),
            "{}",
            choices[0].reason
        );
        let bare: Vec<_> = choices[1..].iter().map(|c| c.library.clone()).collect();
        assert_eq!(
            bare,
            ["libmpi_abi.so.1", "libmpi_abi.so.0", "libmpi_abi.so"].map(PathBuf::from)
        );
        assert_eq!(choices[1].reason, "JAXMPI_MPI=mpiabi");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn prefixes_are_searched_before_the_system_path() {
        let dir = std::env::temp_dir().join(format!("jaxmpi-detect-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        std::fs::write(dir.join("lib/libmpi.so.40"), b"").unwrap();
        let search = SearchPath {
            prefixes: vec![dir.clone()],
        };
        let choices = choose(&Request::Family(Family::OpenMpi), &search, &[]).unwrap();
        let libraries: Vec<_> = choices.iter().map(|c| c.library.clone()).collect();
        assert_eq!(
            libraries,
            vec![dir.join("lib/libmpi.so.40"), PathBuf::from("libmpi.so.40")]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
