//! Device handlers: the same op bodies, run by the installed device runtime on XLA's stream.

use super::Call;
use crate::device::{device_runtime, Stream};
use crate::xla::ffi::StreamGetArgs;
use crate::{Backend, Error, Library, Result};

/// XLA's stream for this call.
fn stream_of(call: &Call) -> Result<Stream> {
    let frame = call.frame();
    // SAFETY: outside the metadata probe XLA sets `api`; Stream_Get fills `stream` only.
    unsafe {
        let get = frame.api.as_ref().and_then(|api| api.stream_get);
        let Some(get) = get else {
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
        if !get(&mut args).is_null() {
            // The error object is XLA's; this path only runs on a GPU platform, where
            // Stream_Get does not fail, so it is not worth decoding.
            return Err(Error::library(
                call.name(),
                "XLA could not give the op's GPU stream",
            ));
        }
        Ok(Stream(args.stream))
    }
}

/// Runs `body` (the op on the backend it is given) for a call whose buffers are device
/// memory.
pub fn on_device(
    call: &Call,
    library: &dyn Library,
    body: &mut dyn FnMut(&dyn Backend) -> Result<()>,
) -> Result<()> {
    if call.optional_i64("comm").is_some_and(|id| id < 0) {
        return Err(Error::unsupported(
            call.name(),
            "device communicators (MeshComm) take CPU devices only so far: on GPUs, run one \
             process per GPU with an MPI communicator",
        ));
    }
    let stream = stream_of(call)?;
    device_runtime()?.run(stream, library, body)
}
