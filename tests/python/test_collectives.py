"""Every op × eager/jit × scalar/array × every dtype, against numpy.

Each test runs one op once, on every rank, then compares with the value numpy computes
from every rank's input (see `rank_data` in helpers.py). Ops with a root use the last
rank as root, so code that assumes root 0 fails here; `test_every_root_*` tries them all.
"""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest

import jaxmpi
from helpers import (
    ALL_DTYPES,
    MODES,
    RANK,
    SIZE,
    all_inputs,
    alltoall_block,
    assert_array,
    call,
    default_op_name,
    expected_allreduce,
    expected_exscan,
    expected_reduce,
    expected_scan,
    jaxmpi_op,
    needs_ranks,
    partner_or_skip,
    rank_data,
)

# Every op over every dtype: the sweep the other MPIs thin (test_dtypes keeps each
# dtype's mapping); across hosts, a transport of its own.
pytestmark = [pytest.mark.dtype_sweep, pytest.mark.across_hosts]

ROOT = SIZE - 1
SHAPES = {"scalar": (), "array": (2, 3)}


def matrix(test):
    """Parametrizes `test` over mode × shape × dtype."""
    test = pytest.mark.parametrize("dtype", ALL_DTYPES)(test)
    test = pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))(test)
    return pytest.mark.parametrize("mode", MODES)(test)


# The elementwise reductions: (op, expected value from every rank's input).
REDUCTIONS = {
    "allreduce": (lambda x, op: jaxmpi.allreduce(x, op), expected_allreduce),
    "reduce": (
        lambda x, op: jaxmpi.reduce(x, op, ROOT),
        lambda name, inputs: expected_reduce(name, inputs, ROOT),
    ),
    "scan": (lambda x, op: jaxmpi.scan(x, op), expected_scan),
    "exscan": (lambda x, op: jaxmpi.exscan(x, op), expected_exscan),
}


@matrix
@pytest.mark.parametrize("reduction", list(REDUCTIONS))
def test_reduction(reduction, mode, shape, dtype):
    run, expected = REDUCTIONS[reduction]
    op = default_op_name(dtype)
    inputs = all_inputs(op, dtype, shape)
    got = call(mode, lambda x: run(x, jaxmpi_op(op)), inputs[RANK])
    assert_array(got, expected(op, inputs))


@matrix
def test_bcast(mode, shape, dtype):
    got = call(mode, lambda x: jaxmpi.bcast(x, ROOT), rank_data(RANK, dtype, shape))
    assert_array(got, rank_data(ROOT, dtype, shape))


@matrix
def test_gather(mode, shape, dtype):
    """The root gets every rank's input stacked; the other ranks get their input back."""
    mine = rank_data(RANK, dtype, shape)
    got = call(mode, lambda x: jaxmpi.gather(x, ROOT), mine)
    if RANK == ROOT:
        assert_array(got, np.stack([rank_data(r, dtype, shape) for r in range(SIZE)]))
    else:
        assert_array(got, mine)


@matrix
def test_allgather(mode, shape, dtype):
    got = call(mode, jaxmpi.allgather, rank_data(RANK, dtype, shape))
    assert_array(got, np.stack([rank_data(r, dtype, shape) for r in range(SIZE)]))


@matrix
def test_scatter(mode, shape, dtype):
    """The root holds one slice per rank; the others pass a template of one slice."""
    if RANK == ROOT:
        x = np.stack([rank_data(r, dtype, shape) for r in range(SIZE)])
    else:
        x = np.zeros(shape, dtype=rank_data(0, dtype).dtype)
    got = call(mode, lambda x: jaxmpi.scatter(x, ROOT), x)
    assert_array(got, rank_data(RANK, dtype, shape))


@matrix
def test_alltoall(mode, shape, dtype):
    """Rank r sends block i to rank i and gets block r of every rank, in rank order."""
    x = np.stack([alltoall_block(RANK, dst, dtype, shape) for dst in range(SIZE)])
    got = call(mode, jaxmpi.alltoall, x)
    assert_array(got, np.stack([alltoall_block(src, RANK, dtype, shape) for src in range(SIZE)]))


@matrix
def test_sendrecv(mode, shape, dtype):
    """A ring shift: everybody sends to the right and receives from the left (on one rank,
    a rank sends to itself)."""
    left, right = (RANK - 1) % SIZE, (RANK + 1) % SIZE
    template = np.zeros(shape, dtype=rank_data(0, dtype).dtype)
    got = call(
        mode,
        lambda x, t: jaxmpi.sendrecv(x, t, source=left, dest=right),
        rank_data(RANK, dtype, shape),
        template,
    )
    assert_array(got, rank_data(left, dtype, shape))


@needs_ranks(2)
@matrix
def test_send_recv(mode, shape, dtype):
    """Pairs of ranks swap data: the even rank sends first, the odd one receives first."""
    partner = partner_or_skip()
    mine = rank_data(RANK, dtype, shape)
    template = np.zeros_like(mine)

    def swap(x, t):
        if RANK % 2 == 0:
            sent = jaxmpi.send(x, partner, tag=3)
            received = jaxmpi.recv(t, partner, tag=3)
        else:
            received = jaxmpi.recv(t, partner, tag=3)
            sent = jaxmpi.send(x, partner, tag=3)
        assert sent == []
        return received

    got = call(mode, swap, mine, template)
    assert_array(got, rank_data(partner, dtype, shape))


@pytest.mark.parametrize("mode", MODES)
def test_barrier_returns_empty_list(mode):
    got = call(mode, lambda: jaxmpi.barrier())
    assert got == []


@needs_ranks(2)
def test_barrier_waits_for_the_last_rank():
    """Rank 0 arrives late; every other rank must wait for it inside the barrier."""
    delay = 0.4
    jaxmpi.barrier()  # line everybody up first
    jax.effects_barrier()
    start = time.monotonic()
    if RANK == 0:
        time.sleep(delay)
    jaxmpi.barrier()
    jax.effects_barrier()
    waited = time.monotonic() - start
    assert waited > delay / 2, f"left the barrier after {waited:.3f} s"


def test_has_cuda_support_is_a_bool():
    supported = jaxmpi.has_cuda_support()
    assert isinstance(supported, bool)
    if not any(d.platform == "gpu" for d in jax.devices()):
        assert supported is False


# ---------------------------------------------------------------------------------------
# Every root, and inputs that are not JAX arrays
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("root", range(SIZE))
def test_every_root_bcast_reduce_gather_scatter(root):
    dtype, shape = "float32", (4,)
    mine = rank_data(RANK, dtype, shape)
    everyone = [rank_data(r, dtype, shape) for r in range(SIZE)]
    scatter_in = np.stack(everyone) if RANK == root else np.zeros(shape, np.float32)

    bcasted = jaxmpi.bcast(mine, root)
    reduced = jaxmpi.reduce(mine, jaxmpi.SUM, root)
    gathered = jaxmpi.gather(mine, root)
    scattered = jaxmpi.scatter(scatter_in, root)

    assert_array(bcasted, everyone[root], "bcast")
    assert_array(reduced, expected_reduce("SUM", everyone, root), "reduce")
    assert_array(gathered, np.stack(everyone) if RANK == root else mine, "gather")
    assert_array(scattered, mine, "scatter")


@pytest.mark.parametrize(
    "value",
    [3, 2.5, 1 + 2j, True, np.float32(1.5), np.arange(3, dtype=np.int16)],
    ids=["int", "float", "complex", "bool", "numpy-scalar", "numpy-array"],
)
def test_non_jax_inputs_are_accepted(value):
    """Python scalars and numpy scalars/arrays work wherever a JAX array does (a list is
    a pytree of its elements: test_trees.py)."""
    as_array = np.asarray(jax.numpy.asarray(value))
    op = default_op_name(as_array.dtype)
    got = jaxmpi.allreduce(value, jaxmpi_op(op))
    gathered = jaxmpi.allgather(value)
    assert_array(got, expected_allreduce(op, [as_array] * SIZE), "allreduce")
    assert_array(gathered, np.stack([as_array] * SIZE), "allgather")


def test_large_array():
    """A few MB, well past any eager-protocol threshold of the MPI library."""
    x = np.arange(1 << 20, dtype=np.float32) + RANK
    got = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM))(x)
    expected = np.arange(1 << 20, dtype=np.float32) * SIZE + SIZE * (SIZE - 1) // 2
    assert_array(got, expected)


def test_zero_size_array():
    x = np.zeros((0, 3), np.float32)
    per_rank = np.zeros((SIZE, 0), np.float32)
    reduced = jaxmpi.allreduce(x, jaxmpi.SUM)
    gathered = jaxmpi.allgather(x)
    exchanged = jaxmpi.alltoall(per_rank)
    scattered = jaxmpi.scatter(per_rank if RANK == 0 else np.zeros(0, np.float32), 0)
    assert_array(reduced, x, "allreduce")
    assert_array(gathered, np.zeros((SIZE, 0, 3), np.float32), "allgather")
    assert_array(exchanged, per_rank, "alltoall")
    assert_array(scattered, np.zeros(0, np.float32), "scatter")


def test_transposed_and_sliced_inputs_under_jit():
    """Inputs computed inside the program (a transpose, a strided slice) reach MPI in
    their logical row-major order."""
    x = np.arange(24, dtype=np.int32).reshape(4, 6) + 100 * RANK

    @jax.jit
    def run(x):
        return jaxmpi.allgather(x.T[::2]), jaxmpi.allreduce(x[:, 1::3].T, jaxmpi.SUM)

    gathered, reduced = run(x)
    everyone = [np.arange(24, dtype=np.int32).reshape(4, 6) + 100 * r for r in range(SIZE)]
    assert_array(gathered, np.stack([e.T[::2] for e in everyone]), "allgather")
    assert_array(reduced, expected_allreduce("SUM", [e[:, 1::3].T for e in everyone]), "allreduce")


def test_in_place_ops_leave_their_input_intact_under_jit():
    """Ops that may reuse their input's buffer for the result must not change a value the
    program still uses afterwards."""

    @jax.jit
    def run(x):
        reduced = jaxmpi.allreduce(x, jaxmpi.SUM)
        bcasted = jaxmpi.bcast(x, ROOT)
        scanned = jaxmpi.scan(x, jaxmpi.SUM)
        shifted = jaxmpi.sendrecv(x, x, source=(RANK - 1) % SIZE, dest=(RANK + 1) % SIZE)
        return x * 1, reduced, bcasted, scanned, shifted

    inputs = [rank_data(r, "float64", (5,)) for r in range(SIZE)]
    kept, reduced, bcasted, scanned, shifted = run(inputs[RANK])
    assert_array(kept, inputs[RANK], "x after the ops")
    assert_array(reduced, expected_allreduce("SUM", inputs), "allreduce")
    assert_array(bcasted, inputs[ROOT], "bcast")
    assert_array(scanned, expected_scan("SUM", inputs), "scan")
    assert_array(shifted, inputs[(RANK - 1) % SIZE], "sendrecv")


def test_donated_input():
    """With the input donated, in-place ops may write straight into it."""
    run = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM), donate_argnums=0)
    x = jax.numpy.asarray(rank_data(RANK, "float32", (1000,)))
    got = run(x)
    expected = expected_allreduce("SUM", [rank_data(r, "float32", (1000,)) for r in range(SIZE)])
    assert_array(got, expected)


def test_input_is_not_modified():
    """Ops that may work in place must not change the caller's array."""
    x = jax.numpy.asarray(rank_data(RANK, "float32"))
    before = np.array(x)
    jaxmpi.allreduce(x, jaxmpi.SUM)
    jaxmpi.bcast(x, ROOT)
    jaxmpi.scan(x, jaxmpi.SUM)
    jaxmpi.recv(x, jaxmpi.PROC_NULL)
    after = np.array(x)
    assert_array(after, before)
