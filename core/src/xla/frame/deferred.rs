//! A call that completes after its handler returned: the handler hands XLA a future
//! (`XLA_FFI_Future`), and whoever finishes the work completes it, from any thread. XLA:CPU
//! meanwhile runs the program's other ready work, and runs what depends on the call once
//! the future is complete; XLA keeps the call's buffers alive until then.

use super::error::ffi_error;
use crate::xla::ffi::{Api, CallFrame, FfiFuture, FutureArgs, FutureCall, API_WITH_FUTURES};
use crate::Error;

/// A future given to XLA, to be completed exactly once (`finish`).
pub struct Deferred {
    api: &'static Api,
    future: *mut FfiFuture,
}

// SAFETY: XLA's futures may be completed from any thread (its header says so), and the
// API table is immutable and lives as long as the process.
unsafe impl Send for Deferred {}

fn args(future: *mut FfiFuture) -> FutureArgs {
    FutureArgs {
        struct_size: std::mem::size_of::<FutureArgs>(),
        extension_start: std::ptr::null_mut(),
        future,
        error: std::ptr::null_mut(),
    }
}

impl Deferred {
    /// Creates the future and stores it in the frame; `None` if this XLA has no futures.
    ///
    /// # Safety
    /// `frame` must be a live XLA call frame whose handler has not returned yet.
    pub(super) unsafe fn create(frame: *mut CallFrame) -> Option<Deferred> {
        // SAFETY: XLA's API table outlives every call (it is a static of jaxlib's).
        let api: &'static Api = unsafe { (*frame).api.as_ref()? };
        if api.struct_size < API_WITH_FUTURES {
            return None;
        }
        let create = api.future_create?;
        api.future_set_available?;
        api.future_set_error?;
        let mut created = args(std::ptr::null_mut());
        // SAFETY: Create writes the new future into `created.future` and nothing else.
        let error = unsafe { create(&mut created) };
        if !error.is_null() || created.future.is_null() {
            return None; // XLA leaks such an error; it never happens in practice
        }
        // SAFETY: `future` is the frame's out field after `attrs`: XLA reads it when the
        // handler returns, although the frame's `struct_size` stops before it.
        unsafe { (*frame).future = created.future.cast() };
        Some(Deferred {
            api,
            future: created.future,
        })
    }

    /// Completes the call: the program goes on, or fails with `outcome`'s error.
    pub fn finish(self, outcome: Result<(), Error>) {
        let mut args = args(self.future);
        let call: Option<FutureCall> = match &outcome {
            Ok(()) => self.api.future_set_available,
            Err(err) => {
                // SAFETY: the table is XLA's.
                args.error = unsafe { ffi_error(self.api, err) };
                self.api.future_set_error
            }
        };
        if let Some(call) = call {
            // SAFETY: a future Create returned and nobody completed yet (`self` is consumed).
            unsafe { call(&mut args) };
        }
    }
}
