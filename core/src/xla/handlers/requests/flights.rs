//! The requests in flight: one entry per started op (its requests, what its wait must
//! know, how they came out so far), in the one table that the starts, the waits
//! (`in_flight.rs`) and the progress agent (`agent.rs`) share, and what a request leaves
//! once complete (`finish`) or given up at exit (`give_up`).

use std::any::Any;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::xla::frame::{Address, Deferred};
use crate::xla::handlers::received::{fill_status, whole_message};
use crate::xla::handlers::services::call_info::CallInfo;
use crate::xla::handlers::services::lifecycle;
use crate::xla::handlers::signature::Signature;
use crate::xla::profile::{self, Begun, Fields, Kind, Route};
use crate::{Backend, BufMut, Dtype, Error, ErrorsReturned, Progress, Request, Result, Status};

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
    /// Its key in the table (set when it enters it): what the profile links its start,
    /// wait and completion by.
    pub key: u64,
    /// Errors of the request's communicator come back as codes until it completes.
    pub _errors: Option<ErrorsReturned<'static>>,
}

impl Flight {
    /// The request as a user would name it: "isend (comm 0x44000000, dest 1, tag 0, ...)".
    pub(super) fn what(&self) -> String {
        format!("{} ({})", self.op, self.call)
    }
}

/// How a flight's requests came out, so far.
#[derive(Default)]
pub(super) struct Outcome {
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

pub(super) struct Entry {
    pub(super) flight: Flight,
    /// What its completed requests reported.
    pub(super) so_far: Outcome,
    /// Set once every request completed (by a test of the agent's or of the wait's).
    pub(super) outcome: Option<Result<Progress>>,
    /// The wait's future, once the wait runs while the request is still in flight.
    pub(super) waiter: Option<(Deferred, Instant)>,
}

pub(super) struct Table {
    pub(super) next: u64,
    /// By key; a handful at a time, so a list.
    pub(super) entries: Vec<(u64, Entry)>,
    /// Set at exit: the agent stops, no request may start.
    pub(super) closed: bool,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    next: 1,
    entries: Vec::new(),
    closed: false,
});
/// Signalled when a request starts or a wait begins to wait, and at exit.
pub(super) static WAKE: Condvar = Condvar::new();

pub(super) fn table() -> MutexGuard<'static, Table> {
    // Every update of the table is a single insert, removal or field store.
    TABLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Entry {
    /// Tests the requests still pending; true once all have completed (`outcome` set).
    pub(super) fn test(&mut self, backend: &dyn Backend) -> bool {
        if test_requests(&mut self.flight.requests, &mut self.so_far, backend) {
            self.outcome = Some(std::mem::take(&mut self.so_far).result());
        }
        self.outcome.is_some()
    }

    /// Blocks until every request has completed (MPI_Wait on each).
    pub(super) fn wait(&mut self, backend: &dyn Backend) -> Result<Progress> {
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
pub(super) fn give_up(backend: &dyn Backend, mut flight: Flight) -> Result<&'static str> {
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
pub(super) fn shut_down_first() -> Error {
    Error::library("wait", "jaxmpi shut down first")
}

/// What a completed request leaves: a receive's whole message checked (a short one, with
/// no status to read its count from, fails) and its status filled in; its debug line; its
/// record in the profile, from its start to now, with how long its wait waited for it
/// (`waited_since`: when the wait began, if it has).
pub(super) fn finish(
    flight: &Flight,
    outcome: Result<Progress>,
    backend: &dyn Backend,
    waited_since: Option<Instant>,
) -> Result<()> {
    if let Some(begun) = profile::begin() {
        record(begun, flight, outcome.is_ok(), waited_since);
    }
    let outcome = match (outcome, &flight.receive) {
        (Ok(Progress::Received(status)), Some(receive)) => {
            // SAFETY: the receive buffer is alive until the wait completes (XLA keeps a
            // wait's operands until then; eagerly, the Request holds the array).
            let buffer =
                unsafe { BufMut::from_raw(receive.data as *mut u8, receive.count, receive.dtype) };
            whole_message(buffer, &status, flight.status, backend)
                .map(|()| Progress::Received(status))
        }
        (outcome, _) => outcome,
    };
    if let Ok(Progress::Received(status)) = &outcome {
        fill_status(flight.status, status);
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

/// A request's record: its span from start to completion, on the requests' track.
#[cold]
fn record(begun: Begun, flight: &Flight, ok: bool, waited_since: Option<Instant>) {
    let (route, group, comm_id, device) = match flight.call.mesh_comm() {
        Some((id, device)) => (Route::MeshComm, id as u64, (-id - 1) as i32, device as i32),
        None => (Route::Jaxmpi, flight.call.comm() as u64, 0, -1),
    };
    begun.record_from(
        profile::ns_of(flight.started),
        &Fields {
            name: flight.op,
            site: "",
            route,
            kind: Kind::Completed,
            bytes: flight.call.bytes() as u64,
            group,
            comm_id,
            device,
            request: flight.key,
            waited: waited_since.map_or(0, |since| since.elapsed().as_nanos() as u64),
            failed: !ok,
        },
    );
}
