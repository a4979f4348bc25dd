//! `JAXMPI_TIMEOUT`: a thread that notices a call blocked longer than the timeout, says on
//! this rank's stderr which call and since when, and ends the whole job through MPI_Abort,
//! so that mpirun tears every rank down instead of letting the job hang until its
//! allocation runs out.

use std::time::Duration;

use super::monitor::Monitor;
use crate::Library;

/// The exit code the job ends with (EX_SOFTWARE).
pub const TIMEOUT_EXIT_CODE: i32 = 70;

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

fn report_and_abort(
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
    library.abort(TIMEOUT_EXIT_CODE)
}
