//! The generic handler path on synthetic call frames: the metadata probe, and errors
//! reaching XLA through `Error_Create` instead of unwinding or aborting.

use std::ffi::CStr;
use std::sync::Mutex;

use super::{GPU_HANDLERS, HANDLERS, HLO_PASS, NON_BLOCKING, RUN_TIME_COUNTS, SIGNATURES};
use crate::xla::ffi::*;
use crate::xla::frame::Call;

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
    // GPU handlers too: non-zero traits would let XLA capture them in a CUDA graph,
    // whose replays never call MPI.
    for (name, handler) in HANDLERS.iter().chain(GPU_HANDLERS) {
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
        _unused: [std::ptr::null_mut(); 8],
        future_create: None,
        future_set_available: None,
        future_set_error: None,
        run_id_get: None,
        device_ordinal_get: None,
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
fn the_cuda_table_holds_exactly_the_ops_that_run_on_gpu_buffers() {
    fn names(table: &[(&'static str, Handler)]) -> Vec<&'static str> {
        table.iter().map(|(n, _)| *n).collect()
    }
    // Those without a `host_only` reason, in declaration order; no started form (the
    // host table holds those after their op).
    let on_gpus: Vec<String> = SIGNATURES
        .iter()
        .filter(|s| s.host_only.is_empty())
        .map(|s| format!("jaxmpi_{}", s.name))
        .collect();
    assert_eq!(names(GPU_HANDLERS), on_gpus);
    for (name, gpu) in GPU_HANDLERS {
        let host = HANDLERS
            .iter()
            .find(|(n, _)| n == name)
            .expect("a host handler");
        assert_ne!(host.1 as usize, *gpu as usize, "{name}");
    }
    // Every op and started form has a host handler; the 18 blocking ops of
    // communicators run on GPUs too, and nothing else: the wait, ragged_alltoallv (run-time
    // counts), the 14 started forms and the 6 ops of the HLO pass cannot.
    let started = SIGNATURES.iter().filter(|s| !s.started.is_empty()).count();
    assert_eq!(HANDLERS.len(), SIGNATURES.len() + started);
    assert_eq!((GPU_HANDLERS.len(), started), (18, 14));
    for signature in SIGNATURES {
        let reason = match signature.name {
            "wait" => NON_BLOCKING,
            "ragged_alltoallv" => RUN_TIME_COUNTS,
            name if name.starts_with("hlo_") => HLO_PASS,
            _ => "",
        };
        assert_eq!(signature.host_only, reason, "{}", signature.name);
    }
}

/// Attributes as a lowering passes them: int64 scalars and int64 arrays, by name.
struct FrameAttrs {
    names: Vec<ByteSpan>,
    name_ptrs: Vec<*mut ByteSpan>,
    types: Vec<AttrType>,
    // Boxed: the frame points into each, so they must not move as the vectors grow.
    #[allow(clippy::vec_box)]
    values: Vec<Box<i64>>,
    arrays: Vec<(Vec<i64>, Box<Array>)>,
    #[allow(clippy::vec_box)]
    scalars: Vec<Box<Scalar>>,
    ptrs: Vec<*mut std::ffi::c_void>,
}

impl FrameAttrs {
    fn new(scalars: &[(&'static str, i64)], arrays: &[(&'static str, Vec<i64>)]) -> Self {
        let mut this = FrameAttrs {
            names: vec![],
            name_ptrs: vec![],
            types: vec![],
            values: vec![],
            arrays: vec![],
            scalars: vec![],
            ptrs: vec![],
        };
        for &(name, value) in scalars {
            this.names.push(span(name));
            this.types.push(AttrType::SCALAR);
            this.values.push(Box::new(value));
            let value = &mut **this.values.last_mut().unwrap() as *mut i64;
            this.scalars.push(Box::new(Scalar {
                dtype: DataType::S64,
                value: value.cast(),
            }));
            let scalar = &mut **this.scalars.last_mut().unwrap() as *mut Scalar;
            this.ptrs.push(scalar.cast());
        }
        for (name, values) in arrays {
            this.names.push(span(name));
            this.types.push(AttrType::ARRAY);
            let mut values = values.clone();
            let array = Box::new(Array {
                dtype: DataType::S64,
                size: values.len(),
                data: values.as_mut_ptr().cast(),
            });
            this.arrays.push((values, array));
            let array = &mut *this.arrays.last_mut().unwrap().1 as *mut Array;
            this.ptrs.push(array.cast());
        }
        this.name_ptrs = this.names.iter_mut().map(|n| n as *mut ByteSpan).collect();
        this
    }

    fn set_on(&mut self, frame: &mut CallFrame) {
        frame.attrs.size = self.types.len() as i64;
        frame.attrs.types = self.types.as_mut_ptr();
        frame.attrs.names = self.name_ptrs.as_mut_ptr();
        frame.attrs.attrs = self.ptrs.as_mut_ptr();
    }
}

fn span(name: &'static str) -> ByteSpan {
    ByteSpan {
        ptr: name.as_ptr().cast(),
        len: name.len(),
    }
}

/// The ids a lowering would pass for a communicator and an address (`xla/frame/handles.rs`).
fn ids(comm: usize, address: usize) -> (i64, i64) {
    use crate::xla::frame::handles::{id_of, Table};
    (id_of(Table::Comm, comm), id_of(Table::Address, address))
}

#[test]
fn attributes_decode_into_their_declared_types() {
    use crate::xla::frame::Attrs;
    use crate::{Comm, Peer, ReduceOp};
    let (comm, status) = ids(-8i64 as u64 as usize, 64);
    let mut attrs = FrameAttrs::new(
        &[
            ("comm", comm),
            ("source", -1),
            ("tag", -1),
            ("status", status),
            ("tree", -3),
        ],
        &[],
    );
    let mut frame = frame(std::ptr::null(), std::ptr::null_mut());
    attrs.set_on(&mut frame);
    // SAFETY: a well-formed frame, alive for the call.
    let call = unsafe { Call::new(&mut frame, "recv") }.unwrap();
    let recv = super::attrs::Recv::decode(&call).unwrap();
    assert_eq!(
        recv.comm,
        Comm(-8i64 as u64 as usize),
        "addresses keep all 64 bits"
    );
    assert_eq!(
        (recv.source, recv.tag, recv.status.0, recv.tree.of(&call)),
        (Peer::Any, None, 64, -3i64 as u64),
        "a pytree's fingerprint keeps all 64 bits"
    );

    let (comm, user_op) = ids(0x4400_0000, 77);
    let mut attrs = FrameAttrs::new(
        &[
            ("comm", comm),
            ("op", -1),
            ("user_op", user_op),
            ("tree", 0),
        ],
        &[],
    );
    attrs.set_on(&mut frame);
    // SAFETY: as above.
    let call = unsafe { Call::new(&mut frame, "allreduce") }.unwrap();
    assert_eq!(
        super::attrs::Allreduce::decode(&call).unwrap().op,
        ReduceOp::User(77)
    );

    let mut attrs = FrameAttrs::new(
        &[("comm", comm), ("root", 0), ("tree", 0)],
        &[("counts", vec![2, 0, 3])],
    );
    attrs.set_on(&mut frame);
    // SAFETY: as above.
    let call = unsafe { Call::new(&mut frame, "gatherv") }.unwrap();
    let counts = super::attrs::Gatherv::decode(&call).unwrap().counts;
    assert_eq!(counts.elements(4), (vec![8, 0, 12], vec![0, 8, 8]));
}

#[test]
fn a_missing_or_bad_attribute_is_one_error_naming_op_and_attribute() {
    use crate::xla::frame::Attrs;
    let mut frame = frame(std::ptr::null(), std::ptr::null_mut());
    let (comm, _) = ids(0x4400_0000, 0);
    let cases: [(&[(&'static str, i64)], &str); 4] = [
        (&[("comm", comm)], "attribute \"root\" is missing"),
        (
            &[("comm", comm), ("root", 1 << 40)],
            "attribute \"root\" = 1099511627776 does not fit",
        ),
        (
            &[("comm", comm), ("root", 0), ("counts", 3)],
            "attribute \"counts\" is missing or has the wrong kind",
        ),
        (
            &[("comm", 1 << 30), ("root", 0)],
            "attribute \"comm\" = 1073741824 names no handle this process has lowered",
        ),
    ];
    for (scalars, expected) in cases {
        let mut attrs = FrameAttrs::new(scalars, &[]);
        attrs.set_on(&mut frame);
        // SAFETY: a well-formed frame, alive for the call.
        let call = unsafe { Call::new(&mut frame, "gatherv") }.unwrap();
        let Err(err) = super::attrs::Gatherv::decode(&call) else {
            panic!("{expected}: decoded");
        };
        assert_eq!(err.op, "gatherv");
        assert!(err.message.starts_with(expected), "{}", err.message);
    }
    let mut attrs = FrameAttrs::new(&[("comm", comm), ("root", 0)], &[("counts", vec![1, -2])]);
    attrs.set_on(&mut frame);
    // SAFETY: as above.
    let call = unsafe { Call::new(&mut frame, "gatherv") }.unwrap();
    let err = super::attrs::Gatherv::decode(&call).err().unwrap();
    assert!(err.message.contains("negative count -2"), "{}", err.message);
}
