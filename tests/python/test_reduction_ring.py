"""Allreduces of jaxmpi's own ops (MIN/MAX on floats, which propagate NaN, and half
precision arithmetic) large enough that on MPICH jaxmpi makes them itself, round a ring of
the ranks (backends/src/mpi/ring.rs), and on other MPIs calls MPI_Allreduce: the same
results either way. Bit for bit against numpy whichever rank holds a NaN or an infinity,
identical on every rank, in place and not, with blocks of unequal length, across the
4 MiB chunks an allreduce is cut into, on communicators split off and freed in turn, and
in the started form (MPI_Iallreduce, no ring)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import RANK, SIZE

# Elements a rank: a block of at least 64 KiB on each of 3 ranks, with a remainder; and
# past two 4 MiB chunks (float64: 524,288 elements each) by a few.
COUNTS = {"float64": [100_003, 1_048_579], "float32": [150_001], "float16": [300_007]}
CASES = [
    (dtype, op, n)
    for dtype, ops in (("float64", "MIN MAX"), ("float32", "MAX"), ("float16", "MAX SUM"))
    for op in ops.split()
    for n in COUNTS[dtype]
]


def inputs(dtype: str, n: int, seed: int) -> np.ndarray:
    """Every rank's input, the same on every rank: values of all signs, and NaN and
    infinities at a few places, each on one rank chosen at random."""
    rng = np.random.default_rng(seed)
    rows = (rng.standard_normal((SIZE, n)) * 100).astype(dtype)
    for special in (np.nan, np.inf, -np.inf):
        rows[rng.integers(SIZE, size=7), rng.integers(n, size=7)] = special
    return rows


def expected(op: str, rows: np.ndarray) -> np.ndarray:
    if op == "SUM":  # jaxmpi's half-precision op: each step in float32, rounded back
        return rows.astype(np.float32).sum(axis=0).astype(rows.dtype)
    return (np.maximum if op == "MAX" else np.minimum).reduce(rows, axis=0)


def check(got, rows: np.ndarray, op: str, what: str, comm=jaxmpi.COMM_WORLD) -> None:
    got = np.asarray(got)
    want = expected(op, rows)
    if op == "SUM":  # the order of the steps differs by route and by rank count
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=1.0, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)
    # Every rank holds the same bits.
    every = np.asarray(jaxmpi.allgather(jnp.asarray(got), comm=comm))
    assert all(np.array_equal(row.view(np.uint8), got.view(np.uint8)) for row in every), what


@pytest.mark.parametrize(("dtype", "op", "n"), CASES)
def test_large_allreduce_of_own_ops_is_exact(dtype, op, n):
    reduce_op = getattr(jaxmpi, op)
    rows = inputs(dtype, n, seed=n)
    mine = rows[RANK]
    copied = jax.jit(lambda v: jaxmpi.allreduce(v, reduce_op))
    check(copied(jnp.asarray(mine)), rows, op, f"{op} {dtype} x {n}")
    in_place = jax.jit(lambda v: jaxmpi.allreduce(v, reduce_op), donate_argnums=0)
    check(in_place(jnp.asarray(mine)), rows, op, f"{op} {dtype} x {n}, in place")
    started = jax.jit(lambda v: jaxmpi.wait(jaxmpi.iallreduce(v, reduce_op)))
    check(started(jnp.asarray(mine)), rows, op, f"{op} {dtype} x {n}, started")


def test_communicators_split_off_and_freed_in_turn():
    """Each communicator gets a private duplicate at its first large MAX, freed with it
    (tests/interposer_jobs.sh counts the frees): a communicator in reversed rank order,
    used, freed, then the next, and the world's own duplicate still right after."""
    rows = inputs("float64", 40_000 * max(SIZE, 2), seed=7)
    for round_ in range(40):
        comm = jaxmpi.COMM_WORLD.Split(0, key=-RANK)
        assert comm.Get_rank() == SIZE - 1 - RANK
        got = jaxmpi.allreduce(jnp.asarray(rows[RANK]), jaxmpi.MAX, comm=comm)
        check(got, rows, "MAX", f"round {round_}", comm=comm)
        comm.Free()
    # The world's own duplicate is unaffected.
    got = jaxmpi.allreduce(jnp.asarray(rows[RANK]), jaxmpi.MAX)
    check(got, rows, "MAX", "after the splits")
