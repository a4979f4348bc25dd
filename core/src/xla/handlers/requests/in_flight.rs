//! Requests between their start (any started op: `nonblocking.rs`) and their `wait`: a
//! start registers its flight in the table (`flights.rs`); a wait completes it at once,
//! hands it to the progress agent (`agent.rs`) through an XLA future, or blocks until it
//! completes; at exit, every request nobody waited for is given up.

use std::time::{Duration, Instant};

use super::agent::{agent_running, take_thread};
use super::flights::{finish, give_up, shut_down_first, table, Entry, Flight, Outcome, WAKE};
use crate::xla::frame::Deferred;
use crate::{Error, Library, Result};

/// Registers a started request; its key is what the start's request result holds.
pub(super) fn start(library: &'static dyn Library, flight: Flight) -> Result<u64> {
    let running = agent_running(library);
    let mut table = table();
    if table.closed {
        return Err(Error::library(flight.op, "started after jaxmpi shut down"));
    }
    let key = table.next;
    table.next += 1;
    let mut flight = flight;
    flight.key = key;
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
            // Since the wait began: what its watchdog and the profile count.
            entry.waiter = Some((deferred, spin));
            table.entries.push((key, entry));
            WAKE.notify_all();
            return Ok(());
        }
    }
    let outcome = match entry.outcome.take() {
        Some(outcome) => outcome,
        None => entry.wait(backend),
    };
    finish(&entry.flight, outcome, backend, Some(spin))
}

/// How long a wait tests its request itself before handing it to the agent.
const SPIN: Duration = Duration::from_micros(200);

/// At exit, before MPI_Finalize: stops the agent and gives up every request nobody waited
/// for (started outside jit and never waited); returns them, described, for a warning.
pub fn shut_down(library: &dyn Library) -> Vec<String> {
    let handle = take_thread();
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
