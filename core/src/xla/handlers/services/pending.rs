//! The failure of an MPI call nobody may see: with fast dispatch no runtime token carries
//! a failed program's error to the next one, and a call with no result (send, barrier, a
//! reduce away from its root) leaves the user nothing to read it from.
//!
//! A program XLA runs inline, on the thread that dispatched it, returns its failure to
//! that call at once: nothing is kept then.
//!
//! Rule: while enabled (fast dispatch), the first such failure is kept here until Python
//! reports it, whichever comes first: after the next jaxmpi op or communicator method it
//! executes has finished, at `effects_barrier`, at exit. Never before or in the middle of
//! MPI work: a rank that skipped its part of a collective because of an earlier failure
//! would leave the other ranks waiting in it forever (so no handler reports it either: XLA
//! would stop the program there, on this rank only). Python discards it once it has
//! raised it as `jaxmpi.MPIError` (also when converting the error of a result), so that
//! one failure is not raised twice.

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

/// Keeps the failure of a call without a result (unless an earlier one waits), and
/// returns the call's own outcome unchanged.
pub(in crate::xla::handlers) fn keep(result: Result<()>, has_result: bool) -> Result<()> {
    if let Err(err) = &result {
        let inline = ON_DISPATCHING_THREAD.get().is_some_and(|on| on());
        if ENABLED.load(Ordering::Relaxed) && !has_result && !inline {
            slot().get_or_insert_with(|| err.clone());
        }
    }
    result
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
