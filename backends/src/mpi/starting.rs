//! Starting mode: an op run inside `Backend::start` makes the non-blocking twin of each MPI
//! call it would make (MPI_Iallreduce for MPI_Allreduce, MPI_Isend for MPI_Send, ...) and
//! leaves the requests here, instead of completing them. The ops themselves are the
//! blocking ones, written once: their checks, chunks and segments are the same; only the
//! MPI call at the bottom (`MpiLibrary::call_or_start`) differs.
//!
//! What MPI reads until a request completes beyond the op's buffers (a v-op's counts and
//! displacements, a copy standing in for MPI_IN_PLACE) is handed over too, to live as long
//! as the requests.
//!
//! The mode belongs to the thread: the op and all its MPI calls run on the thread that
//! started it.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::ffi::c_int;

use jaxmpi_core::{Dtype, Error, Request, Result, Started};

use super::abi::Abi;
use super::library::MpiLibrary;
use super::requests;

thread_local! {
    static STARTED: RefCell<Option<Started>> = const { RefCell::new(None) };
    // Whether STARTED holds a mode, asked at every MPI call of every op: a flag without a
    // destructor reads as one load, where STARTED's access checks its registration first.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread runs an op in starting mode.
pub(super) fn active() -> bool {
    ACTIVE.with(Cell::get)
}

/// Keeps `value` alive until the requests started so far complete.
pub(super) fn keep(value: impl Any + Send) {
    if !active() {
        return;
    }
    STARTED.with(|s| {
        if let Some(started) = s.borrow_mut().as_mut() {
            started.keep.push(Box::new(value));
        }
    });
}

fn push(request: Request) {
    STARTED.with(|s| {
        if let Some(started) = s.borrow_mut().as_mut() {
            started.requests.push(request);
        }
    });
}

/// Starting mode for as long as it lives; what was started is `finish`'s. Dropped without
/// `finish` (the op failed or panicked), it waits for what was started: MPI must be done
/// with the buffers before anyone reuses them, and a collective cannot be cancelled.
pub(super) struct Mode<'a, A: Abi> {
    lib: &'a MpiLibrary<A>,
}

impl<'a, A: Abi> Mode<'a, A> {
    pub(super) fn begin(lib: &'a MpiLibrary<A>) -> Self {
        STARTED.with(|s| *s.borrow_mut() = Some(Started::default()));
        ACTIVE.with(|a| a.set(true));
        Mode { lib }
    }

    /// What was started; the mode ends when `self` drops, finding nothing left to wait for.
    pub(super) fn finish(self) -> Started {
        ACTIVE.with(|a| a.set(false));
        STARTED.with(|s| s.borrow_mut().take()).unwrap_or_default()
    }
}

impl<A: Abi> Drop for Mode<'_, A> {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(false));
        let Some(started) = STARTED.with(|s| s.borrow_mut().take()) else {
            return;
        };
        for mut request in started.requests {
            let _ = requests::wait(self.lib, &mut request);
        }
    }
}

/// Names of an MPI function and of its non-blocking twin.
pub(super) type Names = (&'static str, &'static str);

impl<A: Abi> MpiLibrary<A> {
    /// The MPI call of an op: `call(None)` makes the blocking one and returns its code;
    /// in starting mode `call(Some(request))` makes the non-blocking twin, whose request is
    /// kept. `receives`: the dtype of the buffer a receive fills (its status counts in it).
    pub(super) fn call_or_start(
        &self,
        (blocking, started): Names,
        receives: Option<Dtype>,
        call: impl FnOnce(Option<&mut A::Handle>) -> c_int,
    ) -> Result<()> {
        if !active() {
            return self.check(blocking, call(None));
        }
        let mut request = self.pre.comm_null; // overwritten by the call
        self.check(started, call(Some(&mut request)))?;
        push(Request {
            raw: A::handle_to_raw(request),
            receives,
        });
        Ok(())
    }

    /// Refuses, in starting mode, a call that has no non-blocking twin.
    pub(super) fn refuses_to_start(&self, what: &'static str) -> Result<()> {
        if active() {
            return Err(Error::unsupported(what, "has no non-blocking form"));
        }
        Ok(())
    }

    /// Refuses counts above 2^31-1 in starting mode where only MPI-4's large-count
    /// functions would take them (their non-blocking twins are not loaded).
    pub(super) fn starts_with_int_counts(&self, what: &'static str) -> Result<()> {
        if active() {
            return Err(Error::unsupported(
                what,
                "the non-blocking form takes counts and displacements below 2^31 only: use \
                 the blocking op for larger ones",
            ));
        }
        Ok(())
    }
}
