//! GPU handlers: the same op bodies, run by the installed GPU runtime on XLA's stream.
//! What can fail on this rank alone before the op's MPI calls (XLA giving no stream, no
//! runtime, the runtime's own preparation) goes to the call's start verdict where it takes
//! one (`start_verdict.rs`), so that every rank of the call returns an error and none is
//! left waiting; elsewhere the runtime still makes the op's MPI calls (`crate::gpu`).

use std::ffi::CStr;

use super::start_verdict;
use crate::gpu::{gpu_runtime, Agree, Stream};
use crate::xla::ffi::{
    Api, ErrorCode, ErrorDestroy, ErrorDestroyArgs, ErrorDetails, ErrorDetailsArgs, FfiError,
    StreamGetArgs,
};
use crate::xla::frame::Call;
use crate::xla::mesh::is_mesh_comm;
use crate::{Backend, Comm, Error, Library, Result};

/// The message of `error`, an error XLA returned to this handler, which then destroys it:
/// once returned to us, it is ours to free.
///
/// # Safety
/// `api` must be XLA's API table and `error` a live error it created, used no more after.
unsafe fn take_message(api: &Api, error: *mut FfiError) -> Option<String> {
    let mut message = None;
    if !api.error_get_message.is_null() {
        // SAFETY: the slot holds Error_GetMessage or Error_GetDetails (one signature,
        // `ErrorDetailsArgs` serves both); it fills `message` with a C string that lives
        // as long as the error, copied out before the error is destroyed.
        unsafe {
            let get: ErrorDetails = std::mem::transmute(api.error_get_message);
            let mut args = ErrorDetailsArgs {
                struct_size: std::mem::size_of::<ErrorDetailsArgs>(),
                extension_start: std::ptr::null_mut(),
                error,
                message: std::ptr::null(),
                errc: ErrorCode::INTERNAL,
            };
            get(&mut args);
            if !args.message.is_null() {
                message = Some(CStr::from_ptr(args.message).to_string_lossy().into_owned());
            }
        }
    }
    if !api.error_destroy.is_null() {
        // SAFETY: the slot holds Error_Destroy; `error` is destroyed once, here.
        unsafe {
            let destroy: ErrorDestroy = std::mem::transmute(api.error_destroy);
            let mut args = ErrorDestroyArgs {
                struct_size: std::mem::size_of::<ErrorDestroyArgs>(),
                extension_start: std::ptr::null_mut(),
                error,
            };
            destroy(&mut args);
        }
    }
    message
}

/// XLA's stream for this call.
fn stream_of(call: &Call) -> Result<Stream> {
    let frame = call.frame();
    // SAFETY: outside the metadata probe XLA sets `api`, whose table lives as long as the
    // process.
    let Some(api) = (unsafe { frame.api.as_ref() }) else {
        return Err(Error::unsupported(call.name(), "XLA gave the call no API"));
    };
    let Some(get) = api.stream_get else {
        return Err(Error::unsupported(
            call.name(),
            "this XLA has no XLA_FFI_Stream_Get",
        ));
    };
    let mut args = StreamGetArgs {
        struct_size: std::mem::size_of::<StreamGetArgs>(),
        extension_start: std::ptr::null_mut(),
        ctx: frame.ctx,
        stream: std::ptr::null_mut(),
    };
    // SAFETY: the call's own context; Stream_Get fills `stream` only.
    let error = unsafe { get(&mut args) };
    if error.is_null() {
        return Ok(Stream(args.stream));
    }
    // SAFETY: an error XLA just returned, not used after.
    let message = match unsafe { take_message(api, error) } {
        Some(why) => format!("XLA could not give the op's GPU stream: {why}"),
        None => "XLA could not give the op's GPU stream".to_string(),
    };
    Err(Error::library(call.name(), message))
}

/// Runs `body` (the op on the backend it is given) for a call whose buffers are GPU
/// memory, on `comm` where the program names one.
pub fn on_gpu(
    call: &Call,
    library: &dyn Library,
    comm: Option<Comm>,
    body: &mut dyn FnMut(&dyn Backend) -> Result<()>,
) -> Result<()> {
    if call.optional_i64("comm").is_some_and(is_mesh_comm) {
        return Err(Error::unsupported(
            call.name(),
            "a MeshComm takes CPU devices only so far: on GPUs, run one \
             process per GPU with an MPI communicator",
        ));
    }
    let mut verdict;
    let agree: Option<Agree> = match comm.filter(|_| start_verdict::taken(call)) {
        Some(comm) => {
            verdict = move |mine: Option<&Error>| start_verdict::agree(library, comm, mine);
            Some(&mut verdict)
        }
        None => None,
    };
    let stream = stream_of(call);
    match gpu_runtime() {
        Ok(runtime) => runtime.run(stream, library, agree, body),
        // Only where Python registered GPU handlers without installing a runtime, which
        // it does in one step: every rank of the call fails alike then.
        Err(err) => match agree {
            Some(agree) => agree(Some(&err)).and(Err(err)),
            None => Err(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static DESTROYED: AtomicUsize = AtomicUsize::new(0);
    const ERROR: usize = 0x5eed;

    unsafe extern "C" fn details(args: *mut ErrorDetailsArgs) {
        // SAFETY: called by `take_message` with its args.
        unsafe {
            assert_eq!((*args).error as usize, ERROR);
            assert!((*args).struct_size >= 36);
            (*args).message = c"CUDA_ERROR_NOT_READY".as_ptr();
        }
    }

    unsafe extern "C" fn destroy(args: *mut ErrorDestroyArgs) {
        // SAFETY: as above.
        let error = unsafe { (*args).error } as usize;
        DESTROYED.fetch_add(usize::from(error == ERROR), Ordering::SeqCst);
    }

    #[test]
    fn an_error_xla_returns_is_read_then_destroyed() {
        // SAFETY: only the two slots read are set; the rest stays zero (null, None).
        let mut api: Api = unsafe { std::mem::zeroed() };
        api.error_get_message = details as *mut c_void;
        api.error_destroy = destroy as *mut c_void;
        let error = ERROR as *mut FfiError;
        // SAFETY: a table whose functions take the error above.
        let message = unsafe { take_message(&api, error) };
        assert_eq!(message.as_deref(), Some("CUDA_ERROR_NOT_READY"));
        assert_eq!(DESTROYED.load(Ordering::SeqCst), 1);
        // Without a message getter, the error is still freed.
        api.error_get_message = std::ptr::null_mut();
        // SAFETY: as above.
        assert_eq!(unsafe { take_message(&api, error) }, None);
        assert_eq!(DESTROYED.load(Ordering::SeqCst), 2);
    }
}
