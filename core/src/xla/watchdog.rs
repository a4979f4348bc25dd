//! `JAXMPI_TIMEOUT`: a thread that notices a call blocked longer than the timeout, says on
//! this rank's stderr which call and since when, and ends the whole job through MPI_Abort,
//! so that mpirun tears every rank down instead of letting the job hang until its
//! allocation runs out.
//!
//! MPI_Abort needs the launcher's daemons to reach every host. When a host is cut off it
//! never returns (Open MPI 5: the job then hangs until killed from outside; MPICH's rank
//! on the cut host likewise), so after `ABORT_GRACE` the watchdog ends its own process.

use std::time::Duration;

use super::monitor::Monitor;
use crate::Library;

/// The exit code the job ends with (EX_SOFTWARE).
pub const TIMEOUT_EXIT_CODE: i32 = 70;

/// How long MPI_Abort gets to end the job before the process ends itself. Where the
/// launcher can reach every host, MPI_Abort kills the job within about a second
/// (measured: 0-2 s across hosts, shared/facts/multihost.md); 5 s leaves room for a loaded
/// machine and stays small next to any sensible JAXMPI_TIMEOUT. Exiting early would do no
/// harm either: a rank that exits without MPI_Finalize makes every launcher end the job.
const ABORT_GRACE: Duration = Duration::from_secs(5);

/// How long the report gets to reach the launcher before MPI_Abort.
const REPORT_FORWARDING: Duration = Duration::from_millis(200);

extern "C" {
    /// POSIX `_exit` (every libc has it): ends the process at once, running nothing.
    fn _exit(status: i32) -> !;
}

/// Starts the watchdog over the calls `monitor` keeps in flight.
pub(crate) fn start(monitor: &'static Monitor, library: &'static dyn Library, timeout: Duration) {
    // Checking ten times per timeout bounds the overshoot to a tenth of it.
    let tick = (timeout / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let spawned = std::thread::Builder::new()
        .name("jaxmpi-watchdog".into())
        .spawn(move || loop {
            std::thread::sleep(tick);
            if let Some((call, waited)) = monitor.stuck(timeout) {
                report_and_abort(monitor, library, &call, waited, timeout);
            }
        });
    if let Err(err) = spawned {
        eprintln!("jaxmpi: JAXMPI_TIMEOUT is set but the watchdog thread cannot start: {err}");
    }
}

/// Says which call waits and since when, then ends the job (see the module's comment).
pub(crate) fn report_and_abort(
    monitor: &Monitor,
    library: &dyn Library,
    call: &str,
    waited: Duration,
    timeout: Duration,
) -> ! {
    let rank = monitor.rank;
    let mut report = format!(
        "jaxmpi: rank {rank}: {call} has been waiting {:.1} s, longer than \
         JAXMPI_TIMEOUT={} s. The ranks it waits for probably never make the matching call \
         (or died). Aborting the job.\n",
        waited.as_secs_f64(),
        timeout.as_secs_f64()
    );
    if monitor.debug {
        let history = monitor.history();
        report += &format!("jaxmpi: rank {rank}: the last {} calls:\n", history.len());
        for line in history {
            report += &format!("  {line}\n");
        }
    } else {
        report += &format!("jaxmpi: rank {rank}: set JAXMPI_DEBUG=1 to see the last calls.\n");
    }
    eprint!("{report}");
    // The launcher forwards each rank's stderr through a pipe; MPI_Abort makes it tear the
    // job down, and a report still in the pipe can be lost (seen once under load on MPICH).
    std::thread::sleep(REPORT_FORWARDING);
    let spawned = std::thread::Builder::new()
        .name("jaxmpi-abort-grace".into())
        .spawn(move || {
            std::thread::sleep(ABORT_GRACE);
            exit_now(rank)
        });
    if spawned.is_err() {
        exit_now(rank); // no thread for the grace period: better a certain end than a hang
    }
    library.abort(TIMEOUT_EXIT_CODE)
}

/// Ends this process with TIMEOUT_EXIT_CODE when MPI_Abort did not end the job.
fn exit_now(rank: i32) -> ! {
    eprintln!(
        "jaxmpi: rank {rank}: MPI_Abort did not end the job within {} s (a host \
         unreachable?); exiting with status {TIMEOUT_EXIT_CODE}.",
        ABORT_GRACE.as_secs()
    );
    // Not std::process::exit: it runs C atexit handlers and static destructors (MPI's,
    // XLA's) while other threads are stuck inside MPI holding its locks, where they can
    // deadlock or crash; and it would not end the process any sooner. _exit runs nothing:
    // the report is already out (stderr is unbuffered) and the kernel releases the rest.
    // SAFETY: _exit takes an int and never returns; it is async-signal-safe.
    unsafe { _exit(TIMEOUT_EXIT_CODE) }
}
