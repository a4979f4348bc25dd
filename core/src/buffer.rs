//! Buffers as a backend sees them: a typed, counted view of memory it may read or write.
//!
//! The unsafety of raw memory is paid once, where a buffer is made from a raw pointer (the
//! XLA handler, which got it from XLA); everything downstream is safe to call.

use std::marker::PhantomData;

use crate::{Dtype, Error, Result};

/// Memory a backend may read: `count` elements of `dtype` starting at `ptr`.
#[derive(Clone, Copy, Debug)]
pub struct Buf<'a> {
    ptr: *const u8,
    count: usize,
    dtype: Dtype,
    _borrow: PhantomData<&'a [u8]>,
}

/// Memory a backend may write (and, for in/out arguments such as bcast's, read).
#[derive(Debug)]
pub struct BufMut<'a> {
    ptr: *mut u8,
    count: usize,
    dtype: Dtype,
    _borrow: PhantomData<&'a mut [u8]>,
}

/// The send side of a reduction: separate data, or MPI_IN_PLACE (the input already sits
/// in the receive buffer, e.g. when XLA aliases an op's output to its input).
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    Data(Buf<'a>),
    InPlace,
}

fn whole_elements(len: usize, dtype: Dtype) -> Result<usize> {
    if len % dtype.size() != 0 {
        return Err(Error::invalid_argument(
            "buffer",
            format!(
                "{len} bytes is not a whole number of {dtype} elements ({} bytes each)",
                dtype.size()
            ),
        ));
    }
    Ok(len / dtype.size())
}

impl<'a> Buf<'a> {
    /// Views `bytes` as elements of `dtype`.
    pub fn from_bytes(bytes: &'a [u8], dtype: Dtype) -> Result<Self> {
        let count = whole_elements(bytes.len(), dtype)?;
        Ok(Buf {
            ptr: bytes.as_ptr(),
            count,
            dtype,
            _borrow: PhantomData,
        })
    }

    /// # Safety
    /// `ptr` must be valid for reads of `count * dtype.size()` bytes for `'a`, or `count`
    /// must be 0 (then `ptr` may be null).
    pub unsafe fn from_raw(ptr: *const u8, count: usize, dtype: Dtype) -> Self {
        Buf {
            ptr,
            count,
            dtype,
            _borrow: PhantomData,
        }
    }

    pub fn ptr(&self) -> *const u8 {
        self.ptr
    }
    pub fn count(&self) -> usize {
        self.count
    }
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    pub fn len_bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
}

impl<'a> BufMut<'a> {
    /// Views `bytes` as elements of `dtype`.
    pub fn from_bytes(bytes: &'a mut [u8], dtype: Dtype) -> Result<Self> {
        let count = whole_elements(bytes.len(), dtype)?;
        Ok(BufMut {
            ptr: bytes.as_mut_ptr(),
            count,
            dtype,
            _borrow: PhantomData,
        })
    }

    /// # Safety
    /// `ptr` must be valid for reads and writes of `count * dtype.size()` bytes for `'a`
    /// and not be accessed through any other path meanwhile, or `count` must be 0.
    pub unsafe fn from_raw(ptr: *mut u8, count: usize, dtype: Dtype) -> Self {
        BufMut {
            ptr,
            count,
            dtype,
            _borrow: PhantomData,
        }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn count(&self) -> usize {
        self.count
    }
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    pub fn len_bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
}

impl Input<'_> {
    pub fn is_in_place(&self) -> bool {
        matches!(self, Input::InPlace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_bytes_counts_elements_and_refuses_partial_ones() {
        let data = [0u8; 12];
        let buf = Buf::from_bytes(&data, Dtype::F32).unwrap();
        assert_eq!((buf.count(), buf.len_bytes()), (3, 12));
        let err = Buf::from_bytes(&data[..10], Dtype::F64).unwrap_err();
        assert!(err
            .to_string()
            .contains("10 bytes is not a whole number of float64"));
        let mut out = [0u8; 32];
        assert_eq!(
            BufMut::from_bytes(&mut out, Dtype::C128).unwrap().count(),
            2
        );
    }
}
