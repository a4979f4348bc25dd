"""reduce_scatter and the variable-count collectives (gatherv, allgatherv, scatterv,
alltoallv) against numpy, eager and under jit, and their errors for bad counts and shapes.

Counts are per-rank ROW counts along the leading axis. Every test uses uneven counts that
include a zero (with 2 ranks or more) and rows of several shapes, so a handler that
confused rows with elements, or skipped the displacements, shows. Expected values are
computed from RANK and SIZE only (see `block` below).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import (
    MODES,
    RANK,
    SIZE,
    allreduce_still_works,
    assert_array,
    call,
    rank_data,
    reduce_arrays,
)

# Across hosts, a transport of its own.
pytestmark = pytest.mark.across_hosts

ROOT = SIZE - 1  # not 0, so code that assumes root 0 fails
DTYPES = ["int32", "float32", "bfloat16", "complex64", "bool"]
ROW = (2,)  # every row is a (2,)-vector unless a test says otherwise
ROW_SHAPES = {"scalar-rows": (), "vector-rows": (2,), "matrix-rows": (2, 3)}


def counts_for(size: int = SIZE) -> tuple[int, ...]:
    """Uneven row counts, one per rank: 2, 0, 1, 2, ... (a zero from 2 ranks on)."""
    return tuple((r + 2) % 3 for r in range(size))


def pair_rows(sender: int, receiver: int) -> int:
    """alltoallv: how many rows `sender` sends to `receiver` (0, 1 or 2; zeros included)."""
    return (sender + 2 * receiver + 1) % 3


def block(key: int, rows: int, dtype, row=ROW) -> np.ndarray:
    """The rows identified by `key` (a rank, or a sender/receiver pair): unique values."""
    return rank_data(key, dtype, (rows, *row))


def gather_block(rank: int, dtype, row=ROW) -> np.ndarray:
    """What `rank` contributes to gatherv/allgatherv (and gets from scatterv)."""
    return block(rank, counts_for()[rank], dtype, row)


def everything(dtype, row=ROW) -> np.ndarray:
    """Every rank's block stacked in rank order: `sum(counts)` rows."""
    return np.concatenate([gather_block(r, dtype, row) for r in range(SIZE)])


def pair_block(sender: int, receiver: int, dtype, row=ROW) -> np.ndarray:
    return block(100 + sender * SIZE + receiver, pair_rows(sender, receiver), dtype, row)


def dtype_of(dtype):
    return rank_data(0, dtype).dtype


# ---------------------------------------------------------------------------------------
# reduce_scatter
# ---------------------------------------------------------------------------------------


RS_CASES = [
    (op, dtype, "jit") for op in ["SUM", "MAX"] for dtype in ["int32", "float32", "bfloat16"]
] + [("SUM", "float32", "eager"), ("MAX", "int32", "eager")]


@pytest.mark.parametrize("op,dtype,mode", RS_CASES, ids=["-".join(c) for c in RS_CASES])
def test_reduce_scatter(op, dtype, mode):
    """Rank r gets the reduction over every rank of slice r."""
    inputs = [rank_data(q, dtype, (SIZE, 2, 3)) for q in range(SIZE)]
    got = call(mode, lambda x: jaxmpi.reduce_scatter(x, getattr(jaxmpi, op)), inputs[RANK])
    assert_array(got, reduce_arrays(op, [x[RANK] for x in inputs]))


@pytest.mark.parametrize("mode", MODES)
def test_reduce_scatter_of_scalars_and_complex(mode):
    """Slices that are scalars (x of shape (size,)), and a complex SUM."""
    inputs = [rank_data(q, "complex64", (SIZE,)) for q in range(SIZE)]
    got = call(mode, lambda x: jaxmpi.reduce_scatter(x, jaxmpi.SUM), inputs[RANK])
    assert_array(got, reduce_arrays("SUM", [x[RANK] for x in inputs]))


# ---------------------------------------------------------------------------------------
# The variable-count collectives: every dtype of DTYPES, eager and jit
# ---------------------------------------------------------------------------------------


#: Every dtype under jit; eagerly (the same handler, run through a one-op program) two.
CASES = [("jit", d) for d in DTYPES] + [("eager", "float32"), ("eager", "bool")]


def matrix(test):
    return pytest.mark.parametrize("mode,dtype", CASES, ids=["-".join(c) for c in CASES])(test)


@matrix
def test_gatherv(mode, dtype):
    """The root gets every block in rank order; the other ranks get their x back."""
    mine = gather_block(RANK, dtype)
    got = call(mode, lambda x: jaxmpi.gatherv(x, counts_for(), ROOT), mine)
    assert_array(got, everything(dtype) if RANK == ROOT else mine)


@matrix
def test_allgatherv(mode, dtype):
    got = call(mode, lambda x: jaxmpi.allgatherv(x, counts_for()), gather_block(RANK, dtype))
    assert_array(got, everything(dtype))


@matrix
def test_scatterv(mode, dtype):
    """The root holds every block; the others pass a template whose values are ignored
    (ones here, so a template passed through unchanged would show)."""
    if RANK == ROOT:
        x = everything(dtype)
    else:
        x = np.ones((counts_for()[RANK], *ROW), dtype_of(dtype))
    got = call(mode, lambda x: jaxmpi.scatterv(x, counts_for(), ROOT), x)
    assert_array(got, gather_block(RANK, dtype))


@matrix
def test_alltoallv(mode, dtype):
    """Rank r sends pair_rows(r, s) rows to each rank s and gets pair_rows(s, r) rows from
    each, stacked in rank order."""
    send_counts = [pair_rows(RANK, s) for s in range(SIZE)]
    recv_counts = [pair_rows(s, RANK) for s in range(SIZE)]
    x = np.concatenate([pair_block(RANK, s, dtype) for s in range(SIZE)])
    got = call(mode, lambda x: jaxmpi.alltoallv(x, send_counts, recv_counts), x)
    assert_array(got, np.concatenate([pair_block(s, RANK, dtype) for s in range(SIZE)]))


# ---------------------------------------------------------------------------------------
# Row shapes, count containers, zero counts everywhere, every root
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", list(ROW_SHAPES.values()), ids=list(ROW_SHAPES))
def test_every_op_with_other_row_shapes(row):
    """Rows of scalars and of matrices: the element counts scale with the row size."""
    dtype = "float32"
    send_counts = [pair_rows(RANK, s) for s in range(SIZE)]
    recv_counts = [pair_rows(s, RANK) for s in range(SIZE)]
    scatter_in = (
        everything(dtype, row) if RANK == ROOT else np.zeros((counts_for()[RANK], *row), np.float32)
    )
    to_all = np.concatenate([pair_block(RANK, s, dtype, row) for s in range(SIZE)])

    def all_four(mine, scatter_in, to_all):
        return (
            jaxmpi.gatherv(mine, counts_for(), ROOT),
            jaxmpi.allgatherv(mine, counts_for()),
            jaxmpi.scatterv(scatter_in, counts_for(), ROOT),
            jaxmpi.alltoallv(to_all, send_counts, recv_counts),
        )

    mine = gather_block(RANK, dtype, row)
    gathered, allgathered, scattered, exchanged = call("jit", all_four, mine, scatter_in, to_all)
    assert_array(gathered, everything(dtype, row) if RANK == ROOT else mine, "gatherv")
    assert_array(allgathered, everything(dtype, row), "allgatherv")
    assert_array(scattered, gather_block(RANK, dtype, row), "scatterv")
    expected = np.concatenate([pair_block(s, RANK, dtype, row) for s in range(SIZE)])
    assert_array(exchanged, expected, "alltoallv")


@pytest.mark.parametrize("kind", ["tuple", "list", "numpy-int64", "numpy-int32", "numpy-scalars"])
def test_counts_in_every_static_container(kind):
    counts = counts_for()
    counts = {
        "tuple": tuple(counts),
        "list": list(counts),
        "numpy-int64": np.asarray(counts, np.int64),
        "numpy-int32": np.asarray(counts, np.int32),
        "numpy-scalars": [np.int16(c) for c in counts],
    }[kind]
    got = call("jit", lambda x: jaxmpi.allgatherv(x, counts), gather_block(RANK, "int32"))
    assert_array(got, everything("int32"))


@pytest.mark.parametrize("mode", MODES)
def test_all_counts_zero(mode):
    """Nobody sends anything: empty results of the right shape, and no MPI error."""
    zeros = (0,) * SIZE
    empty = np.zeros((0, *ROW), np.float32)

    def all_four(x):
        return (
            jaxmpi.gatherv(x, zeros, ROOT),
            jaxmpi.allgatherv(x, zeros),
            jaxmpi.scatterv(x, zeros, ROOT),
            jaxmpi.alltoallv(x, zeros, zeros),
        )

    got = call(mode, all_four, empty)
    for name, out in zip(["gatherv", "allgatherv", "scatterv", "alltoallv"], got):
        assert_array(out, empty, name)


@pytest.mark.parametrize("mode", MODES)
def test_only_one_rank_has_rows(mode):
    """All rows on the last rank; the other counts are zero."""
    counts = tuple(3 if r == SIZE - 1 else 0 for r in range(SIZE))
    mine = rank_data(RANK, "int32", (counts[RANK], *ROW))
    got = call(mode, lambda x: jaxmpi.allgatherv(x, counts), mine)
    assert_array(got, rank_data(SIZE - 1, "int32", (3, *ROW)))


@pytest.mark.parametrize("root", range(SIZE))
def test_every_root(root):
    """gatherv and scatterv with each rank as the root, in one jitted program."""
    mine = gather_block(RANK, "float32")
    template = everything("float32") if RANK == root else np.zeros_like(mine)

    def both(x, t):
        return jaxmpi.gatherv(x, counts_for(), root), jaxmpi.scatterv(t, counts_for(), root)

    gathered, scattered = call("jit", both, mine, template)
    assert_array(gathered, everything("float32") if RANK == root else mine, "gatherv")
    assert_array(scattered, mine, "scatterv")


def test_non_root_results_under_jit_leave_inputs_intact():
    """On non-roots gatherv returns x and scatterv its template (in place under jit); the
    caller's arrays must still hold their values afterwards."""
    mine = jnp.asarray(gather_block(RANK, "float32"))
    template = jnp.asarray(
        everything("float32")
        if RANK == ROOT
        else np.full((counts_for()[RANK], *ROW), 7.0, np.float32)
    )
    before_x, before_t = np.asarray(mine).copy(), np.asarray(template).copy()
    gathered, scattered = call(
        "jit",
        lambda x, t: (
            jaxmpi.gatherv(x, counts_for(), ROOT),
            jaxmpi.scatterv(t, counts_for(), ROOT),
        ),
        mine,
        template,
    )
    assert_array(gathered, everything("float32") if RANK == ROOT else before_x, "gatherv")
    assert_array(scattered, gather_block(RANK, "float32"), "scatterv")
    assert_array(mine, before_x, "gatherv input after the call")
    assert_array(template, before_t, "scatterv input after the call")


# ---------------------------------------------------------------------------------------
# Bad input: a clear exception while tracing, the same on every rank; then the library
# still works. Each test collects what happened first and asserts after the allreduce, so
# a rank that wrongly went ahead cannot be left alone in a collective by a failed assert.
# ---------------------------------------------------------------------------------------


def outcome(exc_type, phrases, mode, fn, *args) -> str | None:
    """None if `fn(*args)` (run in `mode`) raises `exc_type` with every phrase in its
    message (case-insensitive), else what went wrong."""
    try:
        jax.block_until_ready(call(mode, fn, *args))
    except exc_type as e:
        message = str(e).lower()
        missing = [p for p in phrases if p.lower() not in message]
        return f"message {str(e)!r} lacks {missing}" if missing else None
    except Exception as e:
        return f"raised {type(e).__name__}: {e}, expected {exc_type.__name__}"
    return f"no exception, expected {exc_type.__name__}"


def check_after_allreduce(problem: str | None) -> None:
    allreduce_still_works()
    assert problem is None, problem


def good_args(op: str, counts=None):
    """Valid arguments of `op` with its counts replaced by `counts` (where not None)."""
    c = counts_for() if counts is None else counts
    if op == "gatherv":
        return lambda x: jaxmpi.gatherv(x, c, ROOT), gather_block(RANK, "float32")
    if op == "allgatherv":
        return lambda x: jaxmpi.allgatherv(x, c), gather_block(RANK, "float32")
    if op == "scatterv":
        x = everything("float32") if RANK == ROOT else gather_block(RANK, "float32")
        return lambda x: jaxmpi.scatterv(x, c, ROOT), x
    send = [pair_rows(RANK, s) for s in range(SIZE)]
    recv = [pair_rows(s, RANK) for s in range(SIZE)]
    x = np.concatenate([pair_block(RANK, s, "float32") for s in range(SIZE)])
    if op == "alltoallv-send":
        return lambda x: jaxmpi.alltoallv(x, c if counts is not None else send, recv), x
    return lambda x: jaxmpi.alltoallv(x, send, c if counts is not None else recv), x


VAR_OPS = ["gatherv", "allgatherv", "scatterv", "alltoallv-send", "alltoallv-recv"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("length", [SIZE + 1, SIZE - 1], ids=["one-too-many", "one-too-few"])
@pytest.mark.parametrize("op", VAR_OPS)
def test_counts_of_the_wrong_length(op, length, mode):
    if length == 0:
        pytest.skip("one too few is no counts at all on 1 rank: see test_empty_counts")
    fn, x = good_args(op, counts=(1,) * length)
    check_after_allreduce(
        outcome(ValueError, ["entries", "ranks", str(length), str(SIZE)], mode, fn, x)
    )


@pytest.mark.parametrize("op", VAR_OPS)
def test_empty_counts(op):
    """No counts at all is a count list of the wrong length, like any other (it is
    static, and nothing in it is not an int)."""
    fn, x = good_args(op, counts=())
    check_after_allreduce(outcome(ValueError, ["0 entries", "ranks"], "jit", fn, x))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", VAR_OPS)
def test_negative_counts(op, mode):
    counts = tuple(-1 if r == SIZE - 1 else c for r, c in enumerate(counts_for()))
    fn, x = good_args(op, counts=counts)
    check_after_allreduce(outcome(ValueError, ["negative"], mode, fn, x))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", [1, -1], ids=["one-row-too-many", "one-row-too-few"])
@pytest.mark.parametrize("op", ["gatherv", "allgatherv", "scatterv", "alltoallv"])
def test_leading_axis_that_does_not_match_the_counts(op, extra, mode):
    """Every rank passes one row too many (or too few where it has rows to drop): the
    root's scatterv input must have sum(counts) rows, everybody else's counts[rank]."""
    fn, good = good_args("alltoallv-send" if op == "alltoallv" else op)
    if extra > 0 or len(good) == 0:  # a rank without rows gets one too many instead
        x = np.concatenate([good, np.zeros((1, *good.shape[1:]), good.dtype)])
    else:
        x = good[:-1]
    phrases = ["rows", f"must have {len(good)} rows", f"got shape {x.shape}"]
    check_after_allreduce(outcome(ValueError, phrases, mode, fn, x))


@pytest.mark.parametrize("op", ["gatherv", "allgatherv", "scatterv", "alltoallv"])
def test_scalar_input_to_a_variable_count_op(op):
    fn, _ = good_args("alltoallv-send" if op == "alltoallv" else op)
    check_after_allreduce(outcome(ValueError, ["rows"], "jit", fn, np.float32(1.0)))


@pytest.mark.parametrize("how", ["array", "tuple-with-a-tracer"])
@pytest.mark.parametrize("op", VAR_OPS)
def test_counts_that_are_not_static(op, how):
    """Counts computed inside jit are tracers: refused, naming 'static'."""

    def traced(x, c):
        counts = c if how == "array" else (c[0], *counts_for()[1:])
        fn, _ = good_args(op, counts=counts)
        return fn(x)

    _, x = good_args(op)
    problem = outcome(TypeError, ["static"], "jit", traced, x, jnp.asarray(counts_for(), jnp.int32))
    check_after_allreduce(problem)


@pytest.mark.parametrize(
    "counts", [[1.0] * SIZE, [[1]] * SIZE, "1" * SIZE, None], ids=["floats", "2d", "str", "none"]
)
def test_counts_that_are_not_ints(counts):
    x = gather_block(RANK, "float32")

    def fn(x):
        return jaxmpi.allgatherv(x, counts)

    check_after_allreduce(outcome(TypeError, ["counts", "static"], "eager", fn, x))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "shape", [(SIZE + 1, 2), (), (SIZE - 1, 2), (0,)], ids=["size+1", "scalar", "size-1", "empty"]
)
def test_reduce_scatter_needs_size_rows(shape, mode):
    x = np.zeros(shape, np.float32)
    check_after_allreduce(
        outcome(
            ValueError, ["(nproc, ...)"], mode, lambda x: jaxmpi.reduce_scatter(x, jaxmpi.SUM), x
        )
    )
