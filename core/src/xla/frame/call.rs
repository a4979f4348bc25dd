//! `Call`: safe, validated access to one XLA call frame — its data buffers (tokens are
//! skipped; each an `Operand`, `operand.rs`) and its raw attributes by name
//! (`attributes.rs` decodes them).

use std::ffi::c_void;

use super::deferred::Deferred;
use super::operand::{dtype_of, Operand};
use crate::xla::ffi::{
    ArgType, Args, AttrType, Buffer, ByteSpan, CallFrame, ContextValueArgs, ContextValueGet,
    DataType, ExecutionStage, Scalar, API_WITH_DEVICE_ORDINAL, CALL_FRAME_STRUCT_SIZE,
};
use crate::{Error, Input, Result};

pub struct Call<'a> {
    frame: &'a CallFrame,
    /// The same frame, for the one field a handler writes (`future`).
    raw: *mut CallFrame,
    /// The op being run (`allreduce`): what its errors are named after.
    name: &'static str,
    /// A started op's call (`starting`): its data results are the request value, then the
    /// op's own results (`results` of them), then the operands its transfer reads, passed
    /// through to the wait. `ret` and the like see the op's own results only.
    started: Option<usize>,
    /// The call's rank on its MeshComm (`xla/mesh/comm.rs`), where it runs on
    /// one: a peer given per rank is read at this rank's entry.
    rank_on_devices: Option<usize>,
}

impl<'a> Call<'a> {
    /// # Safety
    /// `frame` must be a call frame from XLA, valid for `'a`.
    pub unsafe fn new(frame: *mut CallFrame, name: &'static str) -> Result<Self> {
        // SAFETY: forwarded from the caller.
        match unsafe { Self::observed(frame, name) } {
            Some(call) => Ok(call),
            // SAFETY: as above.
            None => Err(unsafe { Self::unusable(&*frame, name) }),
        }
    }

    /// Why `observed` refused `frame`.
    #[cold]
    fn unusable(frame: &CallFrame, name: &'static str) -> Error {
        // Frames smaller than the declared size come from an XLA this file does not know.
        if frame.struct_size < CALL_FRAME_STRUCT_SIZE {
            return Error::unsupported(
                name,
                format!(
                    "XLA call frame of {} bytes is older than XLA FFI API 0.1",
                    frame.struct_size
                ),
            );
        }
        Error::unsupported(
            name,
            format!("called for execution stage {}, not EXECUTE", frame.stage.0),
        )
    }

    /// The call on `frame`, None where XLA's frame is one this file cannot read (`new`
    /// says why): for a reader beside the handler's path (the profile,
    /// `handlers/profiled.rs`), which has no error to report.
    ///
    /// # Safety
    /// As `new`'s.
    pub unsafe fn observed(frame: *mut CallFrame, name: &'static str) -> Option<Self> {
        // SAFETY: forwarded from the caller.
        let checked = unsafe { &*frame };
        let usable = checked.struct_size >= CALL_FRAME_STRUCT_SIZE
            && checked.stage == ExecutionStage::EXECUTE;
        usable.then_some(Call {
            frame: checked,
            raw: frame,
            name,
            started: None,
            rank_on_devices: None,
        })
    }

    /// The same call, as rank `rank` of a MeshComm.
    pub fn on_device_rank(self, rank: usize) -> Self {
        Call {
            rank_on_devices: Some(rank),
            ..self
        }
    }

    /// The call's rank on its MeshComm, where it runs on one.
    pub fn device_rank(&self) -> Option<usize> {
        self.rank_on_devices
    }

    /// The int64 attribute `name`, or, where it is one per rank (an array: a peer on a
    /// MeshComm), this call's rank's.
    pub fn per_rank_i64(&self, name: &str) -> Result<i64> {
        if self.find_attr(name, AttrType::ARRAY).is_none() {
            return self.scalar_i64(name);
        }
        let values = self.array_i64(name)?;
        let rank = self.rank_on_devices.ok_or_else(|| {
            self.bad_attr(name, "is given per rank, but the op runs on no MeshComm")
        })?;
        values.get(rank).copied().ok_or_else(|| {
            self.bad_attr(
                name,
                format_args!("has {} entries; rank {rank} has none", values.len()),
            )
        })
    }

    /// This call as its started op's body sees it (`declare_ops!`'s `started` rows): the
    /// results its lowering says (`results`) after the request value.
    pub fn starting(self) -> Result<Self> {
        let results = self.scalar_i64("results")?;
        let results = usize::try_from(results)
            .map_err(|_| self.bad_attr("results", format_args!("= {results} is negative")))?;
        Ok(Call {
            started: Some(results),
            ..self
        })
    }

    /// Whether this is a started op's call: its transfer starts, a wait completes it.
    pub fn is_start(&self) -> bool {
        self.started.is_some()
    }

    /// A started op's request value (its first result).
    pub fn request(&self) -> Result<Operand<'a>> {
        self.buffer(&self.frame.rets, 0, "result")
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn frame(&self) -> &'a CallFrame {
        self.frame
    }

    /// Makes this call complete later: XLA gets a future instead of the handler's return
    /// (`None` where this XLA has no futures). The call must then return `Ok`.
    pub fn defer(&self) -> Option<Deferred> {
        // SAFETY: `raw` is this call's live frame (Call::new), which the handler may write.
        unsafe { Deferred::create(self.raw) }
    }

    /// The data buffers (tokens skipped) of `list`.
    fn data_buffers(list: &'a Args) -> impl Iterator<Item = &'a Buffer> {
        let size = usize::try_from(list.size).unwrap_or(0);
        (0..size).filter_map(move |i| {
            // SAFETY: XLA gives `size` entries in both arrays.
            let (kind, ptr) = unsafe { (*list.types.add(i), *list.args.add(i)) };
            if kind != ArgType::BUFFER {
                return None;
            }
            // SAFETY: a BUFFER entry points to an XLA_FFI_Buffer.
            let buffer = unsafe { &*(ptr as *const Buffer) };
            (buffer.dtype != DataType::TOKEN).then_some(buffer)
        })
    }

    /// The `index`-th data buffer (tokens skipped) of `list`, if there is one.
    fn find_buffer(&self, list: &'a Args, index: usize) -> Option<Operand<'a>> {
        Self::data_buffers(list).nth(index).map(|buffer| Operand {
            buffer,
            op: self.name,
        })
    }

    fn buffer(&self, list: &'a Args, index: usize, what: &str) -> Result<Operand<'a>> {
        self.find_buffer(list, index).ok_or_else(|| {
            Error::invalid_argument(
                self.name,
                format!("the call has no {what} #{index}: the lowering and the handler disagree"),
            )
        })
    }

    pub fn arg(&self, index: usize) -> Result<Operand<'a>> {
        self.buffer(&self.frame.args, index, "operand")
    }

    /// The `index`-th operand where the lowering passed one (a template never read is not).
    pub fn optional_arg(&self, index: usize) -> Option<Operand<'a>> {
        self.find_buffer(&self.frame.args, index)
    }

    /// How many data operands the call has (tokens not counted).
    pub fn args_len(&self) -> usize {
        Self::data_buffers(&self.frame.args).count()
    }

    /// How many data results the op has (tokens not counted; of a started op, its own).
    pub fn rets_len(&self) -> usize {
        self.started
            .unwrap_or_else(|| Self::data_buffers(&self.frame.rets).count())
    }

    /// Where the op's `index`-th result is among the call's (None: it has no such result).
    fn ret_at(&self, index: usize) -> Option<usize> {
        match self.started {
            None => Some(index),
            Some(results) => (index < results).then_some(index + 1),
        }
    }

    pub fn ret(&self, index: usize) -> Result<Operand<'a>> {
        let at = self.ret_at(index).unwrap_or(usize::MAX);
        self.buffer(&self.frame.rets, at, "result")
    }

    /// The `index`-th result where the lowering bound one (rooted ops bind none on the
    /// ranks that receive nothing).
    pub fn optional_ret(&self, index: usize) -> Option<Operand<'a>> {
        self.find_buffer(&self.frame.rets, self.ret_at(index)?)
    }

    /// The first operand as the send side of a reduction whose result is `ret(0)`:
    /// in place when XLA aliased them.
    pub fn reduction_input(&self) -> Result<Input<'a>> {
        let (arg, ret) = (self.arg(0)?, self.ret(0)?);
        if arg.data() == ret.data() && arg.count() > 0 {
            return Ok(Input::InPlace);
        }
        Ok(Input::Data(arg.buf()?))
    }

    /// The attribute `name` if the call has it with kind `want`.
    fn find_attr(&self, name: &str, want: AttrType) -> Option<*mut c_void> {
        let attrs = &self.frame.attrs;
        let size = usize::try_from(attrs.size).unwrap_or(0);
        for i in 0..size {
            // SAFETY: XLA gives `size` entries in each array; names are byte spans.
            let (kind, span, ptr) = unsafe {
                (
                    *attrs.types.add(i),
                    &**attrs.names.add(i),
                    *attrs.attrs.add(i),
                )
            };
            // SAFETY: a byte span of `len` bytes.
            let key = unsafe { std::slice::from_raw_parts(span.ptr as *const u8, span.len) };
            if key == name.as_bytes() {
                return (kind == want).then_some(ptr);
            }
        }
        None
    }

    /// The one error for an attribute the lowering did not pass as declared.
    pub fn bad_attr(&self, name: &str, what: impl std::fmt::Display) -> Error {
        Error::invalid_argument(self.name, format!("attribute {name:?} {what}"))
    }

    fn attr_ptr(&self, name: &str, want: AttrType) -> Result<*mut c_void> {
        self.find_attr(name, want).ok_or_else(|| {
            self.bad_attr(
                name,
                "is missing or has the wrong kind: the lowering and the op's declaration disagree",
            )
        })
    }

    /// An int64 scalar attribute the op may not have (for describing a call).
    pub fn optional_i64(&self, name: &str) -> Option<i64> {
        // Looked up without making the error a missing attribute is (describing a call
        // asks for many an op does not have: this runs at every started op).
        let ptr = self.find_attr(name, AttrType::SCALAR)?;
        // SAFETY: a SCALAR attribute points to an XLA_FFI_Scalar.
        let scalar = unsafe { &*(ptr as *const Scalar) };
        // SAFETY: the value has the checked type.
        (scalar.dtype == DataType::S64).then(|| unsafe { *(scalar.value as *const i64) })
    }

    /// The string attribute `name` if the call has it.
    pub fn optional_text(&self, name: &str) -> Option<&'a str> {
        self.find_attr(name, AttrType::STRING)?;
        self.text(name).ok()
    }

    /// Bytes of what the call sends: its first data operand, or every one where `variadic`
    /// (one declared operand that XLA may hand over as several arrays: an all-reduce of a
    /// gradient's arrays, merged); for a receive, which has no operand, of its last result:
    /// what it can receive (an irecv's first result is its request).
    pub fn operand_bytes(&self, variadic: bool) -> usize {
        let bytes = |buffer: &Buffer| {
            let count = Operand {
                buffer,
                op: self.name,
            }
            .count();
            count * dtype_of(self.name, buffer.dtype).map_or(0, |d| d.size())
        };
        let mut args = Self::data_buffers(&self.frame.args).peekable();
        if args.peek().is_none() {
            return Self::data_buffers(&self.frame.rets).last().map_or(0, bytes);
        }
        match variadic {
            true => args.map(bytes).sum(),
            false => args.next().map_or(0, bytes),
        }
    }

    /// The int64 scalar attribute `name`.
    pub fn scalar_i64(&self, name: &str) -> Result<i64> {
        let ptr = self.attr_ptr(name, AttrType::SCALAR)?;
        // SAFETY: a SCALAR attribute points to an XLA_FFI_Scalar.
        let scalar = unsafe { &*(ptr as *const Scalar) };
        if scalar.dtype != DataType::S64 {
            return Err(self.bad_attr(name, "is not an int64"));
        }
        // SAFETY: the value has the checked type.
        Ok(unsafe { *(scalar.value as *const i64) })
    }

    /// The string attribute `name`.
    pub fn text(&self, name: &str) -> Result<&'a str> {
        let ptr = self.attr_ptr(name, AttrType::STRING)?;
        // SAFETY: a STRING attribute points to a byte span, alive as long as the frame.
        let bytes = unsafe {
            let span = &*(ptr as *const ByteSpan);
            std::slice::from_raw_parts(span.ptr as *const u8, span.len)
        };
        std::str::from_utf8(bytes).map_err(|_| self.bad_attr(name, "is not UTF-8"))
    }

    /// A value of the call's execution context (`RunId_Get`, `DeviceOrdinal_Get`).
    fn context_value(
        &self,
        what: &str,
        get: impl Fn(&crate::xla::ffi::Api) -> Option<ContextValueGet>,
    ) -> Result<i64> {
        let unavailable = || {
            Error::unsupported(
                self.name,
                format!("this XLA does not give a call its {what}"),
            )
        };
        // SAFETY: XLA's API table lives as long as the process.
        let api = unsafe { self.frame.api.as_ref() }.ok_or_else(unavailable)?;
        if api.struct_size < API_WITH_DEVICE_ORDINAL {
            return Err(unavailable());
        }
        let get = get(api).ok_or_else(unavailable)?;
        let mut args = ContextValueArgs {
            struct_size: std::mem::size_of::<ContextValueArgs>(),
            extension_start: std::ptr::null_mut(),
            ctx: self.frame.ctx,
            value: 0,
        };
        // SAFETY: the frame's own context, and arguments of the size XLA checks.
        let error = unsafe { get(&mut args) };
        if !error.is_null() {
            return Err(unavailable());
        }
        Ok(args.value)
    }

    /// The global id of the device this call runs on (a jax `Device.id`).
    pub fn device(&self) -> Result<i64> {
        // An int32 written into the low half.
        let value = self.context_value("device", |api| api.device_ordinal_get)?;
        Ok(i64::from(value as i32))
    }

    /// The 1-D int64 array attribute `name`.
    pub fn array_i64(&self, name: &str) -> Result<&'a [i64]> {
        let ptr = self.attr_ptr(name, AttrType::ARRAY)?;
        // SAFETY: an ARRAY attribute points to an XLA_FFI_Array.
        let array = unsafe { &*(ptr as *const crate::xla::ffi::Array) };
        if array.dtype != DataType::S64 {
            return Err(self.bad_attr(name, "is not an int64 array"));
        }
        if array.size == 0 {
            return Ok(&[]); // `data` may be NULL then
        }
        // SAFETY: `size` int64 values at `data`, alive as long as the frame.
        Ok(unsafe { std::slice::from_raw_parts(array.data as *const i64, array.size) })
    }
}
