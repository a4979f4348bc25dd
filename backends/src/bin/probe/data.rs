//! Deterministic test data: every rank can compute what every other rank sends, so each
//! result is checked against values computed locally, never against another MPI call.
//!
//! Values are chosen so that every expected result is exact in every dtype: reductions are
//! computed here in i128/f64 and only then encoded, so a check compares bit patterns that
//! no rounding can blur.

use std::ops::Range;

use jaxmpi_core::{Dtype, ReduceOp};

use crate::array::{normalize, Array, Value};

/// How values are drawn; each pattern suits a group of ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Full-width integer bit patterns and fractional floats: a misplaced, truncated or
    /// byte-swapped element shows. Used for data movement, MIN/MAX and the bitwise ops.
    Wide,
    /// Small values including zeros (and halves for floats), so sums over any realistic
    /// number of ranks neither overflow int8 nor round in bfloat16, and logical ops see
    /// both truth values.
    Small,
    /// ±1 (or a unit complex number), with a single factor 2 (or 1+i) per element across
    /// all ranks: products vary in sign but never exceed magnitude 2.
    Unit,
}

impl Pattern {
    pub fn for_op(op: ReduceOp) -> Pattern {
        match op {
            ReduceOp::Sum | ReduceOp::Land | ReduceOp::Lor | ReduceOp::Lxor => Pattern::Small,
            ReduceOp::Prod => Pattern::Unit,
            _ => Pattern::Wide,
        }
    }
}

/// The data of one test: element `index` of rank `rank`'s contribution is a pure function
/// of the test's label, the dtype and the pattern.
#[derive(Clone, Copy, Debug)]
pub struct Data {
    pub dtype: Dtype,
    pattern: Pattern,
    /// Ranks in the communicator; `Unit` puts its factor 2 on one rank per element.
    size: i32,
    salt: u64,
}

impl Data {
    /// `label` names the test (identically on every rank) and seeds its values, so two
    /// tests never share data by accident.
    pub fn new(label: &str, dtype: Dtype, pattern: Pattern, size: i32) -> Data {
        // FNV-1a: stable across runs and builds, unlike std's randomly keyed hasher.
        let salt = label.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        Data {
            dtype,
            pattern,
            size,
            salt,
        }
    }

    pub fn value(&self, rank: i32, index: usize) -> Value {
        let h = mix(self.salt, rank, index as u64);
        let dtype = self.dtype;
        let value = match (self.pattern, kind(dtype)) {
            (_, Kind::Bool) => Value::Int(i128::from(h & 1 == 1 || self.pattern == Pattern::Unit)),
            (Pattern::Wide, Kind::Int) => Value::Int(h as i64 as i128),
            (Pattern::Wide, Kind::Float) => Value::Float(wide_float(h)),
            (Pattern::Wide, Kind::Complex) => Value::Complex(wide_float(h), wide_float(h >> 16)),
            (Pattern::Small, Kind::Int) if is_unsigned(dtype) => Value::Int((h % 7) as i128),
            (Pattern::Small, Kind::Int) => Value::Int((h % 7) as i128 - 3),
            (Pattern::Small, Kind::Float) => Value::Float(small_float(h)),
            (Pattern::Small, Kind::Complex) => Value::Complex(small_float(h), small_float(h >> 16)),
            (Pattern::Unit, _) => {
                let special = index % self.size.max(1) as usize == rank as usize;
                unit(dtype, h, special)
            }
        };
        // Integers were drawn 64 bits wide: wrap them into the dtype's range.
        normalize(dtype, value)
    }

    /// Rank `rank`'s `count` elements.
    pub fn of_rank(&self, rank: i32, count: usize) -> Array {
        Array::from_fn(self.dtype, count, |i| self.value(rank, i))
    }

    /// What reducing element `index` over `ranks` with `op` must give.
    pub fn reduced(&self, op: ReduceOp, ranks: Range<i32>, index: usize) -> Value {
        ranks
            .map(|rank| self.value(rank, index))
            .reduce(|acc, v| combine(self.dtype, op, acc, v))
            .expect("reductions are checked over at least one rank")
    }
}

fn mix(salt: u64, rank: i32, index: u64) -> u64 {
    // splitmix64's finalizer over all three inputs: cheap, and neighbouring indices or
    // ranks get unrelated values.
    let mut z = salt
        ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ index.wrapping_mul(0xd1b5_4a32_d192_ed03);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Halves in [-64, 64): 8 significant bits, exact in bfloat16.
fn wide_float(h: u64) -> f64 {
    ((h % 256) as f64 - 128.0) / 2.0
}

/// Halves in [-3, 3].
fn small_float(h: u64) -> f64 {
    ((h % 13) as f64 - 6.0) / 2.0
}

fn unit(dtype: Dtype, h: u64, special: bool) -> Value {
    let sign = if h & 1 == 0 || is_unsigned(dtype) {
        1
    } else {
        -1
    };
    let magnitude = if special { 2 } else { 1 };
    match kind(dtype) {
        Kind::Bool | Kind::Int => Value::Int(sign * magnitude),
        Kind::Float => Value::Float((sign * magnitude) as f64),
        Kind::Complex if special => Value::Complex(1.0, 1.0),
        Kind::Complex => [(1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)]
            .map(|(re, im)| Value::Complex(re, im))[(h % 4) as usize],
    }
}

/// `a op b` as MPI defines it, wrapped into the dtype.
pub fn combine(dtype: Dtype, op: ReduceOp, a: Value, b: Value) -> Value {
    use Value::{Complex, Float, Int};
    let truth = |v: Value| v != Int(0) && v != Float(0.0) && v != Complex(0.0, 0.0);
    let value = match (op, a, b) {
        (ReduceOp::Sum, Int(x), Int(y)) => Int(x + y),
        (ReduceOp::Sum, Float(x), Float(y)) => Float(x + y),
        (ReduceOp::Sum, Complex(a, b), Complex(c, d)) => Complex(a + c, b + d),
        (ReduceOp::Prod, Int(x), Int(y)) => Int(x * y),
        (ReduceOp::Prod, Float(x), Float(y)) => Float(x * y),
        (ReduceOp::Prod, Complex(a, b), Complex(c, d)) => Complex(a * c - b * d, a * d + b * c),
        (ReduceOp::Min, Int(x), Int(y)) => Int(x.min(y)),
        (ReduceOp::Min, Float(x), Float(y)) => Float(x.min(y)),
        (ReduceOp::Max, Int(x), Int(y)) => Int(x.max(y)),
        (ReduceOp::Max, Float(x), Float(y)) => Float(x.max(y)),
        (ReduceOp::Land, x, y) => Int(i128::from(truth(x) && truth(y))),
        (ReduceOp::Lor, x, y) => Int(i128::from(truth(x) || truth(y))),
        (ReduceOp::Lxor, x, y) => Int(i128::from(truth(x) != truth(y))),
        (ReduceOp::Band, Int(x), Int(y)) => Int(x & y),
        (ReduceOp::Bor, Int(x), Int(y)) => Int(x | y),
        (ReduceOp::Bxor, Int(x), Int(y)) => Int(x ^ y),
        _ => unreachable!("the probe only combines {op} on dtypes it supports ({dtype})"),
    };
    normalize(dtype, value)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Int,
    Float,
    Complex,
}

fn kind(dtype: Dtype) -> Kind {
    match dtype {
        Dtype::Bool => Kind::Bool,
        d if d.is_integer() => Kind::Int,
        d if d.is_complex() => Kind::Complex,
        _ => Kind::Float,
    }
}

pub fn is_unsigned(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_its_values() {
        for dtype in Dtype::ALL {
            for pattern in [Pattern::Wide, Pattern::Small, Pattern::Unit] {
                let data = Data::new("round trip", dtype, pattern, 3);
                let array = data.of_rank(1, 50);
                for i in 0..50 {
                    assert_eq!(array.get(i), data.value(1, i), "{dtype} {pattern:?}");
                }
            }
        }
    }

    #[test]
    fn reductions_stay_exact() {
        let data = Data::new("sum", Dtype::BF16, Pattern::Small, 3);
        let sum = data.reduced(ReduceOp::Sum, 0..3, 5);
        let Value::Float(exact) = sum else { panic!() };
        let parts: f64 = (0..3)
            .map(|r| match data.value(r, 5) {
                Value::Float(v) => v,
                _ => panic!(),
            })
            .sum();
        assert_eq!(exact, parts);
        let prod = Data::new("prod", Dtype::I8, Pattern::Unit, 3);
        for i in 0..30 {
            let Value::Int(p) = prod.reduced(ReduceOp::Prod, 0..3, i) else {
                panic!()
            };
            assert_eq!(p.abs(), 2);
        }
        let wrap = combine(Dtype::U8, ReduceOp::Sum, Value::Int(200), Value::Int(100));
        assert_eq!(wrap, Value::Int(44));
    }
}
