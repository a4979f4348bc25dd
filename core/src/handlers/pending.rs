//! The failure of an MPI call nobody may see: with fast dispatch no runtime token carries
//! a failed program's error to the next one, and a call with no result (send, barrier, a
//! reduce away from its root) leaves the user nothing to read it from.
//!
//! A program XLA runs inline, on the thread that dispatched it, returns its failure to
//! that call at once: nothing is kept then.
//!
//! Rule: while enabled (fast dispatch), the first such failure is kept here until one of
//! these reports it, whichever comes first: the next call with a result that succeeds
//! (it completes its MPI call, so every rank stays in step, then fails with the kept
//! failure); the next communicator method called from Python; `effects_barrier`; exit.
//! Python discards it once it has raised it as `jaxmpi.MPIError` (also when converting
//! the error of a result), so that one failure is not raised twice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::{Error, Result};

static ENABLED: AtomicBool = AtomicBool::new(false);
/// Whether the calling thread is the one that dispatched the program: XLA then ran it
/// inline and hands its failure straight back to the caller, so it needs no keeping.
static ON_DISPATCHING_THREAD: OnceLock<fn() -> bool> = OnceLock::new();
static SLOT: Mutex<Option<Error>> = Mutex::new(None);

fn slot() -> std::sync::MutexGuard<'static, Option<Error>> {
    // A panic while holding the lock cannot leave the Option half-written.
    SLOT.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sets how to tell that a handler runs on the thread that dispatched its program.
pub fn set_dispatching_thread_probe(probe: fn() -> bool) {
    let _ = ON_DISPATCHING_THREAD.set(probe);
}

/// Keeps failures of calls without results from now on (`false`: drops any kept one).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::SeqCst);
    if !on {
        slot().take();
    }
}

/// What a finished call reports: a failure of a call without a result is also kept
/// (unless an earlier one waits); a call with a result that succeeded reports the kept
/// failure instead, after its MPI call, so that every rank still made the same calls.
pub(super) fn report(result: Result<()>, has_result: bool) -> Result<()> {
    if !ENABLED.load(Ordering::Relaxed) {
        return result;
    }
    match result {
        Err(err) if !has_result && !ON_DISPATCHING_THREAD.get().is_some_and(|on| on()) => {
            slot().get_or_insert_with(|| err.clone());
            Err(err)
        }
        Ok(()) if has_result => take().map_or(Ok(()), Err),
        other => other,
    }
}

/// The kept failure, now in the caller's hands.
pub fn take() -> Option<Error> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    slot().take()
}

/// Drops the kept failure if `message` (an error the user got) reports it.
pub fn discard(message: &str) {
    let mut slot = slot();
    if slot
        .as_ref()
        .is_some_and(|err| message.contains(&format!("jaxmpi.{err}")))
    {
        slot.take();
    }
}
