//! The progress agent: a thread of jaxmpi's that completes requests while the program
//! computes.
//!
//! MPI moves a message only inside MPI calls (on one node, the copy happens in whichever
//! call of the receiver notices it): without help, a transfer started before the interior
//! of a stencil step would still be waiting at its wait. The agent tests the requests in
//! flight (`flights.rs`) while the program computes, and completes the future of a wait
//! that XLA is already waiting on, so the program's other work goes on meanwhile. With
//! nothing in flight it sleeps on a condition variable: it costs nothing.
//!
//! It needs MPI_THREAD_MULTIPLE (it calls MPI beside the ops). Below that, or with
//! `JAXMPI_PROGRESS=none`, there is no agent and a wait blocks in MPI_Wait: the same
//! results, with transfers advancing only inside MPI calls (or MPI's own progress thread,
//! e.g. MPICH's `MPIR_CVAR_ASYNC_PROGRESS=1`). Whether it runs is `progress.rs`'s call.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::flights::{finish, table, Entry, Table, WAKE};
use super::progress::progress_mode;
use crate::xla::frame::Deferred;
use crate::xla::handlers::services::call_info::with_rank;
use crate::xla::handlers::services::{lifecycle, pending};
use crate::xla::{monitor, watchdog};
use crate::{Backend, Library, Progress};

/// The agent's thread, if it runs (decided at the first start).
static AGENT: OnceLock<Option<Mutex<Option<JoinHandle<()>>>>> = OnceLock::new();

/// Whether the agent runs; the first call (a start's) starts it where `progress_mode`
/// says "thread".
pub(super) fn agent_running(library: &'static dyn Library) -> bool {
    let agent = AGENT.get_or_init(|| {
        if progress_mode(library).0 != "thread" {
            return None;
        }
        let spawned = std::thread::Builder::new()
            .name("jaxmpi-progress".into())
            .spawn(move || progress_loop(library));
        match spawned {
            Ok(handle) => Some(Mutex::new(Some(handle))),
            Err(err) => {
                eprintln!("jaxmpi: no progress thread ({err}): waits will block in MPI_Wait");
                None
            }
        }
    });
    agent.is_some()
}

/// The agent's thread, for exit to join (None where none runs, or exit took it already).
pub(super) fn take_thread() -> Option<JoinHandle<()>> {
    AGENT
        .get()
        .and_then(|agent| agent.as_ref())
        .and_then(|agent| agent.lock().ok()?.take())
}

/// How long the agent sleeps between tests while requests are in flight and no wait waits
/// yet: the program computes meanwhile, and a large message moves a piece per test (MPI's
/// shared-memory cells, or its pipelined copies), so the tests must come often; each
/// costs ~1 us, ~5% of a core at this interval. While a wait waits, the agent tests
/// without sleeping (yielding its core between tests), as MPI_Wait itself would.
const POLL: Duration = Duration::from_micros(20);

extern "C" {
    /// Linux `prctl` (every libc has it).
    fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
}

/// Lets the agent's sleeps last what they ask: Linux stretches a thread's timed sleeps by
/// its timer slack (50 us by default), which would quadruple `POLL`.
fn tight_sleeps() {
    const PR_SET_TIMERSLACK: i32 = 29;
    // SAFETY: PR_SET_TIMERSLACK takes a number of nanoseconds and changes only the calling
    // thread's timer slack; no pointer is passed.
    unsafe { prctl(PR_SET_TIMERSLACK, 1_000, 0, 0, 0) };
}

/// A request done, its wait's future, and when that wait began.
type Completion = (Entry, Deferred, Instant);

fn completer(library: &'static dyn Library) -> Option<(Sender<Completion>, JoinHandle<()>)> {
    let (sender, completions) = channel::<Completion>();
    let spawned = std::thread::Builder::new()
        .name("jaxmpi-complete".into())
        .spawn(move || {
            for (entry, deferred, since) in completions {
                complete(library, entry, deferred, since);
            }
        });
    spawned.ok().map(|handle| (sender, handle))
}

fn progress_loop(library: &'static dyn Library) {
    let backend = library.backend();
    let completer = completer(library);
    tight_sleeps();
    loop {
        let mut table = table();
        while !table.closed && table.entries.iter().all(|(_, e)| e.outcome.is_some()) {
            table = WAKE.wait(table).unwrap_or_else(|p| p.into_inner());
        }
        if table.closed {
            drop(table);
            if let Some((sender, handle)) = completer {
                drop(sender);
                let _ = handle.join();
            }
            return;
        }
        let (done, waited) = test_all(&mut table, backend);
        drop(table);
        for (entry, deferred, since) in done {
            match &completer {
                Some((sender, _)) => {
                    if let Err(unsent) = sender.send((entry, deferred, since)) {
                        let (entry, deferred, since) = unsent.0;
                        complete(library, entry, deferred, since);
                    }
                }
                None => complete(library, entry, deferred, since),
            }
        }
        check_timeouts(library);
        if waited {
            std::thread::yield_now();
            continue;
        }
        // A start or a new wait (WAKE) ends the pause early.
        let guard = self::table();
        let _ = WAKE.wait_timeout(guard, POLL);
    }
}

/// Tests every request still in flight; returns the ones done whose wait is waiting, and
/// whether any wait is still waiting.
fn test_all(table: &mut Table, backend: &dyn Backend) -> (Vec<Completion>, bool) {
    let mut finished = Vec::new();
    for (key, entry) in &mut table.entries {
        if entry.outcome.is_some() {
            continue;
        }
        if entry.test(backend) && entry.waiter.is_some() {
            finished.push(*key);
        }
    }
    let mut done = Vec::new();
    for key in finished {
        if let Some(index) = table.entries.iter().position(|(k, _)| *k == key) {
            let (_, mut entry) = table.entries.swap_remove(index);
            if let Some((deferred, since)) = entry.waiter.take() {
                done.push((entry, deferred, since));
            }
        }
    }
    let waited = table.entries.iter().any(|(_, e)| e.waiter.is_some());
    (done, waited)
}

/// Completes a wait's future. A failure of a send's wait reaches nobody through a result
/// (the wait's result is unused), so it is kept for Python as other result-less failures.
fn complete(library: &dyn Library, mut entry: Entry, deferred: Deferred, since: Instant) {
    let outcome = entry.outcome.take().unwrap_or(Ok(Progress::Pending));
    let result = finish(&entry.flight, outcome, library.backend(), Some(since))
        .map_err(|err| with_rank(err.in_op("wait"), library));
    // Only a wait with results has a reader its failure reaches.
    let result = pending::keep(result, entry.flight.results > 0);
    deferred.finish(result);
}

/// A wait waiting longer than `JAXMPI_TIMEOUT` ends the job, as a blocked call does.
fn check_timeouts(library: &dyn Library) {
    static TIMEOUT: OnceLock<Option<Duration>> = OnceLock::new();
    let Some(timeout) = *TIMEOUT.get_or_init(monitor::timeout_from_env) else {
        return;
    };
    let table = table();
    let stuck = table.entries.iter().find_map(|(_, e)| {
        let (_, since) = e.waiter.as_ref()?;
        (since.elapsed() > timeout).then(|| (e.flight.what(), since.elapsed()))
    });
    drop(table);
    if let (Some((what, waited)), Some(monitor)) = (stuck, lifecycle::monitor()) {
        let call = format!("wait for {what}");
        watchdog::report_and_abort(monitor, library, &call, waited, timeout);
    }
}
