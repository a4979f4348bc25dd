//! Elements in memory: `Value`, the dtype-independent form every check compares, and
//! `Array`, an aligned buffer of one dtype as a backend sees it through `Buf`/`BufMut`.

use std::fmt;

use half::{bf16, f16};
use jaxmpi_core::{Buf, BufMut, Dtype};

/// One element, in a domain wide enough to hold every dtype exactly. `bool` is `Int(0|1)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Int(i128),
    Float(f64),
    Complex(f64, f64),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{v}"),
            Value::Complex(re, im) => write!(f, "({re}{im:+}j)"),
        }
    }
}

/// The value as the dtype can hold it (integers wrap, floats round).
pub fn normalize(dtype: Dtype, value: Value) -> Value {
    let mut bytes = [0u8; 16];
    encode(dtype, value, &mut bytes);
    decode(dtype, &bytes)
}

/// Writes `value` as one element of `dtype` into the first `dtype.size()` bytes of `out`.
fn encode(dtype: Dtype, value: Value, out: &mut [u8]) {
    let (int, re, im) = match value {
        Value::Int(v) => (v, v as f64, 0.0),
        Value::Float(v) => (v as i128, v, 0.0),
        Value::Complex(re, im) => (re as i128, re, im),
    };
    let mut put = |bytes: &[u8]| out[..bytes.len()].copy_from_slice(bytes);
    match dtype {
        Dtype::Bool | Dtype::I8 => put(&(int as i8).to_ne_bytes()),
        Dtype::U8 => put(&(int as u8).to_ne_bytes()),
        Dtype::I16 => put(&(int as i16).to_ne_bytes()),
        Dtype::U16 => put(&(int as u16).to_ne_bytes()),
        Dtype::I32 => put(&(int as i32).to_ne_bytes()),
        Dtype::U32 => put(&(int as u32).to_ne_bytes()),
        Dtype::I64 => put(&(int as i64).to_ne_bytes()),
        Dtype::U64 => put(&(int as u64).to_ne_bytes()),
        Dtype::F16 => put(&f16::from_f64(re).to_bits().to_ne_bytes()),
        Dtype::BF16 => put(&bf16::from_f64(re).to_bits().to_ne_bytes()),
        Dtype::F32 => put(&(re as f32).to_ne_bytes()),
        Dtype::F64 => put(&re.to_ne_bytes()),
        Dtype::C64 => put(&[(re as f32).to_ne_bytes(), (im as f32).to_ne_bytes()].concat()),
        Dtype::C128 => put(&[re.to_ne_bytes(), im.to_ne_bytes()].concat()),
    }
}

/// Reads one element of `dtype` from the first `dtype.size()` bytes of `bytes`.
fn decode(dtype: Dtype, bytes: &[u8]) -> Value {
    fn take<const N: usize>(bytes: &[u8]) -> [u8; N] {
        bytes[..N]
            .try_into()
            .expect("callers pass at least dtype.size() bytes")
    }
    let f32_at = |at: usize| f64::from(f32::from_ne_bytes(take(&bytes[at..])));
    let f64_at = |at: usize| f64::from_ne_bytes(take(&bytes[at..]));
    match dtype {
        // A bool byte other than 0/1 stays visible as such.
        Dtype::Bool | Dtype::U8 => Value::Int(bytes[0].into()),
        Dtype::I8 => Value::Int(i8::from_ne_bytes(take(bytes)).into()),
        Dtype::I16 => Value::Int(i16::from_ne_bytes(take(bytes)).into()),
        Dtype::U16 => Value::Int(u16::from_ne_bytes(take(bytes)).into()),
        Dtype::I32 => Value::Int(i32::from_ne_bytes(take(bytes)).into()),
        Dtype::U32 => Value::Int(u32::from_ne_bytes(take(bytes)).into()),
        Dtype::I64 => Value::Int(i64::from_ne_bytes(take(bytes)).into()),
        Dtype::U64 => Value::Int(u64::from_ne_bytes(take(bytes)).into()),
        Dtype::F16 => Value::Float(f16::from_bits(u16::from_ne_bytes(take(bytes))).into()),
        Dtype::BF16 => Value::Float(bf16::from_bits(u16::from_ne_bytes(take(bytes))).into()),
        Dtype::F32 => Value::Float(f32_at(0)),
        Dtype::F64 => Value::Float(f64_at(0)),
        Dtype::C64 => Value::Complex(f32_at(0), f32_at(4)),
        Dtype::C128 => Value::Complex(f64_at(0), f64_at(8)),
    }
}

/// Alignment of every buffer handed to MPI: libraries' vectorized reduction loops may
/// assume element alignment, as real (XLA) buffers always provide.
const ALIGN: usize = 64;

/// A typed, aligned array of elements, as a backend sees it through `Buf`/`BufMut`.
pub struct Array {
    pub dtype: Dtype,
    storage: Vec<u8>,
    start: usize,
    count: usize,
}

/// Not derived: a copied `Vec` has its own address, so the aligned start moves.
impl Clone for Array {
    fn clone(&self) -> Array {
        let mut copy = Array::zeroed(self.dtype, self.count);
        copy.bytes_mut().copy_from_slice(self.bytes());
        copy
    }
}

impl Array {
    pub fn zeroed(dtype: Dtype, count: usize) -> Array {
        let storage = vec![0u8; count * dtype.size() + ALIGN];
        // align_offset may decline (usize::MAX); the buffer is then merely unaligned.
        let start = storage.as_ptr().align_offset(ALIGN).min(ALIGN);
        Array {
            dtype,
            storage,
            start,
            count,
        }
    }

    pub fn from_fn(dtype: Dtype, count: usize, mut element: impl FnMut(usize) -> Value) -> Array {
        let mut array = Array::zeroed(dtype, count);
        for i in 0..count {
            array.set(i, element(i));
        }
        array
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn bytes(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.count * self.dtype.size()]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.count * self.dtype.size();
        &mut self.storage[self.start..self.start + len]
    }

    pub fn get(&self, index: usize) -> Value {
        decode(self.dtype, &self.bytes()[index * self.dtype.size()..])
    }

    pub fn set(&mut self, index: usize, value: Value) {
        let size = self.dtype.size();
        let dtype = self.dtype;
        encode(dtype, value, &mut self.bytes_mut()[index * size..]);
    }

    pub fn buf(&self) -> Buf<'_> {
        Buf::from_bytes(self.bytes(), self.dtype).expect("whole elements by construction")
    }

    pub fn buf_mut(&mut self) -> BufMut<'_> {
        let dtype = self.dtype;
        BufMut::from_bytes(self.bytes_mut(), dtype).expect("whole elements by construction")
    }

    /// The first element where `self` and `other` hold different values (not merely
    /// different bytes: -0.0 equals 0.0), with both values.
    pub fn first_difference(&self, other: &Array) -> Option<(usize, Value, Value)> {
        if self.bytes() == other.bytes() {
            return None;
        }
        (0..self.count.min(other.count))
            .map(|i| (i, self.get(i), other.get(i)))
            .find(|(_, a, b)| a != b)
    }
}
