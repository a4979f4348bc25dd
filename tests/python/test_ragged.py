"""Exchanges whose counts are computed inside jit: the v-collectives with `recv_capacity=`
and `ragged_all_to_all`, against numpy; in loops whose counts change every iteration;
grad and vmap; and every misuse failing all ranks alike with an MPIError.

Counts enter the jitted functions as arguments (traced), so nothing about them is known
at trace time. Every rank's rows are unique values any rank can compute (`rows_of`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import RANK, SIZE, allreduce_still_works, assert_array

ROOT = SIZE - 1
ROW_SHAPES = {"scalar-rows": (), "matrix-rows": (2, 3)}


def rows_of(rank: int, n: int, row=(2,), salt: int = 0) -> np.ndarray:
    """n rows of float32 unique to (rank, salt)."""
    size = int(np.prod(row, dtype=np.int64))
    base = np.arange(n * size, dtype=np.float32) + 1000 * rank + 100 * salt + 1
    return base.reshape((n, *row))


def pair(sender: int, receiver: int, k: int = 0) -> int:
    """Rows `sender` sends `receiver` (0, 1 or 2: zeros included), varying with k."""
    return (sender + 2 * receiver + 1 + k) % 3


def send_counts(rank: int, k: int = 0) -> np.ndarray:
    return np.array([pair(rank, p, k) for p in range(SIZE)], np.int32)


def recv_counts(rank: int, k: int = 0) -> np.ndarray:
    return np.array([pair(s, rank, k) for s in range(SIZE)], np.int32)


def padded(blocks, capacity: int, row) -> np.ndarray:
    data = np.concatenate([np.zeros((0, *row), np.float32), *blocks])
    return np.concatenate([data, np.zeros((capacity - len(data), *row), np.float32)])


def alltoallv_expected(rank: int, capacity: int, row=(2,), k: int = 0) -> np.ndarray:
    """What `rank` receives: from each sender s its block for `rank`, in rank order."""
    blocks = []
    for s in range(SIZE):
        start = int(send_counts(s, k)[:rank].sum())
        blocks.append(rows_of(s, ROWS, row, k)[start : start + pair(s, rank, k)])
    return padded(blocks, capacity, row)


def jitted_alltoallv(capacity: int):
    """Send counts as traced arguments; receive counts from one alltoall of them."""

    @jax.jit
    def f(x, sc):
        return jaxmpi.alltoallv(x, sc, jaxmpi.alltoall(sc), recv_capacity=capacity)

    return f


# Each rank sends at most 2 rows to each of SIZE ranks from an operand of ROWS rows (rows
# past what it sends are never read) and receives at most FULL rows.
ROWS = FULL = 2 * SIZE


@pytest.mark.parametrize("row", ROW_SHAPES.values(), ids=ROW_SHAPES.keys())
def test_alltoallv_traced_counts(row):
    x = rows_of(RANK, ROWS, row)
    got = jitted_alltoallv(FULL + 1)(x, send_counts(RANK))
    assert_array(got, alltoallv_expected(RANK, FULL + 1, row))


def test_alltoallv_capacity_exactly_full():
    """Every rank sends 2 rows to each: the receive fills the capacity exactly."""
    x = rows_of(RANK, 2 * SIZE)
    sc = np.full(SIZE, 2, np.int32)
    got = jitted_alltoallv(2 * SIZE)(x, sc)
    expected = np.concatenate([rows_of(s, 2 * SIZE)[2 * RANK : 2 * RANK + 2] for s in range(SIZE)])
    assert_array(got, expected)


@pytest.mark.parametrize("capacity", [0, 3])
def test_zero_counts(capacity):
    got = jitted_alltoallv(capacity)(rows_of(RANK, 2), np.zeros(SIZE, np.int32))
    assert_array(got, np.zeros((capacity, 2), np.float32))


def test_all_rows_to_one_rank():
    """Every rank sends all 3 of its rows to rank 0, which receives them all."""
    sc = np.zeros(SIZE, np.int32)
    sc[0] = 3
    got = jitted_alltoallv(3 * SIZE)(rows_of(RANK, 3), sc)
    if RANK == 0:
        expected = np.concatenate([rows_of(s, 3) for s in range(SIZE)])
    else:
        expected = np.zeros((3 * SIZE, 2), np.float32)
    assert_array(got, expected)


def counts_of_all(k: int = 0) -> np.ndarray:
    """Per-rank counts for the rooted and all-gather ops: int64 (the others use int32)."""
    return np.array([(r + 2 + k) % 3 for r in range(SIZE)], np.int64)


def test_allgatherv_traced_counts():
    n = counts_of_all()
    f = jax.jit(lambda x, n: jaxmpi.allgatherv(x, n, recv_capacity=2 * SIZE + 1))
    got = f(rows_of(RANK, 2), n)
    expected = padded([rows_of(r, 2)[: n[r]] for r in range(SIZE)], 2 * SIZE + 1, (2,))
    assert_array(got, expected)


def test_gatherv_traced_counts():
    n = counts_of_all()
    f = jax.jit(lambda x, n: jaxmpi.gatherv(x, n, ROOT, recv_capacity=2 * SIZE))
    got = f(rows_of(RANK, 2), n)
    if RANK == ROOT:
        expected = padded([rows_of(r, 2)[: n[r]] for r in range(SIZE)], 2 * SIZE, (2,))
    else:
        expected = rows_of(RANK, 2)  # as the static gatherv: the input back
    assert_array(got, expected)


def test_scatterv_traced_counts():
    n = counts_of_all()
    x = rows_of(ROOT, 2 * SIZE) if RANK == ROOT else np.zeros((0, 2), np.float32)
    got = jax.jit(lambda x, n: jaxmpi.scatterv(x, n, ROOT, recv_capacity=2))(x, n)
    start = int(n[:RANK].sum())
    assert_array(got, padded([rows_of(ROOT, 2 * SIZE)[start : start + n[RANK]]], 2, (2,)))


def test_static_counts_unchanged():
    """Without recv_capacity the static path is taken: its shape is sum(counts), and
    traced counts are refused at trace time, pointing to recv_capacity."""
    n = tuple(int(v) for v in counts_of_all())
    assert jaxmpi.allgatherv(rows_of(RANK, n[RANK]), n).shape == (sum(n), 2)
    with pytest.raises(TypeError, match="recv_capacity"):
        jax.jit(lambda x, n: jaxmpi.allgatherv(x, n))(rows_of(RANK, 2), counts_of_all())


# --- ragged_all_to_all: JAX's semantics --------------------------------------------------


def ragged_expected(rank, operands, outputs, io, ss, oo):
    """jax.lax.ragged_all_to_all's docstring pseudocode, in numpy: rank s's block for
    `rank` lands at s's output_offsets[rank] in `rank`'s output."""
    result = np.array(outputs[rank])
    for s in range(SIZE):
        block = operands[s][io[s][rank] : io[s][rank] + ss[s][rank]]
        result[oo[s][rank] : oo[s][rank] + len(block)] = block
    return result


@pytest.mark.skipif(SIZE != 2, reason="JAX's docstring example is for 2 devices")
def test_ragged_all_to_all_docstring_example():
    operand = [np.array([1, 2, 2], np.int32), np.array([3, 4, 0], np.int32)]
    io, ss = [[0, 1], [0, 1]], [[1, 2], [1, 1]]
    oo, rs = [[0, 0], [1, 2]], [[1, 1], [2, 1]]
    args = [np.asarray(a[RANK], np.int32) for a in (io, ss, oo, rs)]
    got = jaxmpi.ragged_all_to_all(operand[RANK], np.zeros(4, np.int32), *args)
    assert_array(got, np.array([[1, 3, 0, 0], [2, 2, 4, 0]][RANK], np.int32))
    outputs = [np.zeros(4, np.int32)] * 2
    assert_array(got, ragged_expected(RANK, operand, outputs, io, ss, oo))


def test_ragged_all_to_all_keeps_output_rows():
    """Blocks land at sender-chosen offsets with gaps; the output's other rows stay."""
    operands = [rows_of(r, 2 * SIZE) for r in range(SIZE)]
    outputs = [-rows_of(r, 3 * SIZE) for r in range(SIZE)]
    ss = [[pair(s, p) for p in range(SIZE)] for s in range(SIZE)]
    io = [[2 * p for p in range(SIZE)] for _ in range(SIZE)]  # padded blocks in operand
    oo = [[3 * s + 1 for _ in range(SIZE)] for s in range(SIZE)]  # a gap before each
    rs = [[ss[s][r] for s in range(SIZE)] for r in range(SIZE)]
    f = jax.jit(jaxmpi.ragged_all_to_all)
    args = [np.asarray(a[RANK], np.int32) for a in (io, ss, oo, rs)]
    got = f(operands[RANK], outputs[RANK], *args)
    assert_array(got, ragged_expected(RANK, operands, outputs, io, ss, oo))


def test_ragged_all_to_all_two_slices_per_rank():
    """JAX's pseudocode with N = 2 * SIZE slices: slice i goes to rank i // 2."""
    k, n = 2, 2 * SIZE
    operands = [rows_of(r, 2 * n) for r in range(SIZE)]
    outputs = [-rows_of(r, 4 * n) for r in range(SIZE)]
    ss = [[(s + i) % 3 for i in range(n)] for s in range(SIZE)]
    io = [[2 * i for i in range(n)] for _ in range(SIZE)]
    # Sender s's slice i lands on rank i // k at row 4 * (s * k + i % k) + 1.
    oo = [[4 * (s * k + i % k) + 1 for i in range(n)] for s in range(SIZE)]
    rs = [[ss[i // k][r * k + i % k] for i in range(n)] for r in range(SIZE)]
    args = [np.asarray(a[RANK], np.int32) for a in (io, ss, oo, rs)]
    got = jax.jit(jaxmpi.ragged_all_to_all)(operands[RANK], outputs[RANK], *args)
    expected = np.array(outputs[RANK])
    for s in range(SIZE):
        for i in range(RANK * k, RANK * k + k):  # JAX's SEND loop, seen from the receiver
            block = operands[s][io[s][i] : io[s][i] + ss[s][i]]
            expected[oo[s][i] : oo[s][i] + len(block)] = block
    assert_array(got, expected)


def test_ragged_all_to_all_slices_of_two_indices_on_the_same_rows_keep_the_last():
    """Each sender's two slices for a rank land on the same row: one exchange per slice
    index, so the second index's slice is what stays (documented; each index on its own
    has no overlap)."""
    k, n = 2, 2 * SIZE
    operands = [rows_of(r, n) for r in range(SIZE)]
    outputs = [-rows_of(r, SIZE) for r in range(SIZE)]
    ss = [[1] * n for _ in range(SIZE)]
    io = [list(range(n)) for _ in range(SIZE)]  # slice i is row i
    oo = [[s] * n for s in range(SIZE)]  # sender s's slices land on row s
    rs = [[1] * n for _ in range(SIZE)]
    args = [np.asarray(a[RANK], np.int32) for a in (io, ss, oo, rs)]
    got = jax.jit(jaxmpi.ragged_all_to_all)(operands[RANK], outputs[RANK], *args)
    expected = np.stack([operands[s][RANK * k + 1] for s in range(SIZE)])
    assert_array(got, expected)


# --- Loops: counts change every iteration ------------------------------------------------


def test_counts_change_every_iteration_in_fori_loop_and_scan():
    x = rows_of(RANK, ROWS)

    def step(k, acc):
        sc = ((RANK + 2 * jnp.arange(SIZE) + 1 + k) % 3).astype(jnp.int32)  # pair()
        y = jaxmpi.alltoallv(x, sc, jaxmpi.alltoall(sc), recv_capacity=FULL)
        return acc + y * (k + 1)

    got = jax.jit(lambda: jax.lax.fori_loop(0, 3, step, jnp.zeros((FULL, 2))))()
    expected = sum((k + 1) * alltoallv_expected_plain(RANK, FULL, k) for k in range(3))
    np.testing.assert_array_equal(got, expected)

    def body(acc, k):
        return step(k, acc), None

    scanned, _ = jax.jit(lambda: jax.lax.scan(body, jnp.zeros((FULL, 2)), jnp.arange(3)))()
    np.testing.assert_array_equal(scanned, expected)


def alltoallv_expected_plain(rank: int, capacity: int, k: int) -> np.ndarray:
    """As alltoallv_expected, with every rank's operand rows_of(s, ROWS) (no salt)."""
    blocks = []
    for s in range(SIZE):
        start = int(send_counts(s, k)[:rank].sum())
        blocks.append(rows_of(s, ROWS)[start : start + pair(s, rank, k)])
    return padded(blocks, capacity, (2,))


# --- Derivatives and vmap ----------------------------------------------------------------


def weights(rank: int, rows: int) -> np.ndarray:
    return np.arange(1, 2 * rows + 1, dtype=np.float32).reshape(rows, 2) * (rank + 1)


def test_grad_is_the_reverse_exchange():
    """d/dx sum(w * alltoallv(x)): each sent row gets the weight of the row it landed in
    on its receiver; rows not sent get zero."""
    sc = send_counts(RANK)
    f = jitted_alltoallv(FULL)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(weights(RANK, FULL) * f(x, sc))))(rows_of(RANK, ROWS))
    expected = np.zeros((ROWS, 2), np.float32)
    start = 0
    for p in range(SIZE):
        landing = int(sum(pair(s, p) for s in range(RANK)))
        n = pair(RANK, p)
        expected[start : start + n] = weights(p, FULL)[landing : landing + n]
        start += n
    assert_array(grad, expected)


def test_grad_of_ragged_all_to_all_output_is_kept_rows():
    sc = send_counts(RANK)
    rc = recv_counts(RANK)
    # Rank RANK's block lands on p after the blocks of lower ranks: packed from row 0.
    oo = np.array([int(sum(pair(s, p) for s in range(RANK))) for p in range(SIZE)], np.int32)
    io = np.concatenate([[0], np.cumsum(sc)[:-1]]).astype(np.int32)

    def loss(out):
        y = jaxmpi.ragged_all_to_all(rows_of(RANK, ROWS), out, io, sc, oo, rc)
        return jnp.sum(weights(RANK, FULL) * y)

    grad = jax.jit(jax.grad(loss))(np.zeros((FULL, 2), np.float32))
    expected = weights(RANK, FULL)
    expected[: int(rc.sum())] = 0  # rows received into: their old values do not matter
    assert_array(grad, expected)


def test_vmap_shared_and_batched_counts():
    sc = send_counts(RANK)
    xs = np.stack([rows_of(RANK, ROWS), 2 * rows_of(RANK, ROWS)])
    f = jitted_alltoallv(FULL)
    shared = jax.jit(jax.vmap(f, in_axes=(0, None)))(xs, sc)
    expected = alltoallv_expected_plain(RANK, FULL, 0)
    assert_array(shared, np.stack([expected, 2 * expected]))
    batched_counts = np.stack([send_counts(RANK, 0), send_counts(RANK, 1)])
    per_entry = jax.jit(jax.vmap(f))(xs, batched_counts)
    expected1 = 2 * alltoallv_expected_plain(RANK, FULL, 1)
    assert_array(per_entry, np.stack([expected, expected1]))


# --- Misuse: an MPIError on every rank, naming the op, the ranks and the numbers ---------


def failure(fn, *args) -> str:
    """The error `fn(*args)` raised (it must raise an MPIError), as text."""
    try:
        with jaxmpi.raise_mpi_errors():
            jax.block_until_ready(fn(*args))
    except jaxmpi.MPIError as e:
        return str(e)
    return "no error"


def expect_failure(message: str, *phrases: str) -> None:
    allreduce_still_works()
    missing = [p for p in phrases if p not in message]
    assert not missing, f"{message!r} lacks {missing}"


def test_capacity_too_small_fails_every_rank():
    message = failure(jitted_alltoallv(1), rows_of(RANK, ROWS), np.full(SIZE, 2, np.int32))
    expect_failure(message, "alltoallv", "ends past the result's 1 rows", "recv_capacity")


def test_disagreeing_sizes_fail_every_rank():
    f = jax.jit(lambda x, sc, rc: jaxmpi.alltoallv(x, sc, rc, recv_capacity=FULL))
    message = failure(f, rows_of(RANK, ROWS), np.ones(SIZE, np.int32), np.full(SIZE, 2, np.int32))
    expect_failure(message, "alltoallv", "sends 1 rows here, but this rank expects 2")


def test_negative_count_on_one_rank_fails_every_rank():
    sc = np.ones(SIZE, np.int32)
    if RANK == 0:
        sc[-1] = -1
    f = jax.jit(lambda x, sc: jaxmpi.alltoallv(x, sc, np.ones(SIZE, np.int32), recv_capacity=FULL))
    message = failure(f, rows_of(RANK, ROWS), sc)
    if RANK == 0:
        expect_failure(message, "alltoallv", "count -1", "negative")
    else:
        expect_failure(message, "alltoallv", "rank")


@pytest.mark.skipif(SIZE < 2, reason="needs a rank calling another op")
def test_ranks_calling_different_ops_fail_every_rank():
    """An allgatherv moves by MPI_Allgatherv, an alltoallv by MPI_Alltoallv: ranks that
    call the two at one point must all stop before either, not meet in different calls."""
    ones = np.ones(SIZE, np.int32)
    if RANK == 0:
        f = jax.jit(lambda x: jaxmpi.allgatherv(x, ones, recv_capacity=FULL))
    else:
        f = jax.jit(lambda x: jaxmpi.alltoallv(x, ones, ones, recv_capacity=FULL))
    message = failure(f, rows_of(RANK, ROWS))
    mine, other = ("allgatherv", "alltoallv") if RANK == 0 else ("alltoallv", "allgatherv")
    expect_failure(message, "the ranks call different ops", f"this rank {mine}", other)


def test_offsets_past_the_operand_fail():
    n = np.ones(SIZE, np.int32)
    io = np.full(SIZE, 3, np.int32)
    oo = np.arange(SIZE, dtype=np.int32)
    message = failure(
        jaxmpi.ragged_all_to_all, rows_of(RANK, 3), np.zeros((SIZE, 2), np.float32), io, n, oo, n
    )
    expect_failure(message, "ragged_all_to_all", "ends past the operand's 3 rows")


@pytest.mark.skipif(SIZE < 2, reason="needs two senders")
def test_overlapping_blocks_fail():
    """Every sender's block lands at row 0 of every receiver."""
    n, zeros = np.ones(SIZE, np.int32), np.zeros(SIZE, np.int32)
    x, out = rows_of(RANK, SIZE), np.zeros((SIZE, 2), np.float32)
    message = failure(
        jaxmpi.ragged_all_to_all, x, out, np.arange(SIZE, dtype=np.int32), n, zeros, n
    )
    expect_failure(message, "ragged_all_to_all", "overlap in the result")


def test_bad_count_arrays_refused_while_tracing():
    x = rows_of(RANK, 2)
    n = np.ones(0, np.int32)
    with pytest.raises(ValueError, match=rf"k \* {SIZE} entries"):
        jaxmpi.ragged_all_to_all(x, x, n, n, n, n)
    with pytest.raises(ValueError, match=rf"shape \({SIZE},\)"):
        jaxmpi.alltoallv(x, np.zeros(SIZE + 1, np.int32), np.zeros(SIZE, np.int32), recv_capacity=2)
    with pytest.raises(TypeError, match="integers"):
        jaxmpi.allgatherv(x, np.zeros(SIZE, np.float32), recv_capacity=2)
    with pytest.raises(TypeError, match="recv_capacity must be a static int"):
        jaxmpi.allgatherv(x, np.zeros(SIZE, np.int32), recv_capacity=2.5)


# --- examples/particles.py ---------------------------------------------------------------


def test_particles_example_matches_the_serial_run():
    """The example's jitted loop (counts exchanged, then one ragged exchange, every step)
    against the same motion in numpy; from 2 ranks on a buffer smaller than all particles,
    so capacity is what bounds each rank."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "particles.py"
    spec = importlib.util.spec_from_file_location("particles_example", path)
    particles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(particles)
    everyone, expected, mine = particles.run(600, 30, capacity=600 if SIZE == 1 else 500)
    particles.check(everyone, expected)
    owners = np.asarray(particles.owner(jnp.asarray(mine[:, particles.X]), SIZE))
    assert (owners == RANK).all()
