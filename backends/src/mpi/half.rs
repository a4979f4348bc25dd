//! Reductions on float16 and bfloat16. No MPI family offers predefined ops for both, so
//! jaxmpi creates its own once per (type, op): each element is widened to f32, combined,
//! and rounded back, which gives the same result as native half-precision arithmetic.

use std::ffi::{c_int, c_void};

use half::{bf16, f16};
use jaxmpi_core::{Dtype, ReduceOp};

use super::functions::UserFunction;

/// The ops that exist for half floats, in the order `ops()` lists their callbacks.
pub const HALF_OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

trait HalfFloat: Copy {
    fn widen(self) -> f32;
    fn narrow(value: f32) -> Self;
}

impl HalfFloat for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(value: f32) -> Self {
        f16::from_f32(value)
    }
}

impl HalfFloat for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(value: f32) -> Self {
        bf16::from_f32(value)
    }
}

/// Op codes for the const generic; they index `HALF_OPS`.
const SUM: u8 = 0;
const PROD: u8 = 1;
const MIN: u8 = 2;
const MAX: u8 = 3;

fn combine<const OP: u8>(a: f32, b: f32) -> f32 {
    match OP {
        SUM => a + b,
        PROD => a * b,
        // NaN propagates, as numpy's minimum/maximum do.
        MIN => {
            if a.is_nan() || a < b {
                a
            } else {
                b
            }
        }
        _ => {
            if a.is_nan() || a > b {
                a
            } else {
                b
            }
        }
    }
}

/// `MPI_User_function`: `inout[i] = invec[i] OP inout[i]`.
unsafe extern "C" fn reduce<T: HalfFloat, const OP: u8>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut c_void,
) {
    // SAFETY: MPI passes two buffers of `*len` elements of the datatype the op was used
    // with, which jaxmpi only ever pairs with a 2-byte type holding `T`.
    let (input, inout) = unsafe {
        let n = usize::try_from(*len).unwrap_or(0);
        (
            std::slice::from_raw_parts(invec as *const T, n),
            std::slice::from_raw_parts_mut(inoutvec as *mut T, n),
        )
    };
    for (acc, &x) in inout.iter_mut().zip(input) {
        *acc = T::narrow(combine::<OP>(x.widen(), acc.widen()));
    }
}

/// The callback for (dtype, op), if jaxmpi defines one.
pub fn callback(dtype: Dtype, op: ReduceOp) -> Option<UserFunction> {
    fn table<T: HalfFloat>() -> [UserFunction; 4] {
        [
            reduce::<T, SUM>,
            reduce::<T, PROD>,
            reduce::<T, MIN>,
            reduce::<T, MAX>,
        ]
    }
    let index = HALF_OPS.iter().position(|&o| o == op)?;
    match dtype {
        Dtype::F16 => Some(table::<f16>()[index]),
        Dtype::BF16 => Some(table::<bf16>()[index]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(dtype: Dtype, op: ReduceOp, input: &mut [u16], inout: &mut [u16]) {
        let f = callback(dtype, op).unwrap();
        let mut len = input.len() as c_int;
        // SAFETY: both slices hold `len` 2-byte elements.
        unsafe {
            f(
                input.as_mut_ptr().cast(),
                inout.as_mut_ptr().cast(),
                &mut len,
                std::ptr::null_mut(),
            )
        };
    }

    #[test]
    fn f16_ops_match_f32_arithmetic_rounded() {
        let a = [1.5f32, -2.0, 65504.0, 0.1];
        let b = [2.25f32, 3.0, 1.0, 0.2];
        for (op, expect) in [
            (ReduceOp::Sum, [3.75, 1.0, 65504.0, 0.3]),
            (ReduceOp::Prod, [3.375, -6.0, 65504.0, 0.02]),
            (ReduceOp::Min, [1.5, -2.0, 1.0, 0.1]),
            (ReduceOp::Max, [2.25, 3.0, 65504.0, 0.2]),
        ] {
            let mut x: Vec<u16> = a.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
            let mut y: Vec<u16> = b.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
            apply(Dtype::F16, op, &mut x, &mut y);
            let got: Vec<f32> = y.iter().map(|&v| f16::from_bits(v).to_f32()).collect();
            let want: Vec<f32> = expect.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
            // Inputs rounded to f16 first: 0.1+0.2 in f16 is within one ulp of f16(0.3).
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= w.abs() * 1e-3,
                    "{op:?}: {got:?} vs {want:?}"
                );
            }
        }
    }

    #[test]
    fn bf16_sum_and_nan_propagation() {
        let mut x = vec![bf16::from_f32(1.0).to_bits(), bf16::NAN.to_bits()];
        let mut y = vec![
            bf16::from_f32(256.0).to_bits(),
            bf16::from_f32(3.0).to_bits(),
        ];
        apply(Dtype::BF16, ReduceOp::Sum, &mut x, &mut y);
        // 257 is not representable in bf16 (8 bits of mantissa): rounds to 256.
        assert_eq!(bf16::from_bits(y[0]).to_f32(), 256.0);
        assert!(bf16::from_bits(y[1]).is_nan());
        let mut x = vec![bf16::NAN.to_bits()];
        let mut y = vec![bf16::from_f32(3.0).to_bits()];
        apply(Dtype::BF16, ReduceOp::Max, &mut x, &mut y);
        assert!(bf16::from_bits(y[0]).is_nan());
    }

    #[test]
    fn only_arithmetic_ops_on_half_types_have_callbacks() {
        assert!(callback(Dtype::F16, ReduceOp::Band).is_none());
        assert!(callback(Dtype::F32, ReduceOp::Sum).is_none());
        assert!(callback(Dtype::BF16, ReduceOp::Min).is_some());
    }
}
