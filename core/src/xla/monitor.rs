//! The monitor of calls in flight: a line per call (`JAXMPI_DEBUG=1`), the list of calls
//! the watchdog inspects (`JAXMPI_TIMEOUT=seconds`, see `watchdog.rs`), and the refusal of
//! concurrent calls when MPI was initialized below MPI_THREAD_MULTIPLE.
//!
//! It knows nothing of handlers: a call is a name and a way to describe it, which only
//! runs when the call is shown (describing every call would cost more than the rest of
//! the tracking together).

use std::collections::VecDeque;
use std::ffi::c_void;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{Error, Result, ThreadLevel};

/// Calls remembered for the watchdog's report under JAXMPI_DEBUG.
const HISTORY: usize = 16;

/// One call as the monitor sees it.
#[derive(Clone, Copy)]
pub struct Tracked {
    pub name: &'static str,
    /// What `describe` reads; alive while the call runs.
    pub frame: *const c_void,
    /// "name (comm ..., bytes)": the call as a user would name it.
    ///
    /// # Safety
    /// Only called with `frame` while the call runs.
    pub describe: unsafe fn(*const c_void, &'static str) -> String,
}

// SAFETY: the watchdog reads the frame only while holding the list's lock with the entry
// still listed, and the entry is removed (under that lock) before the call returns.
unsafe impl Send for Tracked {}

/// The process's settings and the calls in flight.
pub struct Monitor {
    pub rank: i32,
    pub debug: bool,
    /// Set below MPI_THREAD_MULTIPLE: concurrent calls are refused.
    exclusive: Option<ThreadLevel>,
    busy: AtomicUsize,
    next_id: AtomicU64,
    /// Only kept under JAXMPI_TIMEOUT.
    in_flight: Option<Mutex<Vec<InFlight>>>,
    /// Only kept under JAXMPI_DEBUG.
    history: Mutex<VecDeque<String>>,
}

/// A call in flight, described only when the watchdog reports it.
struct InFlight {
    call: Tracked,
    since: Instant,
    id: u64,
}

/// `JAXMPI_TIMEOUT` in seconds; unset, empty or 0 is off. The Python package refuses other
/// values at import with a clear message; here they only turn the watchdog off.
pub fn timeout_from_env() -> Option<Duration> {
    let value = std::env::var("JAXMPI_TIMEOUT").ok()?;
    let seconds: f64 = value.trim().parse().ok()?;
    (seconds.is_finite() && seconds > 0.0).then(|| Duration::from_secs_f64(seconds))
}

pub fn debug_from_env() -> bool {
    std::env::var("JAXMPI_DEBUG").is_ok_and(|v| v.trim() == "1")
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Monitor {
    /// `watched`: keep the calls in flight for a watchdog.
    pub fn new(rank: i32, debug: bool, exclusive: Option<ThreadLevel>, watched: bool) -> Self {
        Monitor {
            rank,
            debug,
            exclusive,
            busy: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            in_flight: watched.then(|| Mutex::new(Vec::new())),
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
        }
    }

    /// Runs `body`, the whole of `call`, tracked.
    pub fn run(&self, call: Tracked, body: impl FnOnce() -> Result<()>) -> Result<()> {
        let _exclusive = match self.exclusive {
            Some(level) => Some(Exclusive::enter(self, call.name, level)?),
            None => None,
        };
        let _watched = self.in_flight.as_ref().map(|calls| {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            Watched::register(calls, call, id)
        });
        let start = Instant::now();
        let result = body();
        if self.debug {
            let took = start.elapsed();
            let outcome = if result.is_ok() { "" } else { " FAILED" };
            // SAFETY: the call is still running: its frame is alive.
            let what = unsafe { (call.describe)(call.frame, call.name) };
            self.note(format!(
                "jaxmpi: rank {}: {what} {:.1} us{outcome}",
                self.rank,
                took.as_secs_f64() * 1e6
            ));
        }
        result
    }

    /// Shows a debug line and keeps it for the watchdog's report.
    pub fn note(&self, line: String) {
        // Text and newline in one write: the ranks share the launcher's stderr, and
        // eprintln!'s two writes let another rank's line in between them.
        let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
        let mut history = lock(&self.history);
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(line);
    }

    /// The call in flight longest, described, if it has waited more than `timeout`.
    pub fn stuck(&self, timeout: Duration) -> Option<(String, Duration)> {
        let calls = lock(self.in_flight.as_ref()?);
        let oldest = calls.iter().min_by_key(|c| c.since)?;
        let waited = oldest.since.elapsed();
        if waited <= timeout {
            return None;
        }
        let call = oldest.call;
        // SAFETY: the entry is listed and the lock held, so its frame is alive (Tracked).
        Some((unsafe { (call.describe)(call.frame, call.name) }, waited))
    }

    pub fn history(&self) -> Vec<String> {
        lock(&self.history).iter().cloned().collect()
    }
}

/// Holds the process's one permitted call in flight when MPI forbids concurrent calls.
struct Exclusive<'a>(&'a AtomicUsize);

impl<'a> Exclusive<'a> {
    fn enter(monitor: &'a Monitor, name: &'static str, level: ThreadLevel) -> Result<Self> {
        if monitor.busy.fetch_add(1, Ordering::AcqRel) > 0 {
            monitor.busy.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::unsupported(
                name,
                format!(
                    "another thread is inside an MPI call at the same time, but MPI was \
                     initialized with {}, which forbids concurrent calls. Initialize MPI with \
                     MPI_THREAD_MULTIPLE (mpi4py's default: leave mpi4py.rc.thread_level \
                     alone or set it to \"multiple\"), or make one thread at a time call jaxmpi",
                    level.name()
                ),
            ));
        }
        Ok(Exclusive(&monitor.busy))
    }
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Keeps a call in the watchdog's list while it runs.
struct Watched<'a> {
    calls: &'a Mutex<Vec<InFlight>>,
    id: u64,
}

impl<'a> Watched<'a> {
    fn register(calls: &'a Mutex<Vec<InFlight>>, call: Tracked, id: u64) -> Self {
        let since = Instant::now();
        lock(calls).push(InFlight { call, since, id });
        Watched { calls, id }
    }
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        let mut calls = lock(self.calls);
        if let Some(i) = calls.iter().position(|c| c.id == self.id) {
            calls.swap_remove(i);
        }
    }
}
