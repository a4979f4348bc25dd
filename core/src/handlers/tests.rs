//! The generic handler path on synthetic call frames: the metadata probe, and errors
//! reaching XLA through `Error_Create` instead of unwinding or aborting.

use std::ffi::CStr;
use std::sync::Mutex;

use super::{DEVICE_HANDLERS, HANDLERS};
use crate::xla_ffi::*;

static LAST_ERROR: Mutex<Option<(i32, String)>> = Mutex::new(None);

unsafe extern "C" fn record_error(args: *mut ErrorCreateArgs) -> *mut FfiError {
    // SAFETY: called by the handler with valid args and a NUL-terminated message.
    let (code, text) = unsafe {
        (
            (*args).errc.0,
            CStr::from_ptr((*args).message)
                .to_string_lossy()
                .into_owned(),
        )
    };
    *LAST_ERROR.lock().unwrap() = Some((code, text));
    // Any non-null pointer stands for "an error object".
    std::ptr::NonNull::<FfiError>::dangling().as_ptr()
}

fn empty_args() -> Args {
    Args {
        struct_size: 40,
        extension_start: std::ptr::null_mut(),
        size: 0,
        types: std::ptr::null_mut(),
        args: std::ptr::null_mut(),
    }
}

fn frame(api: *const Api, extension: *mut ExtensionBase) -> CallFrame {
    CallFrame {
        struct_size: CALL_FRAME_STRUCT_SIZE,
        extension_start: extension,
        api,
        ctx: std::ptr::null_mut(),
        stage: ExecutionStage::EXECUTE,
        args: empty_args(),
        rets: empty_args(),
        attrs: Attrs {
            struct_size: 48,
            extension_start: std::ptr::null_mut(),
            size: 0,
            types: std::ptr::null_mut(),
            names: std::ptr::null_mut(),
            attrs: std::ptr::null_mut(),
        },
        future: std::ptr::null_mut(),
    }
}

#[test]
fn every_handler_answers_the_metadata_probe_with_api_0_1_and_no_traits() {
    // Device handlers too: non-zero traits would let XLA capture them in a CUDA graph,
    // whose replays never call MPI.
    for (name, handler) in HANDLERS.iter().chain(DEVICE_HANDLERS) {
        let mut metadata = Metadata {
            struct_size: METADATA_STRUCT_SIZE,
            api_version: ApiVersion {
                struct_size: 0,
                extension_start: std::ptr::null_mut(),
                major_version: 9,
                minor_version: 9,
            },
            traits: 7,
        };
        let mut extension = MetadataExtension {
            extension_base: ExtensionBase {
                struct_size: 32,
                kind: ExtensionType::METADATA,
                next: std::ptr::null_mut(),
            },
            metadata: &mut metadata,
        };
        // On jaxlib 0.6-0.8 the probe comes with a NULL api: it must not be touched.
        let mut probe = frame(std::ptr::null(), &mut extension.extension_base);
        // SAFETY: a well-formed probe frame.
        let result = unsafe { handler(&mut probe) };
        assert!(result.is_null(), "{name}");
        let version = &metadata.api_version;
        assert_eq!(
            (
                version.struct_size,
                version.major_version,
                version.minor_version,
                metadata.traits
            ),
            (24, 0, 1, 0),
            "{name}"
        );
    }
}

#[test]
fn a_call_without_a_backend_returns_an_error_naming_the_op() {
    let api = Api {
        struct_size: 0,
        extension_start: std::ptr::null_mut(),
        api_version: ApiVersion {
            struct_size: 24,
            extension_start: std::ptr::null_mut(),
            major_version: 0,
            minor_version: 1,
        },
        internal_api: std::ptr::null_mut(),
        error_create: Some(record_error),
        error_get_message: std::ptr::null_mut(),
        error_destroy: std::ptr::null_mut(),
        handler_register: std::ptr::null_mut(),
        stream_get: None,
    };
    let (_, barrier) = HANDLERS
        .iter()
        .find(|(n, _)| *n == "jaxmpi_barrier")
        .unwrap();
    let mut call = frame(&api, std::ptr::null_mut());
    // SAFETY: a well-formed frame whose api records errors.
    let result = unsafe { barrier(&mut call) };
    assert!(!result.is_null());
    let (code, text) = LAST_ERROR.lock().unwrap().take().unwrap();
    assert_eq!(code, ErrorCode::UNAVAILABLE.0);
    assert!(
        text.starts_with("jaxmpi.backend: no MPI backend has been selected"),
        "{text}"
    );

    // A frame from an unknown future stage is refused, not misread.
    let mut call = frame(&api, std::ptr::null_mut());
    call.stage = ExecutionStage(1);
    // SAFETY: as above.
    assert!(!unsafe { barrier(&mut call) }.is_null());
    let (code, text) = LAST_ERROR.lock().unwrap().take().unwrap();
    assert_eq!(code, ErrorCode::UNIMPLEMENTED.0);
    assert!(
        text.contains("barrier") && text.contains("execution stage 1"),
        "{text}"
    );
}

#[test]
fn device_handlers_serve_the_same_targets_as_the_host_ones() {
    fn names(table: &[(&'static str, Handler)]) -> Vec<&'static str> {
        table.iter().map(|(n, _)| *n).collect()
    }
    assert_eq!(names(HANDLERS), names(DEVICE_HANDLERS));
    assert!(HANDLERS
        .iter()
        .zip(DEVICE_HANDLERS)
        .all(|((_, host), (_, device))| *host as usize != *device as usize));
}
