//! The subset of the XLA FFI C API (API version 0.1) jaxmpi's handlers use, as `#[repr(C)]`
//! mirrors of `xla/ffi/api/c_api.h`. Every offset is pinned by a test. C enums are `i32`
//! newtypes: XLA may send values newer than this file.
//!
//! Checked against the headers of jaxlib 0.6.2 (API 0.1), 0.10.2 (0.3), 0.11.2 (0.4) and
//! 0.12.0.1 (0.5) by compiling offsetof/sizeof of every field and constant pinned below
//! against each: all identical (0.12.1's `c_api.h` is byte for byte 0.12.0.1's). What changed is names only: `XLA_FFI_Extension_Base` became
//! `XLA_FFI_InternalExtension` (0.11; same layout, same Metadata type 1; a new, separate
//! `XLA_FFI_Extension` is not used here), `Error_GetMessage` became `Error_GetDetails`
//! (same slot), `ExecutionContext` is an alias of `InvokeContext`; `Metadata` gained a field
//! after `traits`, outside its declared STRUCT_SIZE (36), which is all we write. Handler
//! API versions each jaxlib registers (a handler reporting 0.N, tried for N = 0..6): 0.10.2
//! 0.1-0.3, 0.11.2 0.1-0.4, 0.12.0.1 0.1-0.5. So reporting 0.1 still serves all of them;
//! XLA promises old versions for at least 12 months after a newer one.

use std::ffi::{c_char, c_void};

/// `XLA_FFI_Error`: opaque, created by XLA (`Api::error_create`) and owned by it.
#[repr(C)]
pub struct FfiError {
    _opaque: [u8; 0],
}

/// `XLA_FFI_ExecutionContext`: opaque.
#[repr(C)]
pub struct ExecutionContext {
    _opaque: [u8; 0],
}

#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataType(pub i32);

impl DataType {
    pub const PRED: DataType = DataType(1);
    pub const S8: DataType = DataType(2);
    pub const S16: DataType = DataType(3);
    pub const S32: DataType = DataType(4);
    pub const S64: DataType = DataType(5);
    pub const U8: DataType = DataType(6);
    pub const U16: DataType = DataType(7);
    pub const U32: DataType = DataType(8);
    pub const U64: DataType = DataType(9);
    pub const F16: DataType = DataType(10);
    pub const F32: DataType = DataType(11);
    pub const F64: DataType = DataType(12);
    pub const C64: DataType = DataType(15);
    pub const BF16: DataType = DataType(16);
    pub const TOKEN: DataType = DataType(17);
    pub const C128: DataType = DataType(18);
}

#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgType(pub i32);
impl ArgType {
    pub const BUFFER: ArgType = ArgType(1);
}

#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrType(pub i32);
impl AttrType {
    pub const ARRAY: AttrType = AttrType(1);
    pub const DICTIONARY: AttrType = AttrType(2);
    pub const SCALAR: AttrType = AttrType(3);
    pub const STRING: AttrType = AttrType(4);
}

#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutionStage(pub i32);
impl ExecutionStage {
    pub const EXECUTE: ExecutionStage = ExecutionStage(3);
}

#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtensionType(pub i32);
impl ExtensionType {
    pub const METADATA: ExtensionType = ExtensionType(1);
}

/// absl status codes XLA understands.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorCode(pub i32);
impl ErrorCode {
    pub const INVALID_ARGUMENT: ErrorCode = ErrorCode(3);
    pub const DEADLINE_EXCEEDED: ErrorCode = ErrorCode(4);
    pub const UNIMPLEMENTED: ErrorCode = ErrorCode(12);
    pub const INTERNAL: ErrorCode = ErrorCode(13);
    pub const UNAVAILABLE: ErrorCode = ErrorCode(14);
}

#[repr(C)]
pub struct ExtensionBase {
    pub struct_size: usize,
    pub kind: ExtensionType,
    pub next: *mut ExtensionBase,
}

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub major_version: i32,
    pub minor_version: i32,
}
pub const API_VERSION_STRUCT_SIZE: usize = 24;

#[repr(C)]
pub struct Metadata {
    pub struct_size: usize,
    pub api_version: ApiVersion,
    pub traits: u32,
}
/// Declared size: offset of `traits` + 4 (sizeof is 40 with padding; never write past 36).
pub const METADATA_STRUCT_SIZE: usize = 36;

#[repr(C)]
pub struct MetadataExtension {
    pub extension_base: ExtensionBase,
    pub metadata: *mut Metadata,
}

#[repr(C)]
pub struct Buffer {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub dtype: DataType,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *mut i64,
}

#[repr(C)]
pub struct Args {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *mut ArgType,
    pub args: *mut *mut c_void,
}

/// Same layout as `Args`.
pub type Rets = Args;

#[repr(C)]
pub struct ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
pub struct Scalar {
    pub dtype: DataType,
    pub value: *mut c_void,
}

#[repr(C)]
pub struct Array {
    pub dtype: DataType,
    pub size: usize,
    pub data: *mut c_void,
}

#[repr(C)]
pub struct Attrs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *mut AttrType,
    pub names: *mut *mut ByteSpan,
    pub attrs: *mut *mut c_void,
}

#[repr(C)]
pub struct CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api: *const Api,
    pub ctx: *mut ExecutionContext,
    pub stage: ExecutionStage,
    pub args: Args,
    pub rets: Rets,
    pub attrs: Attrs,
    pub future: *mut c_void,
}
/// What XLA puts in `struct_size`: its size macro stops at `attrs` (`future` came later and
/// may be absent in older frames); sizeof is 176.
pub const CALL_FRAME_STRUCT_SIZE: usize = 168;

#[repr(C)]
pub struct ErrorCreateArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub message: *const c_char,
    pub errc: ErrorCode,
}

#[repr(C)]
pub struct StreamGetArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub ctx: *mut ExecutionContext,
    pub stream: *mut c_void,
}

/// `XLA_FFI_Error_GetDetails_Args` (jaxlib 0.11 and later), which extends 0.6-0.10's
/// `XLA_FFI_Error_GetMessage_Args` (the same fields up to `message`) with `errc`: a struct
/// of this size satisfies both functions' size checks, and the older one writes only
/// `message`. Both say the message is a NUL-terminated string the error owns.
#[repr(C)]
pub struct ErrorDetailsArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub error: *mut FfiError,
    pub message: *const c_char,
    pub errc: ErrorCode,
}

/// `XLA_FFI_Error_Destroy_Args`, the same in every supported jaxlib.
#[repr(C)]
pub struct ErrorDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub error: *mut FfiError,
}

pub type ErrorDetails = unsafe extern "C" fn(*mut ErrorDetailsArgs);
pub type ErrorDestroy = unsafe extern "C" fn(*mut ErrorDestroyArgs);

/// `XLA_FFI_Future`: opaque, created by XLA (`Api::future_create`), completed once by us.
#[repr(C)]
pub struct FfiFuture {
    _opaque: [u8; 0],
}

/// The arguments of `Future_Create`, `Future_SetAvailable` and `Future_SetError`: the
/// same header, the future (written by Create, read by the others) and, for SetError, the
/// error, whose ownership passes to XLA.
#[repr(C)]
pub struct FutureArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub future: *mut FfiFuture,
    pub error: *mut FfiError,
}

/// `RunId_Get` and `DeviceOrdinal_Get`'s arguments: the header, the call's context, the
/// value written (an int64 run id; an int32 ordinal, in the low half).
#[repr(C)]
pub struct ContextValueArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub ctx: *mut ExecutionContext,
    pub value: i64,
}

pub type ErrorCreate = unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut FfiError;
pub type ContextValueGet = unsafe extern "C" fn(*mut ContextValueArgs) -> *mut FfiError;
pub type StreamGet = unsafe extern "C" fn(*mut StreamGetArgs) -> *mut FfiError;
pub type FutureCall = unsafe extern "C" fn(*mut FutureArgs) -> *mut FfiError;

/// The leading part of `XLA_FFI_Api` up to the entries jaxmpi calls.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api_version: ApiVersion,
    pub internal_api: *mut c_void,
    pub error_create: Option<ErrorCreate>,
    pub error_get_message: *mut c_void,
    pub error_destroy: *mut c_void,
    pub handler_register: *mut c_void,
    pub stream_get: Option<StreamGet>,
    /// Entries jaxmpi does not call (TypeId_Register .. ThreadPool_NumThreads).
    pub _unused: [*mut c_void; 8],
    pub future_create: Option<FutureCall>,
    pub future_set_available: Option<FutureCall>,
    pub future_set_error: Option<FutureCall>,
    pub run_id_get: Option<ContextValueGet>,
    pub device_ordinal_get: Option<ContextValueGet>,
}
/// The least `Api::struct_size` that holds the future entries.
pub const API_WITH_FUTURES: usize = 176;
/// The least that holds `device_ordinal_get` (jaxlib 0.6.2 and later report 192).
pub const API_WITH_DEVICE_ORDINAL: usize = 192;

/// The C type of an FFI handler.
pub type Handler = unsafe extern "C" fn(*mut CallFrame) -> *mut FfiError;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_c_header() {
        assert_eq!(offset_of!(CallFrame, api), 16);
        assert_eq!(offset_of!(CallFrame, ctx), 24);
        assert_eq!(offset_of!(CallFrame, stage), 32);
        assert_eq!(offset_of!(CallFrame, args), 40);
        assert_eq!(offset_of!(CallFrame, rets), 80);
        assert_eq!(offset_of!(CallFrame, attrs), 120);
        assert_eq!(
            offset_of!(CallFrame, attrs) + size_of::<Attrs>(),
            CALL_FRAME_STRUCT_SIZE
        );
        assert_eq!(offset_of!(CallFrame, future), 168);
        assert_eq!(size_of::<CallFrame>(), 176);

        assert_eq!(size_of::<Args>(), 40);
        assert_eq!(offset_of!(Args, size), 16);
        assert_eq!(offset_of!(Args, types), 24);
        assert_eq!(offset_of!(Args, args), 32);
        assert_eq!(size_of::<Attrs>(), 48);
        assert_eq!(offset_of!(Attrs, names), 32);
        assert_eq!(offset_of!(Attrs, attrs), 40);

        assert_eq!(size_of::<Buffer>(), 48);
        assert_eq!(offset_of!(Buffer, dtype), 16);
        assert_eq!(offset_of!(Buffer, data), 24);
        assert_eq!(offset_of!(Buffer, rank), 32);
        assert_eq!(offset_of!(Buffer, dims), 40);

        assert_eq!(size_of::<Scalar>(), 16);
        assert_eq!(offset_of!(Scalar, value), 8);
        assert_eq!(size_of::<Array>(), 24);
        assert_eq!(offset_of!(Array, size), 8);
        assert_eq!(offset_of!(Array, data), 16);
        assert_eq!(size_of::<ByteSpan>(), 16);

        assert_eq!(size_of::<ExtensionBase>(), 24);
        assert_eq!(size_of::<ApiVersion>(), API_VERSION_STRUCT_SIZE);
        assert_eq!(offset_of!(ApiVersion, major_version), 16);
        assert_eq!(offset_of!(Metadata, api_version), 8);
        assert_eq!(offset_of!(Metadata, traits) + 4, METADATA_STRUCT_SIZE);
        assert_eq!(size_of::<MetadataExtension>(), 32);
        assert_eq!(offset_of!(MetadataExtension, metadata), 24);

        assert_eq!(offset_of!(ErrorCreateArgs, message), 16);
        assert_eq!(offset_of!(ErrorCreateArgs, errc) + 4, 28);
        assert_eq!(size_of::<StreamGetArgs>(), 32);
        // 0.6-0.10's GetMessage args end at `message` (32 bytes), 0.11's GetDetails args
        // at `errc` (36).
        assert_eq!(offset_of!(ErrorDetailsArgs, error), 16);
        assert_eq!(offset_of!(ErrorDetailsArgs, message), 24);
        assert_eq!(offset_of!(ErrorDetailsArgs, errc), 32);
        assert!(size_of::<ErrorDetailsArgs>() >= 36);
        assert_eq!(offset_of!(ErrorDestroyArgs, error), 16);
        assert_eq!(size_of::<ErrorDestroyArgs>(), 24);
        assert_eq!(offset_of!(StreamGetArgs, stream), 24);

        assert_eq!(offset_of!(Api, api_version), 16);
        assert_eq!(offset_of!(Api, internal_api), 40);
        assert_eq!(offset_of!(Api, error_create), 48);
        assert_eq!(offset_of!(Api, error_get_message), 56);
        assert_eq!(offset_of!(Api, error_destroy), 64);
        assert_eq!(offset_of!(Api, handler_register), 72);
        assert_eq!(offset_of!(Api, stream_get), 80);
        assert_eq!(offset_of!(Api, future_create), 152);
        assert_eq!(offset_of!(Api, future_set_available), 160);
        assert_eq!(offset_of!(Api, future_set_error), 168);
        assert_eq!(offset_of!(Api, run_id_get), API_WITH_FUTURES);
        assert_eq!(size_of::<Api>(), API_WITH_DEVICE_ORDINAL);
        // RunId's value is an int64 at 24; DeviceOrdinal's an int32 there (little-endian:
        // the low half of `value`).
        assert_eq!(offset_of!(ContextValueArgs, value), 24);
        // Create's declared size is 16, SetAvailable's 24 and SetError's 32: one struct of
        // 32 bytes is at least as large as each, with `future` and `error` where they are.
        assert_eq!(offset_of!(FutureArgs, future), 16);
        assert_eq!(offset_of!(FutureArgs, error), 24);
    }
}
