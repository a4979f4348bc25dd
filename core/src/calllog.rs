//! The life of one handler call around its op body, the same for every op: MPI errors made
//! to return on the call's communicator, and what jaxmpi tracks about calls in flight —
//! a line per call (`JAXMPI_DEBUG=1`), a watchdog that ends a job stuck in one call
//! (`JAXMPI_TIMEOUT=seconds`, see `watchdog.rs`), and the refusal of concurrent calls when
//! MPI was initialized below MPI_THREAD_MULTIPLE.
//!
//! Which of these are on is decided once per process; with none of them a call pays one
//! atomic load for the tracking.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::handlers::{Call, PEER_ANY, PEER_NULL, TAG_ANY};
use crate::xla_ffi::CallFrame;
use crate::{watchdog, Error, Library, Result, ThreadLevel};

/// Attributes that say whom a call talks to, in the order they are shown.
const DESCRIBED: [&str; 6] = ["root", "dest", "source", "tag", "sendtag", "recvtag"];
/// Calls remembered for the watchdog's report under JAXMPI_DEBUG.
const HISTORY: usize = 16;

/// One call as a user would name it: its communicator, peers or root, tags and size.
pub struct CallInfo {
    pub op: &'static str,
    comm: usize,
    attrs: [Option<i64>; DESCRIBED.len()],
    bytes: usize,
}

impl CallInfo {
    pub fn of(call: &Call) -> Self {
        CallInfo {
            op: call.op(),
            comm: call.address("comm").unwrap_or(0),
            attrs: DESCRIBED.map(|name| call.optional_i64(name)),
            bytes: call.operand_bytes(),
        }
    }
}

impl fmt::Display for CallInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "comm {:#x}", self.comm)?;
        for (name, value) in DESCRIBED.iter().zip(self.attrs) {
            let Some(value) = value else { continue };
            let is_tag = name.ends_with("tag");
            match value {
                v if is_tag && v == i64::from(TAG_ANY) => write!(f, ", {name} ANY_TAG")?,
                v if !is_tag && v == i64::from(PEER_ANY) => write!(f, ", {name} ANY_SOURCE")?,
                v if !is_tag && v == i64::from(PEER_NULL) => write!(f, ", {name} PROC_NULL")?,
                v => write!(f, ", {name} {v}")?,
            }
        }
        write!(f, ", {} bytes", self.bytes)
    }
}

/// Runs `body`, the op of `call` (read from `frame`), with everything every call needs
/// around it.
///
/// # Safety
/// `frame` must be the call frame `call` was made from, valid until this returns.
pub unsafe fn run(
    frame: *mut CallFrame,
    call: &Call,
    backend: &'static dyn Library,
    body: impl FnOnce() -> Result<()>,
) -> Result<()> {
    // A communicator whose handler would abort (the user's choice, or MPI's default where
    // nobody changed it) returns errors for the duration of this call only. The check and
    // the swap are MPI calls too, so they run inside the monitored part: below
    // MPI_THREAD_MULTIPLE they must not overlap another thread's call either.
    let comm = call.comm()?;
    let with_errors_returned = || {
        let previous = backend.return_errors_on(comm)?;
        let result = body();
        if let Some(handler) = previous {
            backend.restore_errhandler(comm, handler);
        }
        result
    };
    match MONITOR.get_or_init(|| Monitor::from_env(backend)) {
        None => with_errors_returned(),
        Some(monitor) => monitor.run(frame, call, with_errors_returned),
    }
}

/// The process's settings and the calls in flight; absent when nothing is tracked.
static MONITOR: OnceLock<Option<Monitor>> = OnceLock::new();

pub(crate) struct Monitor {
    pub(crate) rank: i32,
    pub(crate) debug: bool,
    /// Set below MPI_THREAD_MULTIPLE: concurrent calls are refused.
    exclusive: Option<ThreadLevel>,
    busy: AtomicUsize,
    next_id: AtomicU64,
    /// Only kept under JAXMPI_TIMEOUT.
    in_flight: Option<Mutex<Vec<InFlight>>>,
    /// Only kept under JAXMPI_DEBUG.
    history: Mutex<VecDeque<String>>,
}

/// A call in flight. It is described only when the watchdog reports it: describing every
/// call would cost more than the rest of the tracking together.
pub(crate) struct InFlight {
    frame: FramePtr,
    op: &'static str,
    since: Instant,
    id: u64,
}

struct FramePtr(*mut CallFrame);

// SAFETY: the watchdog reads the frame only while holding the list's lock with the entry
// still listed, and the entry is removed (under that lock) before the handler returns the
// frame to XLA.
unsafe impl Send for FramePtr {}

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
    fn from_env(backend: &'static dyn Library) -> Option<Monitor> {
        let timeout = timeout_from_env();
        let debug = debug_from_env();
        let level = backend.thread_level();
        let exclusive = (level < ThreadLevel::Multiple).then_some(level);
        if timeout.is_none() && !debug && exclusive.is_none() {
            return None;
        }
        if let Some(timeout) = timeout {
            watchdog::start(&MONITOR, backend, timeout);
        }
        Some(Monitor {
            rank: backend.comm_rank(backend.world()).unwrap_or(-1),
            debug,
            exclusive,
            busy: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            in_flight: timeout.map(|_| Mutex::new(Vec::new())),
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
        })
    }

    fn run(
        &self,
        frame: *mut CallFrame,
        call: &Call,
        body: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let _exclusive = match self.exclusive {
            Some(level) => Some(Exclusive::enter(self, call, level)?),
            None => None,
        };
        let _watched = self.in_flight.as_ref().map(|calls| {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            Watched::register(calls, frame, call.op(), id)
        });
        let start = Instant::now();
        let result = body();
        if self.debug {
            let took = start.elapsed();
            let outcome = if result.is_ok() { "" } else { " FAILED" };
            let line = format!(
                "jaxmpi: rank {}: {} ({}) {:.1} us{outcome}",
                self.rank,
                call.op(),
                CallInfo::of(call),
                took.as_secs_f64() * 1e6
            );
            eprintln!("{line}");
            let mut history = lock(&self.history);
            if history.len() == HISTORY {
                history.pop_front();
            }
            history.push_back(line);
        }
        result
    }

    /// The call in flight longest, described, if it has waited more than `timeout`.
    pub(crate) fn stuck(&self, timeout: Duration) -> Option<(String, Duration)> {
        let calls = lock(self.in_flight.as_ref()?);
        let oldest = calls.iter().min_by_key(|c| c.since)?;
        let waited = oldest.since.elapsed();
        if waited <= timeout {
            return None;
        }
        // SAFETY: the entry is listed and the lock held, so its frame is alive (FramePtr).
        let what = match unsafe { Call::new(oldest.frame.0, oldest.op) } {
            Ok(call) => format!("{} ({})", oldest.op, CallInfo::of(&call)),
            Err(_) => oldest.op.to_string(),
        };
        Some((what, waited))
    }

    pub(crate) fn history(&self) -> Vec<String> {
        lock(&self.history).iter().cloned().collect()
    }
}

/// Holds the process's one permitted call in flight when MPI forbids concurrent calls.
struct Exclusive<'a>(&'a AtomicUsize);

impl<'a> Exclusive<'a> {
    fn enter(monitor: &'a Monitor, call: &Call, level: ThreadLevel) -> Result<Self> {
        if monitor.busy.fetch_add(1, Ordering::AcqRel) > 0 {
            monitor.busy.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::unsupported(
                call.op(),
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
    fn register(
        calls: &'a Mutex<Vec<InFlight>>,
        frame: *mut CallFrame,
        op: &'static str,
        id: u64,
    ) -> Self {
        let since = Instant::now();
        lock(calls).push(InFlight {
            frame: FramePtr(frame),
            op,
            since,
            id,
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_its_comm_peers_tags_and_bytes_as_mpi_does() {
        let mut attrs = [None; DESCRIBED.len()];
        attrs[2] = Some(i64::from(PEER_ANY)); // source
        attrs[3] = Some(i64::from(TAG_ANY)); // tag
        let info = CallInfo {
            op: "recv",
            comm: 0x4400_0000,
            attrs,
            bytes: 16,
        };
        assert_eq!(
            info.to_string(),
            "comm 0x44000000, source ANY_SOURCE, tag ANY_TAG, 16 bytes"
        );
        attrs = [
            Some(0),
            Some(i64::from(PEER_NULL)),
            None,
            Some(3),
            None,
            None,
        ];
        let info = CallInfo { attrs, ..info };
        assert_eq!(
            info.to_string(),
            "comm 0x44000000, root 0, dest PROC_NULL, tag 3, 16 bytes"
        );
    }
}
