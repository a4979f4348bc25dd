//! A jaxmpi `Error` as XLA takes it: an `XLA_FFI_Error` with the matching error code and
//! the error's words. Both ways a call fails go through here: a handler returning it
//! (`handlers/entry.rs`) and a deferred call completing its future with it
//! (`deferred.rs`), so XLA shows the same message either way.

use std::ffi::{c_char, CString};

use crate::xla::ffi::{Api, ErrorCode, ErrorCreateArgs, FfiError};
use crate::{Error, ErrorKind};

fn error_code(err: &Error) -> ErrorCode {
    match err.kind {
        ErrorKind::InvalidArgument => ErrorCode::INVALID_ARGUMENT,
        ErrorKind::Unsupported => ErrorCode::UNIMPLEMENTED,
        ErrorKind::Library => ErrorCode::UNAVAILABLE,
        ErrorKind::Mpi { .. } => ErrorCode::INTERNAL,
    }
}

/// XLA's error for `err`, as the handler of its op returns it (or a future reports it).
///
/// # Safety
/// `api` must be XLA's API table or NULL.
pub(crate) unsafe fn ffi_error(api: *const Api, err: &Error) -> *mut FfiError {
    let text = format!("jaxmpi.{err}").replace('\0', " ");
    let message = CString::new(text).unwrap_or_default();
    // SAFETY: XLA's table lives as long as the process; Error_Create copies the message
    // before returning.
    unsafe {
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
