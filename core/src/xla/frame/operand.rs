//! `Operand`: one data buffer of a call (an operand or a result), as an op body reads it:
//! its memory, its XLA element type as a `Dtype`, its shape (elements, rows of the leading
//! axis) and the `Buf`/`BufMut` views the backend takes. `Call` finds the buffers in the
//! frame; what a buffer is, once found, is this file's.

use std::ffi::c_void;

use crate::xla::ffi::{Buffer, DataType};
use crate::{Buf, BufMut, Dtype, Error, Result};

/// A data buffer of the call: its memory, element type and shape, and the op it belongs to
/// (what its errors are named after).
pub struct Operand<'a> {
    pub(super) buffer: &'a Buffer,
    pub(super) op: &'static str,
}

pub(super) fn dtype_of(name: &'static str, dtype: DataType) -> Result<Dtype> {
    Ok(match dtype {
        DataType::PRED => Dtype::Bool,
        DataType::S8 => Dtype::I8,
        DataType::S16 => Dtype::I16,
        DataType::S32 => Dtype::I32,
        DataType::S64 => Dtype::I64,
        DataType::U8 => Dtype::U8,
        DataType::U16 => Dtype::U16,
        DataType::U32 => Dtype::U32,
        DataType::U64 => Dtype::U64,
        DataType::F16 => Dtype::F16,
        DataType::BF16 => Dtype::BF16,
        DataType::F32 => Dtype::F32,
        DataType::F64 => Dtype::F64,
        DataType::C64 => Dtype::C64,
        DataType::C128 => Dtype::C128,
        other => {
            return Err(Error::invalid_argument(
                name,
                format!("XLA element type {} is not supported", other.0),
            ))
        }
    })
}

impl<'a> Operand<'a> {
    pub fn dtype(&self) -> Result<Dtype> {
        dtype_of(self.op, self.buffer.dtype)
    }

    pub fn count(&self) -> usize {
        let rank = usize::try_from(self.buffer.rank).unwrap_or(0);
        if rank == 0 || self.buffer.dims.is_null() {
            return 1;
        }
        // SAFETY: XLA gives `rank` dimensions at `dims`.
        let dims = unsafe { std::slice::from_raw_parts(self.buffer.dims, rank) };
        dims.iter()
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .product()
    }

    /// Elements per entry of the leading axis (a row of a v-op's block).
    pub fn row(&self) -> usize {
        let rank = usize::try_from(self.buffer.rank).unwrap_or(0);
        if rank <= 1 || self.buffer.dims.is_null() {
            return 1;
        }
        // SAFETY: XLA gives `rank` dimensions at `dims`.
        let dims = unsafe { std::slice::from_raw_parts(self.buffer.dims, rank) };
        dims[1..]
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .product()
    }

    pub fn data(&self) -> *mut c_void {
        self.buffer.data
    }

    pub fn len_bytes(&self) -> usize {
        self.count() * self.dtype().map_or(0, Dtype::size)
    }

    /// The buffer as input. XLA owns the memory for the duration of the call.
    pub fn buf(&self) -> Result<Buf<'a>> {
        let dtype = self.dtype()?;
        // SAFETY: XLA's buffer holds `count` elements of its dtype (or is empty).
        Ok(unsafe { Buf::from_raw(self.buffer.data as *const u8, self.count(), dtype) })
    }

    /// An int32 or int64 operand's values (run-time counts), which must be host memory.
    pub fn integers(&self) -> Result<Vec<i64>> {
        let buf = self.buf()?;
        if buf.count() == 0 {
            return Ok(Vec::new()); // `data` may be NULL then
        }
        let (ptr, count) = (buf.ptr(), buf.count());
        Ok(match buf.dtype() {
            Dtype::I64 => {
                // SAFETY: XLA's buffer holds `count` int64 values, alive for the call.
                let values = unsafe { std::slice::from_raw_parts(ptr.cast::<i64>(), count) };
                values.to_vec()
            }
            Dtype::I32 => {
                // SAFETY: XLA's buffer holds `count` int32 values, alive for the call.
                let values = unsafe { std::slice::from_raw_parts(ptr.cast::<i32>(), count) };
                values.iter().map(|&v| i64::from(v)).collect()
            }
            other => {
                return Err(Error::invalid_argument(
                    self.op,
                    format!("counts must be int32 or int64, got {other}"),
                ))
            }
        })
    }

    /// The buffer as output.
    pub fn buf_mut(&self) -> Result<BufMut<'a>> {
        let dtype = self.dtype()?;
        // SAFETY: as for `buf`; XLA gives this result buffer to this call alone.
        Ok(unsafe { BufMut::from_raw(self.buffer.data as *mut u8, self.count(), dtype) })
    }
}
