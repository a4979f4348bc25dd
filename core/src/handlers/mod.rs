//! XLA FFI handlers: one generic path decodes a call frame, validates it and dispatches to
//! the process's backend. Each op contributes only its body in `ops.rs`.

mod call;
mod device;
mod ops;
pub mod pending;
#[cfg(test)]
mod tests;

use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use call::{Call, PEER_ANY, PEER_NULL, TAG_ANY};

use crate::calllog::{self, CallInfo};
use crate::xla_ffi::{
    CallFrame, ErrorCode, ErrorCreateArgs, ExtensionType, FfiError, Handler, MetadataExtension,
    API_VERSION_STRUCT_SIZE, CALL_FRAME_STRUCT_SIZE, METADATA_STRUCT_SIZE,
};
use crate::{library, Backend, Error, ErrorKind, Library, Result};

/// An op body: reads its operands and attributes from the call, runs the backend op
/// (`Library` for the communicator queries, `Backend` for the op itself).
type Body = fn(&Call, &dyn Library, &dyn Backend) -> Result<()>;

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
///
/// # Safety
/// `frame` must be a call frame from XLA.
pub unsafe fn handle(frame: *mut CallFrame, op: &'static str, body: Body) -> *mut FfiError {
    // SAFETY: forwarded from the caller.
    if unsafe { answer_metadata_probe(frame) } {
        return std::ptr::null_mut();
    }
    // A panic must not unwind into XLA's C++ frames: it becomes an error instead.
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: forwarded from the caller.
        let call = unsafe { Call::new(frame, op) }?;
        let library = library()?;
        // SAFETY: `call` was made from `frame`, valid for this whole function.
        let result = unsafe {
            calllog::run(frame, &call, library, || {
                body(&call, library, library.backend())
            })
        }
        .map_err(|err| with_rank(named(err, op), library).with_call(CallInfo::of(&call)));
        pending::keep(result, call.optional_ret(0).is_some())
    }));
    let error = match outcome {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(err)) => err,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Error::new(
                ErrorKind::Unsupported,
                op,
                format!("internal error (panic): {what}"),
            )
        }
    };
    // SAFETY: forwarded from the caller.
    unsafe { create_error(frame, &error) }
}

/// An error of a step inside the op (e.g. the error handler check) names the op the user
/// called, and keeps the step as its `step`.
fn named(mut err: Error, op: &'static str) -> Error {
    if err.op != op {
        err.step = Some(std::mem::replace(&mut err.op, op.into()));
    }
    err
}

/// Errors that did not come from MPI do not name the rank yet; a user with 100 ranks
/// needs it.
fn with_rank(err: Error, library: &dyn Library) -> Error {
    if err.mpi_class().is_some() {
        return err;
    }
    match library.comm_rank(library.world()) {
        Ok(rank) => err.context(format!("rank {rank}")),
        Err(_) => err,
    }
}

fn error_code(err: &Error) -> ErrorCode {
    match err.kind {
        ErrorKind::InvalidArgument => ErrorCode::INVALID_ARGUMENT,
        ErrorKind::Unsupported => ErrorCode::UNIMPLEMENTED,
        ErrorKind::Library => ErrorCode::UNAVAILABLE,
        ErrorKind::Mpi { .. } => ErrorCode::INTERNAL,
    }
}

/// # Safety
/// `frame` must be a call frame from XLA.
unsafe fn create_error(frame: *mut CallFrame, err: &Error) -> *mut FfiError {
    let text = format!("jaxmpi.{err}").replace('\0', " ");
    let message = CString::new(text).unwrap_or_default();
    // SAFETY: outside the metadata probe XLA always sets `api`; Error_Create copies the
    // message before returning.
    unsafe {
        let api = (*frame).api;
        let Some(create) = api.as_ref().and_then(|api| api.error_create) else {
            return std::ptr::null_mut();
        };
        let mut args = ErrorCreateArgs {
            struct_size: std::mem::size_of::<ErrorCreateArgs>(),
            extension_start: std::ptr::null_mut(),
            message: message.as_ptr() as *const c_char,
            errc: error_code(err),
        };
        create(&mut args)
    }
}

/// Declares one exported handler per op and the table Python registers them from.
macro_rules! handlers {
    ($($name:ident),* $(,)?) => {
        /// `jaxmpi_<op>` for every op: the FFI target names the Python lowerings call.
        pub mod exported {
            use super::*;
            $(
                /// # Safety
                /// Called by XLA with a valid call frame.
                pub unsafe extern "C" fn $name(frame: *mut CallFrame) -> *mut FfiError {
                    // SAFETY: XLA passes a valid frame.
                    unsafe { handle(frame, stringify!($name).trim_start_matches("jaxmpi_"), ops::$name) }
                }
            )*
        }

        /// The same targets for GPU buffers: each call runs on XLA's stream through the
        /// installed device runtime.
        pub mod exported_device {
            use super::*;
            $(
                /// # Safety
                /// Called by XLA with a valid call frame.
                pub unsafe extern "C" fn $name(frame: *mut CallFrame) -> *mut FfiError {
                    fn body(call: &Call, library: &dyn Library, _host: &dyn Backend) -> Result<()> {
                        device::on_device(call, library, ops::$name)
                    }
                    // SAFETY: XLA passes a valid frame.
                    unsafe { handle(frame, stringify!($name).trim_start_matches("jaxmpi_"), body) }
                }
            )*
        }

        /// (FFI target name, handler) for every op.
        pub const HANDLERS: &[(&str, Handler)] = &[$((stringify!($name), exported::$name as Handler)),*];
        /// (FFI target name, handler) for every op on GPU buffers (same names).
        pub const DEVICE_HANDLERS: &[(&str, Handler)] =
            &[$((stringify!($name), exported_device::$name as Handler)),*];
    };
}

handlers!(
    jaxmpi_allreduce,
    jaxmpi_reduce,
    jaxmpi_scan,
    jaxmpi_exscan,
    jaxmpi_reduce_scatter,
    jaxmpi_bcast,
    jaxmpi_gather,
    jaxmpi_allgather,
    jaxmpi_scatter,
    jaxmpi_alltoall,
    jaxmpi_gatherv,
    jaxmpi_allgatherv,
    jaxmpi_scatterv,
    jaxmpi_alltoallv,
    jaxmpi_send,
    jaxmpi_recv,
    jaxmpi_sendrecv,
    jaxmpi_barrier,
);

/// Frames smaller than the declared size come from an XLA this file does not know.
pub(crate) fn frame_is_compatible(struct_size: usize) -> bool {
    struct_size >= CALL_FRAME_STRUCT_SIZE
}
