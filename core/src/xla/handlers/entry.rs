//! The one path every exported handler takes: XLA's metadata probe answered, the call frame
//! checked, the op body run inside `lifecycle::run` with panics caught, and any failure
//! handed back to XLA as an error that names the op, the rank and the call; the whole of
//! it recorded while a profile records (`profiled.rs`).

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::profiled;
use super::services::call_info::{with_rank, CallInfo};
use super::services::lifecycle::{self, on_mesh_comm, Platform};
use super::services::pending;
use super::Body;
use crate::xla::ffi::{
    CallFrame, ExtensionType, FfiError, MetadataExtension, API_VERSION_STRUCT_SIZE,
    METADATA_STRUCT_SIZE,
};
use crate::xla::frame::{ffi_error, Attrs, Call};
use crate::xla::profile;
use crate::{library, Backend, Error, ErrorKind, Library};

/// Answers XLA's registration-time metadata probe, if this frame is one: API version 0.1,
/// no traits (never COMMAND_BUFFER_COMPATIBLE: a CUDA graph would replay no MPI call).
///
/// # Safety
/// `frame` must be a call frame from XLA.
unsafe fn answer_metadata_probe(frame: *mut CallFrame) -> bool {
    // SAFETY: XLA passes a valid frame; on jaxlib 0.6-0.8 `api` is NULL during the probe,
    // so only the extension chain is read, and only within `struct_size`.
    unsafe {
        let extension = (*frame).extension_start;
        if extension.is_null() || (*extension).kind != ExtensionType::METADATA {
            return false;
        }
        let metadata = (*(extension as *mut MetadataExtension)).metadata;
        if metadata.is_null() || (*metadata).struct_size < METADATA_STRUCT_SIZE {
            return true;
        }
        (*metadata).api_version.struct_size = API_VERSION_STRUCT_SIZE;
        (*metadata).api_version.extension_start = std::ptr::null_mut();
        (*metadata).api_version.major_version = 0;
        (*metadata).api_version.minor_version = 1;
        (*metadata).traits = 0;
        true
    }
}

/// The whole life of one handler call; every exported handler is this with its body.
/// `started`: the call of an op's started form (`Call::starting`). While a profile
/// records, the call is recorded once it is over (`profiled.rs`); while none does, that
/// costs a load and a branch (benches/RESULTS.md: the calls' path split in two around the
/// profile, or the record taken in a closure, cost 50 instructions a call).
///
/// # Safety
/// `frame` must be a call frame from XLA.
pub(super) unsafe fn handle<A: Attrs>(
    frame: *mut CallFrame,
    name: &'static str,
    started: bool,
    platform: Platform,
    body: Body<A>,
) -> *mut FfiError {
    // SAFETY: forwarded from the caller.
    if unsafe { answer_metadata_probe(frame) } {
        return std::ptr::null_mut();
    }
    let begun = profile::begin();
    // A panic must not unwind into XLA's C++ frames: it becomes an error instead.
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: forwarded from the caller.
        let call = unsafe { Call::new(frame, name) }?;
        let call = if started { call.starting()? } else { call };
        let library = library()?;
        // On a MeshComm, the body's library and backend are the call's device as a rank
        // (`xla/mesh/comm.rs`).
        let on_devices = on_mesh_comm(&call, library).map_err(|err| err.in_op(name))?;
        let call = match &on_devices {
            Some(on) => call.on_device_rank(on.rank()),
            None => call,
        };
        let (ranks, backend): (&dyn Library, &dyn Backend) = match &on_devices {
            Some(on) => (on, on),
            None => (library, library.backend()),
        };
        let result = lifecycle::run(&call, library, on_devices.as_ref(), platform, |attrs| {
            body(&call, ranks, backend, attrs)
        })
        .map_err(|err| with_rank(err.in_op(name), library).with_call(CallInfo::of(&call)));
        pending::keep(result, call.optional_ret(0).is_some())
    }));
    let error = match outcome {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(err)) => {
            // SAFETY: forwarded from the caller.
            unsafe { create_error(frame, &err) }
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let err = Error::new(
                ErrorKind::Unsupported,
                name,
                format!("internal error (panic): {what}"),
            );
            // SAFETY: forwarded from the caller.
            unsafe { create_error(frame, &err) }
        }
    };
    if let Some(begun) = begun {
        // SAFETY: forwarded from the caller; the call is over, its frame still alive.
        unsafe { profiled::record(begun, frame, name, started, error) };
    }
    error
}

/// # Safety
/// `frame` must be a call frame from XLA.
unsafe fn create_error(frame: *mut CallFrame, err: &Error) -> *mut FfiError {
    // SAFETY: outside the metadata probe XLA always sets `api`.
    unsafe { ffi_error((*frame).api, err) }
}
