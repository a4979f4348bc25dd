//! jaxmpi-probe: checks every `Backend` operation against one real MPI library.
//!
//! CI runs it under each MPI build's own launcher at 1, 2 and 3 ranks:
//!
//!     mpiexec -n 3 jaxmpi-probe [--expect-family NAME] [--preload PATH]
//!                               [--expect-error SUBSTRING] [--large] [--trace]
//!     mpiexec -n 2 jaxmpi-probe --oracle     (built with --features linked)
//!
//! The library is selected exactly as the Python package selects it (`JAXMPI_MPI` and the
//! environment), every result is compared with values computed locally, each failing
//! check prints one `rank R: FAIL ...` line, and rank 0 ends with one `PROBE OK` or
//! `PROBE FAIL` summary line. The exit code is 0 or 1, the same on every rank.

mod array;
mod comms;
mod data;
mod known;
mod large;
mod memory;
mod movement;
#[cfg(feature = "linked")]
mod oracle;
mod p2p;
mod reductions;
mod report;
mod vector;
mod verdicts;

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::exit;
use std::time::Instant;

use jaxmpi_backends::mpi::one_line;
use jaxmpi_core::{Dtype, Input, ReduceOp};

use array::{Array, Value};
use report::{Group, Probe};

/// Element counts: empty, single, and odd sizes that fit no power-of-two chunking.
pub const SIZES: [usize; 4] = [0, 1, 7, 1001];

/// A few MiB, for the ops whose libraries switch protocols with message size.
pub const BIG: usize = 1 << 20;
/// The dtypes for ops other than allreduce, bcast and sendrecv (which take all 15): one
/// of each width and kind, and both 16-bit floats.
pub const SOME_DTYPES: [Dtype; 9] = [
    Dtype::Bool,
    Dtype::I8,
    Dtype::I32,
    Dtype::U64,
    Dtype::F16,
    Dtype::BF16,
    Dtype::F32,
    Dtype::F64,
    Dtype::C128,
];

/// (index, dtype, count) for each test of a dtype sweep: every dtype at 1001 elements and
/// at one of the smaller sizes in turn. Every dtype and every size is covered without
/// running every combination, because when ranks outnumber cores each call costs a few
/// scheduler time slices. The index lets callers cycle roots the same way.
pub fn cases(dtypes: &[Dtype]) -> impl Iterator<Item = (usize, Dtype, usize)> + '_ {
    let (small, largest) = (&SIZES[..3], SIZES[3]);
    dtypes.iter().enumerate().flat_map(move |(k, &dtype)| {
        [
            (2 * k, dtype, largest),
            (2 * k + 1, dtype, small[k % small.len()]),
        ]
    })
}

const USAGE: &str = "usage: jaxmpi-probe [--expect-family mpich|openmpi|mpiabi] [--preload PATH] \
                     [--expect-error SUBSTRING] [--large] [--trace] | --oracle [--trace]";

#[derive(Debug, Default)]
struct Args {
    expect_family: Option<String>,
    preload: Option<PathBuf>,
    expect_error: Option<String>,
    large: bool,
    trace: bool,
    oracle: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args::default();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--expect-family" => parsed.expect_family = Some(value()?),
            "--preload" => parsed.preload = Some(PathBuf::from(value()?)),
            "--expect-error" => parsed.expect_error = Some(value()?),
            "--large" => parsed.large = true,
            "--trace" => parsed.trace = true,
            "--oracle" => parsed.oracle = true,
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    Ok(parsed)
}

/// Loads `path` the way Python loads mpi4py's extension (RTLD_LOCAL), so selection must
/// find the library through the loaded-objects walk rather than the global namespace.
fn preload(path: &Path) -> Result<(), String> {
    let name = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen runs the library's initializers, as Python importing mpi4py would.
    // The handle is never closed: the library must stay loaded for the whole process.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if !handle.is_null() {
        return Ok(());
    }
    // SAFETY: dlerror returns null or a string valid until the next dl* call.
    let why = unsafe { libc::dlerror() };
    Err(if why.is_null() {
        format!("dlopen({}) failed", path.display())
    } else {
        // SAFETY: non-null, NUL-terminated, and no dl* call intervenes.
        unsafe { CStr::from_ptr(why) }
            .to_string_lossy()
            .into_owned()
    })
}

/// Which path counts above 2^31-1 take: the backend uses the MPI-4 `_c` functions when the
/// library exports all it needs, derived datatypes otherwise.
fn large_count_path(library: &Path) -> &'static str {
    const NEEDED: [&CStr; 13] = [
        c"MPI_Bcast_c",
        c"MPI_Gather_c",
        c"MPI_Allgather_c",
        c"MPI_Scatter_c",
        c"MPI_Alltoall_c",
        c"MPI_Gatherv_c",
        c"MPI_Allgatherv_c",
        c"MPI_Scatterv_c",
        c"MPI_Alltoallv_c",
        c"MPI_Send_c",
        c"MPI_Recv_c",
        c"MPI_Sendrecv_c",
        c"MPI_Sendrecv_replace_c",
    ];
    let Ok(name) = CString::new(library.as_os_str().as_bytes()) else {
        return "unknown";
    };
    // SAFETY: RTLD_NOLOAD only returns the already loaded library (or null) and runs no
    // initializers; the reference it takes is released right after the lookups.
    unsafe {
        let handle = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return "unknown";
        }
        let all = NEEDED
            .iter()
            .all(|f| !libc::dlsym(handle, f.as_ptr()).is_null());
        libc::dlclose(handle);
        if all {
            "mpi4-c-functions"
        } else {
            "derived-datatypes"
        }
    }
}

/// The text of an error, quoted and escaped so it stays on one line.
fn quoted(text: &str) -> String {
    format!("{text:?}")
}

fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(why) => {
            eprintln!("jaxmpi-probe: {why}\n{USAGE}");
            exit(2);
        }
    };
    if args.oracle {
        #[cfg(feature = "linked")]
        exit(oracle::oracle(args.trace));
        #[cfg(not(feature = "linked"))]
        {
            eprintln!("jaxmpi-probe: --oracle needs a probe built with `--features linked`");
            exit(2);
        }
    }
    if let Some(path) = &args.preload {
        if let Err(why) = preload(path) {
            println!("PROBE FAIL rank=? error={}", quoted(&why));
            exit(1);
        }
    }
    let library = match jaxmpi_backends::select() {
        Ok(library) => library,
        Err(err) => exit(selection_failed(&args, &err.to_string())),
    };
    let started = Instant::now();
    let mut p = Probe::new(library, -1, args.trace);
    let Some(world) = comms::world(&mut p) else {
        exit(selection_failed(
            &args,
            "the world communicator has no rank or size",
        ));
    };
    p.rank = world.rank;
    if let Some(wanted) = &args.expect_error {
        p.fail(
            "selection",
            format!("an error containing {}", quoted(wanted)),
            format!("success with {}", library.info().path.display()),
        );
    } else {
        check_selection(&mut p, &args);
        run(&mut p, &world, args.large);
    }
    let code = summary(&mut p, &world, started);
    if let Err(err) = library.finalize() {
        println!("rank {}: FAIL finalize: {err}", world.rank);
        exit(1);
    }
    exit(code);
}

/// Reports a failed selection (there is no rank yet); returns the exit code.
fn selection_failed(args: &Args, error: &str) -> i32 {
    match &args.expect_error {
        Some(wanted) if error.contains(wanted.as_str()) => {
            println!(
                "PROBE OK expected-error={} error={}",
                quoted(wanted),
                quoted(error)
            );
            0
        }
        Some(wanted) => {
            println!(
                "PROBE FAIL rank=? expected-error={} error={}",
                quoted(wanted),
                quoted(error)
            );
            1
        }
        None => {
            println!("PROBE FAIL rank=? error={}", quoted(error));
            1
        }
    }
}

/// The library chosen must be the family CI asked for, and the one already loaded.
fn check_selection(p: &mut Probe, args: &Args) {
    let info = p.library.info();
    if let Some(family) = &args.expect_family {
        p.check("MPI family", family.as_str(), info.family.name());
    }
    if let Some(path) = &args.preload {
        let preloaded = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        p.check("library after --preload", &preloaded, &info.path);
    }
}

fn run(p: &mut Probe, world: &Group, large: bool) {
    comms::world_checks(p, world);
    reductions::full(p, world);
    movement::full(p, world);
    vector::full(p, world);
    p2p::full(p, world);
    memory::run(p, world);
    verdicts::agreement(p, world);
    verdicts::unusable_gpu(p, world);
    comms::derived(p, world, |p, g| {
        p.ok(&format!("barrier on {}", g.name), p.backend.barrier(g.comm));
        verdicts::agreement(p, g);
        reductions::subset(p, g);
        movement::subset(p, g);
        vector::subset(p, g);
        p2p::subset(p, g);
    });
    comms::bad_input(p, world);
    // The world communicator returns errors too: the backend initialized MPI and set
    // MPI_ERRORS_RETURN there, as mpi4py does.
    if p.library.initialized_here() {
        p2p::library_errors(p, world);
    }
    if large {
        large::run(p, world);
    }
}

/// Totals failures and checks over all ranks; rank 0 prints the one summary line. Returns
/// the exit code, which every rank agrees on.
fn summary(p: &mut Probe, world: &Group, started: Instant) -> i32 {
    let counts = [p.failures, p.checks].map(|n| Value::Int(n.into()));
    let mine = Array::from_fn(Dtype::U64, 2, |i| counts[i]);
    let mut total = Array::zeroed(Dtype::U64, 2);
    let b = p.backend;
    let result = b.allreduce(
        world.comm,
        Input::Data(mine.buf()),
        total.buf_mut(),
        ReduceOp::Sum,
    );
    if let Err(err) = result {
        println!("rank {}: FAIL totalling the results: {err}", world.rank);
        return 1;
    }
    let (Value::Int(failed), Value::Int(checks)) = (total.get(0), total.get(1)) else {
        unreachable!("uint64 elements decode as integers");
    };
    if world.rank == 0 {
        let info = p.library.info();
        // Rank 0's list: every rank runs the same reductions, so it sees the same bugs.
        let known = match p.known_bugs.join(",") {
            none if none.is_empty() => none,
            bugs => format!(" known_bugs={bugs}"),
        };
        let verdict = if failed == 0 {
            "PROBE OK".to_string()
        } else {
            format!("PROBE FAIL failed={failed}")
        };
        println!(
            "{verdict} ranks={} family={} checks={checks} library={} version={} thread={} \
             large_count={} mpi={}.{} seconds={:.2} chosen_by={}{known}",
            world.size,
            info.family,
            info.path.display(),
            quoted(&one_line(&info.version_string)),
            p.library.thread_level().name(),
            large_count_path(&info.path),
            info.standard_version.0,
            info.standard_version.1,
            started.elapsed().as_secs_f64(),
            quoted(&info.chosen_by),
        );
    }
    i32::from(failed != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn flags_parse_and_unknown_ones_are_refused() {
        let args = parse(&["--expect-family", "mpich", "--large", "--preload", "/x.so"]).unwrap();
        assert_eq!(args.expect_family.as_deref(), Some("mpich"));
        assert_eq!(args.preload, Some(PathBuf::from("/x.so")));
        assert!(args.large && args.expect_error.is_none());
        assert!(parse(&["--expect-error"])
            .unwrap_err()
            .contains("needs a value"));
        assert!(parse(&["--bogus"])
            .unwrap_err()
            .contains("unknown argument"));
    }
}
