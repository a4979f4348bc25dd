//! Reductions jaxmpi brings itself, created once per (dtype, op) with `MPI_Op_create`:
//! - float16 and bfloat16, for which no MPI family has predefined reductions: each
//!   element is widened to f32, combined and rounded back, which gives the same result as
//!   native half-precision arithmetic;
//! - MIN/MAX on every float type, so that a NaN on any rank gives NaN, as XLA's (and
//!   numpy's) minimum/maximum do: MPI's own MPI_MIN/MPI_MAX keep or drop a NaN by which
//!   rank holds it (MPICH, Open MPI) or drop it (Intel MPI 2021), so a `pmax` over
//!   devices would answer by where the NaN sits (benches/RESULTS.md, issue 50);
//! - unsigned MIN/MAX, for libraries whose own compare them as signed (see `quirks`).
//!
//! Why float MIN/MAX are ops of jaxmpi's own and not MPI_MAX/MPI_MIN on integers around
//! an order-preserving map of the bits (issue 58, benches/RESULTS.md): the map costs two
//! more passes over the data (map, map back), each as much local work as a reduction,
//! and made a float32 MAX allreduce 1.77x a SUM at 1 Mi and 4 Mi elements on 2 ranks of
//! PyPI MPICH. The element loop is faster than MPICH's own; what cost these ops 1.07-1.18x
//! a SUM there was MPICH's choice of algorithm: recursive doubling for a user-defined op
//! (every rank combines the whole vector), reduce-scatter + allgather for a predefined
//! one (each combines its share). So on MPICH a large allreduce of these ops goes round
//! a ring jaxmpi makes itself (`ring.rs`): 0.86x a SUM at 4 Mi. At 4 and 16 KiB (0.72x
//! a SUM), and for MPI_Reduce (binomial against reduce-scatter + gather), MPICH's choice
//! for a user-defined op is the faster one; Open MPI chooses by commutativity alone.

use std::ffi::{c_int, c_void};

use half::{bf16, f16};
use jaxmpi_core::{Dtype, ReduceOp};

use super::functions::UserFunction;

/// Op codes for the const generic, in `OPS` order.
const SUM: u8 = 0;
const PROD: u8 = 1;
const MIN: u8 = 2;
const MAX: u8 = 3;
const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

trait Element: Copy {
    fn combine<const OP: u8>(a: Self, b: Self) -> Self;
}

/// MIN/MAX that propagate NaN whichever operand holds it: `a` where it is NaN or wins,
/// else `b` (NaN or not). Written as one select, which the compiler vectorizes.
fn pick<T: Copy>(a: T, b: T, a_wins: bool, a_is_nan: bool) -> T {
    if a_is_nan || a_wins {
        a
    } else {
        b
    }
}

macro_rules! float_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            fn combine<const OP: u8>(a: Self, b: Self) -> Self {
                match OP {
                    SUM => a + b,
                    PROD => a * b,
                    MIN => pick(a, b, a < b, a.is_nan()),
                    _ => pick(a, b, a > b, a.is_nan()),
                }
            }
        }
    )*};
}
float_element!(f32, f64);

macro_rules! half_element {
    ($t:ty) => {
        impl Element for $t {
            fn combine<const OP: u8>(a: Self, b: Self) -> Self {
                <$t>::from_f32(f32::combine::<OP>(a.to_f32(), b.to_f32()))
            }
        }
    };
}
half_element!(f16);
half_element!(bf16);

macro_rules! unsigned_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            fn combine<const OP: u8>(a: Self, b: Self) -> Self {
                match OP {
                    SUM => a.wrapping_add(b),
                    PROD => a.wrapping_mul(b),
                    MIN => a.min(b),
                    _ => a.max(b),
                }
            }
        }
    )*};
}
unsigned_element!(u8, u16, u32, u64);

/// `MPI_User_function`: `inout[i] = in[i] OP inout[i]`.
unsafe extern "C" fn reduce<T: Element, const OP: u8>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut c_void,
) {
    // SAFETY: MPI passes two buffers of `*len` elements of the datatype the op was used
    // with, which jaxmpi only ever pairs with a datatype holding `T`.
    let (input, inout) = unsafe {
        let n = usize::try_from(*len).unwrap_or(0);
        (
            std::slice::from_raw_parts(invec as *const T, n),
            std::slice::from_raw_parts_mut(inoutvec as *mut T, n),
        )
    };
    for (acc, &x) in inout.iter_mut().zip(input) {
        *acc = T::combine::<OP>(x, *acc);
    }
}

fn table<T: Element>() -> [UserFunction; 4] {
    [
        reduce::<T, SUM>,
        reduce::<T, PROD>,
        reduce::<T, MIN>,
        reduce::<T, MAX>,
    ]
}

/// The callback for (dtype, op), where jaxmpi can provide one.
pub fn callback(dtype: Dtype, op: ReduceOp) -> Option<UserFunction> {
    let index = OPS.iter().position(|&o| o == op)?;
    let callbacks = match dtype {
        Dtype::F16 => table::<f16>(),
        Dtype::BF16 => table::<bf16>(),
        Dtype::F32 => table::<f32>(),
        Dtype::F64 => table::<f64>(),
        Dtype::U8 => table::<u8>(),
        Dtype::U16 => table::<u16>(),
        Dtype::U32 => table::<u32>(),
        Dtype::U64 => table::<u64>(),
        _ => return None,
    };
    Some(callbacks[index])
}

/// Whether jaxmpi may bring its own op for (dtype, op): half types, and MIN/MAX. A call of
/// any other pair (float32 SUM, the common one) takes the library's op without looking.
pub fn may_be_own(dtype: Dtype, op: ReduceOp) -> bool {
    dtype.is_half() || matches!(op, ReduceOp::Min | ReduceOp::Max)
}

/// The (dtype, op) pairs a library needs from jaxmpi (each `may_be_own`). float32/float64
/// SUM and PROD stay the library's: they propagate NaN already.
pub fn needed(unsigned_min_max: bool) -> Vec<(Dtype, ReduceOp)> {
    let mut pairs: Vec<_> = [Dtype::F16, Dtype::BF16]
        .into_iter()
        .flat_map(|d| OPS.map(|op| (d, op)))
        .collect();
    for dtype in [Dtype::F32, Dtype::F64] {
        pairs.extend([(dtype, ReduceOp::Min), (dtype, ReduceOp::Max)]);
    }
    if unsigned_min_max {
        for dtype in [Dtype::U8, Dtype::U16, Dtype::U32, Dtype::U64] {
            pairs.extend([(dtype, ReduceOp::Min), (dtype, ReduceOp::Max)]);
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply<T: Copy>(dtype: Dtype, op: ReduceOp, input: &mut [T], inout: &mut [T]) {
        let f = callback(dtype, op).unwrap();
        let mut len = input.len() as c_int;
        // SAFETY: both slices hold `len` elements of the dtype's size.
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
    fn every_pair_needed_may_be_own() {
        for unsigned in [false, true] {
            for (dtype, op) in needed(unsigned) {
                assert!(may_be_own(dtype, op), "{dtype} {op}");
            }
        }
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
            let mut x: Vec<f16> = a.iter().map(|&v| f16::from_f32(v)).collect();
            let mut y: Vec<f16> = b.iter().map(|&v| f16::from_f32(v)).collect();
            apply(Dtype::F16, op, &mut x, &mut y);
            for (g, w) in y.iter().zip(expect) {
                let (g, w) = (g.to_f32(), f16::from_f32(w).to_f32());
                // Inputs are rounded to f16 first: 0.1+0.2 lands within one ulp of f16(0.3).
                assert!((g - w).abs() <= w.abs() * 1e-3, "{op:?}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn bf16_sum_rounds_and_nan_propagates() {
        let mut x = vec![bf16::from_f32(1.0), bf16::NAN];
        let mut y = vec![bf16::from_f32(256.0), bf16::from_f32(3.0)];
        apply(Dtype::BF16, ReduceOp::Sum, &mut x, &mut y);
        // 257 is not representable in bf16 (8 bits of mantissa): rounds to 256.
        assert_eq!(y[0].to_f32(), 256.0);
        assert!(y[1].is_nan());
        let (mut x, mut y) = (vec![bf16::NAN], vec![bf16::from_f32(3.0)]);
        apply(Dtype::BF16, ReduceOp::Max, &mut x, &mut y);
        assert!(y[0].is_nan());
    }

    /// Each position of a NaN (`in`, `inout`, both) against a number and an infinity.
    fn min_max_propagate_nan<T>(dtype: Dtype, nan: T, values: [T; 2])
    where
        T: Copy + PartialEq + std::fmt::Debug + Into<f64>,
    {
        for op in [ReduceOp::Min, ReduceOp::Max] {
            for value in values {
                for (x, y) in [(nan, value), (value, nan), (nan, nan)] {
                    let (mut input, mut inout) = (vec![x, value], vec![y, value]);
                    apply(dtype, op, &mut input, &mut inout);
                    let got: f64 = inout[0].into();
                    assert!(got.is_nan(), "{dtype} {op:?} of {x:?} and {y:?}: {got}");
                    assert_eq!(inout[1], value, "{dtype} {op:?} of {value:?} with itself");
                }
            }
        }
    }

    #[test]
    fn float_min_max_propagate_nan_from_either_operand() {
        min_max_propagate_nan(Dtype::F32, f32::NAN, [-1.5, f32::INFINITY]);
        min_max_propagate_nan(Dtype::F64, f64::NAN, [1e300, f64::NEG_INFINITY]);
        min_max_propagate_nan(Dtype::F16, f16::NAN, [f16::ONE, f16::NEG_INFINITY]);
        min_max_propagate_nan(Dtype::BF16, bf16::NAN, [bf16::MIN, bf16::INFINITY]);
    }

    #[test]
    fn float_min_max_without_nan_are_min_max() {
        let (mut x, mut y) = (vec![1.0f64, -0.5, f64::INFINITY], vec![2.0f64, -3.0, 7.0]);
        apply(Dtype::F64, ReduceOp::Max, &mut x, &mut y);
        assert_eq!(y, [2.0, -0.5, f64::INFINITY]);
        let (mut x, mut y) = (
            vec![1.0f32, -0.5, f32::NEG_INFINITY],
            vec![2.0f32, -3.0, 7.0],
        );
        apply(Dtype::F32, ReduceOp::Min, &mut x, &mut y);
        assert_eq!(y, [1.0, -3.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn unsigned_min_max_compare_as_unsigned() {
        let (mut x, mut y) = (vec![196u8, 3], vec![42u8, 250]);
        apply(Dtype::U8, ReduceOp::Max, &mut x, &mut y);
        assert_eq!(y, [196, 250]);
        let (mut x, mut y) = (vec![u64::MAX, 1], vec![7u64, u64::MAX]);
        apply(Dtype::U64, ReduceOp::Min, &mut x, &mut y);
        assert_eq!(y, [7, 1]);
    }

    #[test]
    fn callbacks_exist_only_where_jaxmpi_provides_an_op() {
        assert!(callback(Dtype::F16, ReduceOp::Band).is_none());
        assert!(callback(Dtype::I32, ReduceOp::Max).is_none());
        assert!(callback(Dtype::BF16, ReduceOp::Min).is_some());
        assert_eq!(needed(false).len(), 12);
        assert_eq!(needed(true).len(), 20);
        // The library's own SUM/PROD propagate NaN: only MIN/MAX are replaced.
        for dtype in [Dtype::F32, Dtype::F64] {
            let ops: Vec<_> = needed(false)
                .into_iter()
                .filter_map(|(d, op)| (d == dtype).then_some(op))
                .collect();
            assert_eq!(ops, [ReduceOp::Min, ReduceOp::Max]);
        }
    }
}
