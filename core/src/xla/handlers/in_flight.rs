//! Requests between their start (any started op: `nonblocking.rs`) and their `wait`, and
//! the progress agent that completes them meanwhile.
//!
//! MPI moves a message only inside MPI calls (on one node, the copy happens in whichever
//! call of the receiver notices it): without help, a transfer started before the interior
//! of a stencil step would still be waiting at its wait. The agent, a thread of jaxmpi's,
//! tests the requests in flight while the program computes, and completes the future of a
//! wait that XLA is already waiting on, so the program's other work goes on meanwhile.
//! With nothing in flight it sleeps on a condition variable: it costs nothing.
//!
//! It needs MPI_THREAD_MULTIPLE (it calls MPI beside the ops). Below that, or with
//! `JAXMPI_PROGRESS=none`, there is no agent and a wait blocks in MPI_Wait: the same
//! results, with transfers advancing only inside MPI calls (or MPI's own progress thread,
//! e.g. MPICH's `MPIR_CVAR_ASYNC_PROGRESS=1`).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::any::Any;

use super::ops;
use super::services::call_info::{with_rank, CallInfo};
use super::services::{lifecycle, pending};
use super::signature::Signature;
use crate::xla::frame::{Address, Deferred};
use crate::xla::{monitor, watchdog};
use crate::{
    Backend, BufMut, Dtype, Error, ErrorsReturned, Library, Progress, Request, Result, Status,
    ThreadLevel,
};

/// The buffer a started receive fills, for the whole-message check at completion.
pub(super) struct Receive {
    pub data: usize,
    pub count: usize,
    pub dtype: Dtype,
}

/// A started op's requests (one per MPI call it started) and what its wait needs to know.
pub(super) struct Flight {
    /// The requests not completed yet.
    pub requests: Vec<Request>,
    /// What MPI reads until they complete (a v-op's counts), dropped only with the flight.
    pub _keep: Vec<Box<dyn Any + Send>>,
    /// Which start, and its call (shown by `what`, only when needed).
    pub op: &'static str,
    pub call: CallInfo,
    /// Where its data lives: the wait must be handed the same buffer first (0: none).
    pub buffer: usize,
    /// An mpi4py Status to fill when a receive completes (0: none).
    pub status: Address,
    /// A receive's buffer.
    pub receive: Option<Receive>,
    /// How many results the op has on this rank: what its wait returns.
    pub results: usize,
    pub started: Instant,
    /// Errors of the request's communicator come back as codes until it completes.
    pub _errors: Option<ErrorsReturned<'static>>,
}

impl Flight {
    /// The request as a user would name it: "isend (comm 0x44000000, dest 1, tag 0, ...)".
    fn what(&self) -> String {
        format!("{} ({})", self.op, self.call)
    }
}

/// How a flight's requests came out, so far.
#[derive(Default)]
struct Outcome {
    /// What a receive reported.
    received: Option<Status>,
    /// The first failure.
    failed: Option<Error>,
}

impl Outcome {
    fn add(&mut self, progress: Result<Progress>) {
        match progress {
            Ok(Progress::Received(status)) => self.received = Some(status),
            Ok(_) => {}
            Err(err) => {
                self.failed.get_or_insert(err);
            }
        }
    }

    fn result(self) -> Result<Progress> {
        match (self.failed, self.received) {
            (Some(err), _) => Err(err),
            (None, Some(status)) => Ok(Progress::Received(status)),
            (None, None) => Ok(Progress::Sent),
        }
    }
}

/// Tests the requests still pending (a completed one, failed or not, leaves the list: it
/// must not be tested again); true once none is left.
fn test_requests(requests: &mut Vec<Request>, so_far: &mut Outcome, backend: &dyn Backend) -> bool {
    requests.retain_mut(|request| match backend.test(request) {
        Ok(Progress::Pending) => true,
        progress => {
            so_far.add(progress);
            false
        }
    });
    requests.is_empty()
}

struct Entry {
    flight: Flight,
    /// What its completed requests reported.
    so_far: Outcome,
    /// Set once every request completed (by a test of the agent's or of the wait's).
    outcome: Option<Result<Progress>>,
    /// The wait's future, once the wait runs while the request is still in flight.
    waiter: Option<(Deferred, Instant)>,
}

struct Table {
    next: u64,
    /// By key; a handful at a time, so a list.
    entries: Vec<(u64, Entry)>,
    /// Set at exit: the agent stops, no request may start.
    closed: bool,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    next: 1,
    entries: Vec::new(),
    closed: false,
});
/// Signalled when a request starts or a wait begins to wait, and at exit.
static WAKE: Condvar = Condvar::new();
/// The agent's thread, if it runs (decided at the first start).
static AGENT: OnceLock<Option<Mutex<Option<JoinHandle<()>>>>> = OnceLock::new();

fn table() -> MutexGuard<'static, Table> {
    // Every update of the table is a single insert, removal or field store.
    TABLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `JAXMPI_PROGRESS`: "thread" (the default where MPI allows it) or "none".
pub fn progress_requested() -> Option<String> {
    let value = std::env::var("JAXMPI_PROGRESS").ok()?;
    let value = value.trim().to_ascii_lowercase();
    (!value.is_empty()).then_some(value)
}

/// The CPU cores each rank of this node may use (set once at start-up by Python, which
/// knows the process's CPU set and the ranks sharing the node).
static CORES_PER_RANK: OnceLock<f64> = OnceLock::new();

pub fn set_cores_per_rank(cores: f64) {
    let _ = CORES_PER_RANK.set(cores);
}

/// Whether every rank of the job runs on this host (set once at start-up by Python, which
/// knows the ranks sharing the node).
static ONE_HOST: OnceLock<bool> = OnceLock::new();

pub fn set_one_host(one: bool) {
    let _ = ONE_HOST.set(one);
}

/// How started ops progress, and why: "thread" (jaxmpi's agent completes them while the
/// program computes), "none" (only MPI calls do: starts, waits, other ops), or "at-start"
/// (as "none", but a started collective completes at its start, as its blocking op).
///
/// By default the agent runs only where each rank has a core to spare for it: where ranks
/// fill the cores, its tests take time from the computation it should overlap (measured in
/// benches/RESULTS.md: slower than blocking waits on a 2-core machine at 2 ranks). Without
/// it, where every rank shares this host, nothing moves a collective's data while the
/// program computes (every core computes, and the copies need one), so a started
/// collective costs what its blocking op does plus its non-blocking algorithm's extra
/// steps: "at-start" makes it the blocking op (measured in benches/RESULTS.md, "Gradients
/// reduced during the backward pass"). Point to point starts non-blocking in every mode: a
/// blocking send at its start could wait for a receive its peer starts later.
pub fn progress_mode(library: &dyn Library) -> (&'static str, String) {
    let level = library.thread_level();
    let cores = CORES_PER_RANK.get().copied().unwrap_or(1.0);
    let one_host = ONE_HOST.get().copied().unwrap_or(false);
    let without_thread = |why: String| match one_host {
        true => (
            "at-start",
            format!(
                "{why}; every rank on this host: a started collective completes at its start, \
                 as its blocking op (JAXMPI_PROGRESS=none starts it non-blocking)"
            ),
        ),
        false => ("none", why),
    };
    match progress_requested().as_deref() {
        Some("none") => ("none", "JAXMPI_PROGRESS=none".into()),
        Some("at-start") => ("at-start", "JAXMPI_PROGRESS=at-start".into()),
        _ if level < ThreadLevel::Multiple => without_thread(format!(
            "MPI runs at {}: only MPI_THREAD_MULTIPLE allows a progress thread",
            level.name()
        )),
        Some("thread") => ("thread", "JAXMPI_PROGRESS=thread".into()),
        _ if cores < 2.0 => without_thread(format!(
            "{cores:.1} CPU cores per rank on this node: a progress thread would take time \
             from the rank's own computation (JAXMPI_PROGRESS=thread forces it)"
        )),
        _ => (
            "thread",
            format!("{cores:.1} CPU cores per rank on this node, MPI_THREAD_MULTIPLE"),
        ),
    }
}

/// Whether started collectives complete at their start: unset (decided by `progress_mode`
/// at the first start), no, yes.
static AT_START: AtomicU8 = AtomicU8::new(0);

/// Whether a started collective completes at its start (`progress_mode` "at-start").
pub(super) fn collectives_complete_at_start(library: &dyn Library) -> bool {
    match AT_START.load(Ordering::Relaxed) {
        0 => {
            let at_start = progress_mode(library).0 == "at-start";
            AT_START.store(1 + u8::from(at_start), Ordering::Relaxed);
            at_start
        }
        set => set == 2,
    }
}

/// Whether started collectives complete at their start now (`progress_mode` "at-start",
/// or as set), deciding it if nothing did yet.
pub fn collectives_at_start() -> Result<bool> {
    Ok(collectives_complete_at_start(crate::library()?))
}

/// Makes every later started collective complete at its start, or not, whatever the
/// progress mode says; `None`: as the progress mode says (every rank must do it alike; for
/// tests of both ways).
pub fn set_collectives_at_start(at_start: Option<bool>) {
    AT_START.store(at_start.map_or(0, |on| 1 + u8::from(on)), Ordering::Relaxed);
}

fn agent_running(library: &'static dyn Library) -> bool {
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

/// Registers a started request; its key is what the start's request result holds.
pub(super) fn start(library: &'static dyn Library, flight: Flight) -> Result<u64> {
    let running = agent_running(library);
    let mut table = table();
    if table.closed {
        return Err(Error::library(flight.op, "started after jaxmpi shut down"));
    }
    let key = table.next;
    table.next += 1;
    let entry = Entry {
        flight,
        so_far: Outcome::default(),
        outcome: None,
        waiter: None,
    };
    table.entries.push((key, entry));
    if running {
        WAKE.notify_all();
    }
    Ok(key)
}

/// The wait of the request `key`, handed `buffer`: done now if the request is, else later
/// through the future `defer` gives (a call's), else (no agent, no futures) blocking until
/// it is.
pub(super) fn wait(
    library: &'static dyn Library,
    key: u64,
    buffer: usize,
    defer: impl FnOnce() -> Option<Deferred>,
) -> Result<()> {
    let backend = library.backend();
    let mut table = table();
    let Some(index) = table.entries.iter().position(|(k, _)| *k == key) else {
        return Err(Error::invalid_argument(
            "request",
            format!(
                "request {key} is not in flight: it was waited for already, or started \
                 in another process"
            ),
        ));
    };
    let flight = &table.entries[index].1.flight;
    if flight.buffer != 0 && flight.buffer != buffer {
        return Err(Error::invalid_argument(
            "request",
            format!(
                "the wait of {} was handed another buffer than its start: the request \
                 value was copied or rebuilt; pass the Request object itself",
                flight.what()
            ),
        ));
    }
    // Out of the table the request is this wait's alone: it is tested without the lock,
    // so the agent and other threads' starts and waits go on meanwhile.
    let (_, mut entry) = table.entries.swap_remove(index);
    drop(table);
    // A message that is about to arrive (a small one, or one the agent has nearly moved)
    // costs less to wait for here than through a future and a wake-up of the agent.
    let spin = Instant::now();
    while entry.outcome.is_none() {
        if entry.test(backend) {
            break;
        }
        if spin.elapsed() > SPIN {
            break;
        }
    }
    if entry.outcome.is_none() && agent_running(library) {
        let mut table = self::table();
        if table.closed {
            // Exit came during the spin: what shut_down does to the requests it finds.
            drop(table);
            let _ = give_up(backend, entry.flight);
            return Err(shut_down_first());
        }
        if let Some(deferred) = defer() {
            entry.waiter = Some((deferred, Instant::now()));
            table.entries.push((key, entry));
            WAKE.notify_all();
            return Ok(());
        }
    }
    let outcome = match entry.outcome.take() {
        Some(outcome) => outcome,
        None => entry.wait(backend),
    };
    finish(&entry.flight, outcome, backend)
}

impl Entry {
    /// Tests the requests still pending; true once all have completed (`outcome` set).
    fn test(&mut self, backend: &dyn Backend) -> bool {
        if test_requests(&mut self.flight.requests, &mut self.so_far, backend) {
            self.outcome = Some(std::mem::take(&mut self.so_far).result());
        }
        self.outcome.is_some()
    }

    /// Blocks until every request has completed (MPI_Wait on each).
    fn wait(&mut self, backend: &dyn Backend) -> Result<Progress> {
        for mut request in self.flight.requests.drain(..) {
            self.so_far.add(backend.wait(&mut request));
        }
        std::mem::take(&mut self.so_far).result()
    }
}

/// Gives up a flight nobody will wait for: point to point, its requests are cancelled
/// (receives) and freed; a collective's cannot be (MPI forbids both), so its requests
/// are waited for, which every rank that started it as well does at its own exit. Says
/// what was done, or the first failure.
fn give_up(backend: &dyn Backend, mut flight: Flight) -> Result<&'static str> {
    let collective = Signature::named(flight.op).is_some_and(|(s, _)| s.is_collective());
    let mut first = Ok(if collective {
        "completed at exit"
    } else {
        "cancelled"
    });
    for mut request in flight.requests.drain(..) {
        let given_up = match collective {
            true => backend.wait(&mut request).map(|_| ()),
            false => backend.abandon(request),
        };
        if let Err(err) = given_up {
            first = first.and(Err(err));
        }
    }
    first
}

/// The failure of a wait that exit overtook.
fn shut_down_first() -> Error {
    Error::library("wait", "jaxmpi shut down first")
}

/// What a completed request leaves: a receive's whole message checked (a short one, with
/// no status to read its count from, fails) and its status filled in; its debug line.
fn finish(flight: &Flight, outcome: Result<Progress>, backend: &dyn Backend) -> Result<()> {
    let outcome = match (outcome, &flight.receive) {
        (Ok(Progress::Received(status)), Some(receive)) => {
            // SAFETY: the receive buffer is alive until the wait completes (XLA keeps a
            // wait's operands until then; eagerly, the Request holds the array).
            let buffer =
                unsafe { BufMut::from_raw(receive.data as *mut u8, receive.count, receive.dtype) };
            ops::whole_message(buffer, &status, flight.status, backend)
                .map(|()| Progress::Received(status))
        }
        (outcome, _) => outcome,
    };
    if let Ok(Progress::Received(status)) = &outcome {
        ops::fill_status(flight.status, status);
    }
    if let Some(monitor) = lifecycle::monitor().filter(|m| m.debug) {
        let failed = if outcome.is_ok() { "" } else { " FAILED" };
        monitor.note(format!(
            "jaxmpi: rank {}: {} completed after {:.1} us{failed}",
            monitor.rank,
            flight.what(),
            flight.started.elapsed().as_secs_f64() * 1e6
        ));
    }
    outcome
        .map(|_| ())
        .map_err(|err| err.context(flight.what()))
}

/// How long a wait tests its request itself before handing it to the agent.
const SPIN: Duration = Duration::from_micros(200);

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

type Completion = (Entry, Deferred);

fn completer(library: &'static dyn Library) -> Option<(Sender<Completion>, JoinHandle<()>)> {
    let (sender, completions) = channel::<Completion>();
    let spawned = std::thread::Builder::new()
        .name("jaxmpi-complete".into())
        .spawn(move || {
            for (entry, deferred) in completions {
                complete(library, entry, deferred);
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
        for (entry, deferred) in done {
            match &completer {
                Some((sender, _)) => {
                    if let Err(unsent) = sender.send((entry, deferred)) {
                        let (entry, deferred) = unsent.0;
                        complete(library, entry, deferred);
                    }
                }
                None => complete(library, entry, deferred),
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
fn test_all(table: &mut Table, backend: &dyn Backend) -> (Vec<(Entry, Deferred)>, bool) {
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
            if let Some((deferred, _)) = entry.waiter.take() {
                done.push((entry, deferred));
            }
        }
    }
    let waited = table.entries.iter().any(|(_, e)| e.waiter.is_some());
    (done, waited)
}

/// Completes a wait's future. A failure of a send's wait reaches nobody through a result
/// (the wait's result is unused), so it is kept for Python as other result-less failures.
fn complete(library: &dyn Library, mut entry: Entry, deferred: Deferred) {
    let outcome = entry.outcome.take().unwrap_or(Ok(Progress::Pending));
    let result = finish(&entry.flight, outcome, library.backend())
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

/// At exit, before MPI_Finalize: stops the agent and gives up every request nobody waited
/// for (started outside jit and never waited); returns them, described, for a warning.
pub fn shut_down(library: &dyn Library) -> Vec<String> {
    let handle = AGENT
        .get()
        .and_then(|agent| agent.as_ref())
        .and_then(|agent| agent.lock().ok()?.take());
    table().closed = true;
    WAKE.notify_all();
    if let Some(handle) = handle {
        let _ = handle.join();
    }
    let entries: Vec<Entry> = table().entries.drain(..).map(|(_, e)| e).collect();
    let mut left = Vec::new();
    for mut entry in entries {
        if let Some((deferred, _)) = entry.waiter.take() {
            deferred.finish(Err(shut_down_first()));
        }
        let what = entry.flight.what();
        if entry.outcome.is_some() {
            left.push(format!("{what}: completed, never waited for"));
            continue;
        }
        match give_up(library.backend(), entry.flight) {
            Ok(done) => left.push(format!("{what}: never waited for; {done}")),
            Err(err) => left.push(format!(
                "{what}: never waited for; giving it up failed: {err}"
            )),
        }
    }
    left
}
