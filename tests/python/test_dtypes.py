"""Every predefined reduction on every dtype it is defined for (as jaxmpi's constant and as
mpi4py's MPI.Op), float16/bfloat16 arithmetic, and user-defined MPI.Op reductions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import (
    FLOAT_DTYPES,
    MODES,
    MPI,
    OP_DTYPES,
    OP_NAMES,
    RANK,
    SIZE,
    all_inputs,
    assert_array,
    call,
    expected_allreduce,
    expected_exscan,
    expected_reduce,
    expected_scan,
    jaxmpi_op,
    mpi4py_op,
    needs_mpi4py,
)

# How each dtype and op maps to the MPI's datatypes and ops: the number of ranks
# does not enter.
pytestmark = pytest.mark.same_at_every_size

SUPPORTED_PAIRS = [(op, dtype) for op in OP_NAMES for dtype in OP_DTYPES[op]]


@pytest.mark.parametrize("flavor", ["jaxmpi", "mpi4py"])
@pytest.mark.parametrize(("op", "dtype"), SUPPORTED_PAIRS)
def test_allreduce_every_op_on_every_dtype(op, dtype, flavor):
    if flavor == "mpi4py" and MPI is None:
        pytest.skip("needs mpi4py")
    mpi_op = jaxmpi_op(op) if flavor == "jaxmpi" else mpi4py_op(op)
    inputs = all_inputs(op, dtype, (2, 4))
    got = jaxmpi.allreduce(inputs[RANK], mpi_op)
    assert_array(got, expected_allreduce(op, inputs))


@pytest.mark.parametrize("dtype", [d for d in OP_DTYPES["MAX"] if d.startswith(("int", "uint"))])
def test_integer_extremes(dtype):
    """Values at the ends of the type's range: MIN/MAX that compared as the wrong
    signedness or width, or BOR/BAND on a narrower type, give a different answer."""
    info = np.iinfo(jnp.dtype(dtype))
    high = np.array([info.max - RANK, info.max // 2 + 1 + RANK]).astype(dtype)
    low = np.array([info.min + RANK, 1 + RANK]).astype(dtype)
    highs = [np.array([info.max - r, info.max // 2 + 1 + r]).astype(dtype) for r in range(SIZE)]
    lows = [np.array([info.min + r, 1 + r]).astype(dtype) for r in range(SIZE)]
    got = {
        "MAX": jaxmpi.allreduce(high, jaxmpi.MAX),
        "MIN": jaxmpi.allreduce(low, jaxmpi.MIN),
        "BOR": jaxmpi.allreduce(high, jaxmpi.BOR),
        "BAND": jaxmpi.allreduce(high, jaxmpi.BAND),
    }
    assert_array(got["MAX"], expected_allreduce("MAX", highs), "MAX")
    assert_array(got["MIN"], expected_allreduce("MIN", lows), "MIN")
    assert_array(got["BOR"], expected_allreduce("BOR", highs), "BOR")
    assert_array(got["BAND"], expected_allreduce("BAND", highs), "BAND")


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_double_precision_is_kept(dtype):
    """1 + k * 2**-40 is exact in float64 but rounds to 1 in float32: a reduction done
    in single precision shows."""
    inputs = [np.array([1 + r * 2.0**-40, -(2.0**60) + r]).astype(dtype) for r in range(SIZE)]
    got = jaxmpi.allreduce(inputs[RANK], jaxmpi.SUM)
    assert_array(got, expected_allreduce("SUM", inputs))


# ---------------------------------------------------------------------------------------
# float16 and bfloat16
# ---------------------------------------------------------------------------------------

HALF = ["float16", "bfloat16"]
REDUCTIONS = {
    "allreduce": (lambda x, op: jaxmpi.allreduce(x, op), expected_allreduce),
    "reduce": (
        lambda x, op: jaxmpi.reduce(x, op, SIZE - 1),
        lambda op, xs: expected_reduce(op, xs, SIZE - 1),
    ),
    "scan": (lambda x, op: jaxmpi.scan(x, op), expected_scan),
    "exscan": (lambda x, op: jaxmpi.exscan(x, op), expected_exscan),
}


def half_data(rank: int, dtype) -> np.ndarray:
    """Fractions (multiples of 0.25, both signs) whose sums over any subset of up to 4
    ranks are exact even in bfloat16 (8 significant bits): every |value| < 16."""
    r = rank % 4
    values = [0.25 + r, -1.5 * (r + 1), 3.75 - r, 0.5 ** (r % 3), 10.25 - 2 * r, -0.0 - r]
    return np.array(values).astype(jnp.dtype(dtype))


def half_factors(rank: int, dtype) -> np.ndarray:
    """Factors with at most 2 significant bits: products of up to 4 are exact."""
    values = np.array([0.5, -1.5, 2.0, 0.75, 3.0, -0.25])
    return np.roll(values, rank).astype(jnp.dtype(dtype))


@pytest.mark.parametrize("op", ["SUM", "PROD", "MIN", "MAX"])
@pytest.mark.parametrize("reduction", list(REDUCTIONS))
@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_reductions_are_exact(dtype, reduction, op):
    """Values chosen so the exact result is representable: any reduction that treats the
    bits as integers, or loses precision beyond the dtype's own, gives a different
    number."""
    make = half_factors if op == "PROD" else half_data
    inputs = [make(r, dtype) for r in range(SIZE)]
    run, expected = REDUCTIONS[reduction]
    got = run(inputs[RANK], jaxmpi_op(op))
    assert_array(got, expected(op, inputs))


def noisy_data(rank: int, dtype) -> np.ndarray:
    """4096 values of magnitudes 0.01 to 1000 that the dtype mostly cannot hold exactly."""
    rng = np.random.default_rng(1234 + rank)
    values = rng.standard_normal(4096) * 10.0 ** rng.integers(-2, 3, 4096)
    return values.astype(jnp.dtype(dtype))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_sum_of_inexact_values(dtype, mode):
    """The sum matches float64 arithmetic on the same inputs to within the dtype's
    rounding of each partial sum."""
    inputs = [noisy_data(r, dtype) for r in range(SIZE)]
    got = np.asarray(call(mode, lambda x: jaxmpi.allreduce(x, jaxmpi.SUM), inputs[RANK]))
    wide = [x.astype(np.float64) for x in inputs]
    exact = np.sum(wide, axis=0)
    # At most SIZE - 1 additions, each rounding by at most eps/2 of a partial sum, which
    # is bounded by the sum of magnitudes; plus the final rounding.
    eps = float(jnp.finfo(dtype).eps)
    bound = SIZE * eps * np.sum(np.abs(wide), axis=0)
    error = np.abs(got.astype(np.float64) - exact)
    assert got.dtype == jnp.dtype(dtype)
    assert np.all(error <= bound), f"largest error {error.max()} allowed {bound[error.argmax()]}"


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_special_values(dtype):
    """inf and -inf survive MAX/MIN; SUM of +inf gives +inf."""
    inf = np.array([np.inf, -np.inf, 1.0]).astype(jnp.dtype(dtype))
    got_max = jaxmpi.allreduce(inf, jaxmpi.MAX)
    got_min = jaxmpi.allreduce(inf, jaxmpi.MIN)
    got_sum = jaxmpi.allreduce(inf, jaxmpi.SUM)
    assert_array(got_max, inf, "MAX")
    assert_array(got_min, inf, "MIN")
    assert_array(got_sum, np.array([np.inf, -np.inf, SIZE]).astype(jnp.dtype(dtype)), "SUM")


# ---------------------------------------------------------------------------------------
# NaN in MIN and MAX
# ---------------------------------------------------------------------------------------


def nan_inputs(holder: int, dtype) -> list[np.ndarray]:
    """Every rank's input: rank `holder`'s all NaN where the others hold 1.5 + rank, +inf,
    -inf, and (every rank) NaN."""
    rows = [[1.5 + r, np.inf, -np.inf, np.nan] for r in range(SIZE)]
    rows[holder] = [np.nan] * 4
    return [np.array(row).astype(jnp.dtype(dtype)) for row in rows]


@pytest.mark.parametrize("flavor", ["jaxmpi", "mpi4py"])
@pytest.mark.parametrize("reduction", list(REDUCTIONS))
@pytest.mark.parametrize("op", ["MIN", "MAX"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_min_max_give_nan_whichever_rank_holds_it(dtype, op, reduction, flavor):
    """As np.minimum/np.maximum (and XLA on one device), a NaN on any rank gives NaN.
    MPI's own MPI_MIN/MPI_MAX keep or drop it by which operand holds it: each rank holds
    it in turn."""
    if flavor == "mpi4py" and MPI is None:
        pytest.skip("needs mpi4py")
    run, expected = REDUCTIONS[reduction]
    mpi_op = jaxmpi_op(op) if flavor == "jaxmpi" else mpi4py_op(op)
    for holder in range(SIZE):
        inputs = nan_inputs(holder, dtype)
        got = run(inputs[RANK], mpi_op)
        assert_array(got, expected(op, inputs), f"{op} {reduction}, NaN on rank {holder}")


# ---------------------------------------------------------------------------------------
# User-defined reductions (mpi4py's MPI.Op.Create)
# ---------------------------------------------------------------------------------------


def _numpy_views(inbuf, inoutbuf, datatype):
    from mpi4py.util.dtlib import to_numpy_dtype

    dtype = to_numpy_dtype(datatype)
    return np.frombuffer(inbuf, dtype=dtype), np.frombuffer(inoutbuf, dtype=dtype)


def _add_plus_one(inbuf, inoutbuf, datatype):
    """a ⊕ b = a + b + 1: commutative and associative, and unlike any predefined op."""
    a, b = _numpy_views(inbuf, inoutbuf, datatype)
    b[:] = a + b + 1


def _compose_affine(inbuf, inoutbuf, datatype):
    """Elements taken in pairs (m, c) stand for x -> m*x + c; the result is "first apply
    `in`, then `inout`": associative but not commutative, so MPI must keep rank order."""
    a, b = _numpy_views(inbuf, inoutbuf, datatype)
    m1, c1, m2, c2 = a[0::2], a[1::2], b[0::2].copy(), b[1::2].copy()
    b[0::2] = m1 * m2
    b[1::2] = m2 * c1 + c2


def _fold(fn, values):
    """Folds `fn(earlier, later)` over values in rank order (numpy reference)."""
    result = values[0]
    for value in values[1:]:
        result = fn(result, value)
    return result


def _plus_one(a, b):
    return a + b + 1


def _affine(a, b):
    return np.stack([a[0] * b[0], b[0] * a[1] + b[1]])


USER_OPS = {
    "add-plus-one": (_add_plus_one, True, _plus_one, lambda r: np.arange(3.0) + r),
    "affine": (_compose_affine, False, _affine, lambda r: np.array([2.0 + r % 2, r + 1.0])),
}


@needs_mpi4py
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reduction", ["allreduce", "reduce", "scan", "exscan"])
@pytest.mark.parametrize("name", list(USER_OPS))
def test_user_defined_op(name, reduction, mode):
    fn, commute, reference, data = USER_OPS[name]
    op = MPI.Op.Create(fn, commute=commute)
    root = SIZE - 1
    inputs = [data(r) for r in range(SIZE)]
    runs = {
        "allreduce": lambda x: jaxmpi.allreduce(x, op),
        "reduce": lambda x: jaxmpi.reduce(x, op, root),
        "scan": lambda x: jaxmpi.scan(x, op),
        "exscan": lambda x: jaxmpi.exscan(x, op),
    }
    try:
        got = call(mode, runs[reduction], inputs[RANK])
    finally:
        jax.effects_barrier()
        op.Free()
    everything = _fold(reference, inputs)
    expected = {
        "allreduce": everything,
        "reduce": everything if RANK == root else inputs[RANK],
        "scan": _fold(reference, inputs[: RANK + 1]),
        "exscan": _fold(reference, inputs[:RANK]) if RANK > 0 else np.zeros_like(inputs[0]),
    }[reduction]
    assert_array(got, expected)
