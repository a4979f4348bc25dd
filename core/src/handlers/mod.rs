//! XLA FFI handlers: one generic path decodes a call frame, validates it and dispatches to
//! the process's backend. Each op contributes its line in the table below (its signature)
//! and its body in `ops.rs`; `lifecycle.rs` is what every call does around the body.

mod call;
mod device;
mod lifecycle;
mod ops;
pub mod pending;
mod signature;
#[cfg(test)]
mod tests;

use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use call::Call;
pub use signature::{
    Address, AttrDecl, Counts, Kind, Signature, OP_USER, PEER_ANY, PEER_NULL, TAG_ANY, USER_OP,
};

use crate::xla_ffi::{
    CallFrame, ErrorCode, ErrorCreateArgs, ExtensionType, FfiError, Handler, MetadataExtension,
    API_VERSION_STRUCT_SIZE, CALL_FRAME_STRUCT_SIZE, METADATA_STRUCT_SIZE,
};
use crate::{library, Backend, Comm, Error, ErrorKind, Library, Peer, ReduceOp, Result};
use lifecycle::CallInfo;
use signature::{declare_ops, Attr, Attrs};

// Every op, declared once: `name: TypedAttrs (operands) -> (results) { attributes }`. The
// lowering `jaxmpi_<name>` passes exactly these (Python checks its parameters against this
// table at trace time); the handler decodes them into `attrs::TypedAttrs` before
// `ops::<name>` runs. A result is absent on ranks that receive nothing (see `ops.rs`), an
// operand that is only a receive template never reaches the handler.
declare_ops! {
    allreduce: Allreduce (x) -> (y) { comm: Comm, op: ReduceOp },
    reduce: Reduce (x) -> (y) { comm: Comm, op: ReduceOp, root: i32 },
    scan: Scan (x) -> (y) { comm: Comm, op: ReduceOp },
    exscan: Exscan (x) -> (y) { comm: Comm, op: ReduceOp },
    reduce_scatter: ReduceScatter (x) -> (y) { comm: Comm, op: ReduceOp },
    bcast: Bcast (x) -> (y) { comm: Comm, root: i32 },
    gather: Gather (x) -> (y) { comm: Comm, root: i32 },
    allgather: Allgather (x) -> (y) { comm: Comm },
    scatter: Scatter (x) -> (y) { comm: Comm, root: i32 },
    alltoall: Alltoall (x) -> (y) { comm: Comm },
    gatherv: Gatherv (x) -> (y) { comm: Comm, root: i32, counts: Counts },
    allgatherv: Allgatherv (x) -> (y) { comm: Comm, counts: Counts },
    scatterv: Scatterv (x) -> (y) { comm: Comm, root: i32, counts: Counts },
    alltoallv: Alltoallv (x) -> (y) { comm: Comm, send_counts: Counts, recv_counts: Counts },
    send: Send (x) -> () { comm: Comm, dest: Peer, tag: i32 },
    recv: Recv (x) -> (y) { comm: Comm, source: Peer, tag: Option<i32>, status: Address },
    sendrecv: Sendrecv (sendbuf, recvbuf) -> (y) {
        comm: Comm, dest: Peer, sendtag: i32, source: Peer, recvtag: Option<i32>, status: Address,
    },
    barrier: Barrier () -> () { comm: Comm },
}

/// An op body: runs the backend op on the call's buffers and its decoded attributes
/// (`Library` for the communicator queries, `Backend` for the op itself).
type Body<A> = fn(&Call, &dyn Library, &dyn Backend, &A) -> Result<()>;

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
unsafe fn handle<A: Attrs>(
    frame: *mut CallFrame,
    name: &'static str,
    body: Body<A>,
) -> *mut FfiError {
    // SAFETY: forwarded from the caller.
    if unsafe { answer_metadata_probe(frame) } {
        return std::ptr::null_mut();
    }
    // A panic must not unwind into XLA's C++ frames: it becomes an error instead.
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: forwarded from the caller.
        let call = unsafe { Call::new(frame, name) }?;
        let library = library()?;
        let result = lifecycle::run(&call, library, |attrs| {
            body(&call, library, library.backend(), attrs)
        })
        .map_err(|err| with_rank(err.in_op(name), library).with_call(CallInfo::of(&call)));
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
                name,
                format!("internal error (panic): {what}"),
            )
        }
    };
    // SAFETY: forwarded from the caller.
    unsafe { create_error(frame, &error) }
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

/// Frames smaller than the declared size come from an XLA this file does not know.
pub(crate) fn frame_is_compatible(struct_size: usize) -> bool {
    struct_size >= CALL_FRAME_STRUCT_SIZE
}
