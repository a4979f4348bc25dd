"""jaxmpi's own ops on a MeshComm, a communicator whose ranks are devices, inside
`shard_map`, in every layout of devices per process (the layouts' cells: 2x1, 2x2, 1x4,
4x1). Each op's result is compared, bit for bit, with what the op defines, computed in
numpy from the global input: the same value every layout must give, so 2x2 and 1x4 agree
with 4x1. Reductions, by default MPI's own between processes, agree to rounding; under
JAXMPI_MESH_REDUCTIONS=ordered (a cell of its own) they fold in rank order, x0 op (x1 op
(... op xn)), in every layout, and are compared bit for bit too.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from layouts import BLOCKS, DEVICES, LOCAL, MESH, N, check, put, smap

import jaxmpi
from helpers import MPI, assert_array

COMM = jaxmpi.MeshComm(MESH)
RING_RIGHT, RING_LEFT = (lambda r: (r + 1) % N), (lambda r: (r - 1) % N)


ORDERED = os.environ.get("JAXMPI_MESH_REDUCTIONS") == "ordered"


def check_reduced(got: jax.Array, expected: np.ndarray, what: str) -> None:
    """As `check` under ordered reductions, or for integers; else to float rounding."""
    if ORDERED or not np.issubdtype(expected.dtype, np.floating):
        check(got, expected, what)
        return
    for shard in got.addressable_shards:
        np.testing.assert_allclose(
            np.asarray(shard.data), expected[shard.index], rtol=2e-6, err_msg=what
        )


def rows(dtype=np.float32, cols: int = 5) -> np.ndarray:
    """(N, cols): row r is rank r's; floats that round when summed, so the order shows."""
    values = np.random.default_rng(7).standard_normal((N, cols)) * 1e3
    return values.astype(dtype)


def folded(blocks, op=np.add) -> np.ndarray:
    """x0 op (x1 op (... op xn)): the rank order every layout reduces in."""
    result = blocks[-1]
    for block in blocks[-2::-1]:
        result = op(block, result)
    return result


def test_the_ranks_are_the_mesh_devices_in_mesh_order():
    got = smap(lambda x: jnp.full((1,), COMM.Get_rank()))(put(np.zeros(N, np.int32)))
    check(got, np.arange(N, dtype=np.int32), "Get_rank")
    assert COMM.Get_size() == N


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_allreduce(dtype):
    x = rows(dtype)
    got = smap(lambda b: jaxmpi.allreduce(b, jaxmpi.SUM, comm=COMM))(put(x))
    check_reduced(got, np.broadcast_to(folded(x), x.shape), "allreduce")


def chained(blocks, op=np.add) -> np.ndarray:
    """(x0 op x1) op x2 ...: a scan's order along the ranks in every layout."""
    result = blocks[0]
    for block in blocks[1:]:
        result = op(result, block)
    return result


def check_scanned(got: jax.Array, expected: np.ndarray, what: str) -> None:
    """A scan's own order, bit for bit, except on one device per process in the fast mode,
    where it is MPI_Scan's."""
    if LOCAL == 1 and not ORDERED:
        check_reduced(got, expected, what)
    else:
        check(got, expected, what)


def test_scan_and_exscan():
    x = rows()
    scanned = np.stack([chained(x[: r + 1]) for r in range(N)])
    exscanned = np.stack([np.zeros_like(x[0])] + [chained(x[:r]) for r in range(1, N)])
    check_scanned(smap(lambda b: jaxmpi.scan(b, jaxmpi.SUM, comm=COMM))(put(x)), scanned, "scan")
    exscan = smap(lambda b: jaxmpi.exscan(b, jaxmpi.SUM, comm=COMM))
    check_scanned(exscan(put(x)), exscanned, "exscan")
    counts = np.arange(1, N * 3 + 1, dtype=np.int32).reshape(N, 3)
    got = smap(lambda b: jaxmpi.scan(b, jaxmpi.PROD, comm=COMM))(put(counts))
    check(got, np.cumprod(counts, axis=0, dtype=np.int32), "scan PROD int32")


def test_reduce_scatter_and_max():
    x = rows()
    table = np.random.default_rng(3).standard_normal((N, N, 4)).astype(np.float32)
    got = smap(lambda b: jaxmpi.reduce_scatter(b[0], jaxmpi.SUM, comm=COMM)[None])(put(table))
    check_reduced(got, np.stack([folded(table[:, r]) for r in range(N)]), "reduce_scatter")
    got = smap(lambda b: jaxmpi.allreduce(b, jaxmpi.MAX, comm=COMM))(put(x))
    check(got, np.broadcast_to(x.max(0), x.shape), "allreduce MAX")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_and_min_give_nan_wherever_it_is(dtype):
    """As np.maximum and np.minimum: a NaN on any one rank (device), against a number and
    an infinity, gives NaN on every rank, whichever rank holds it."""
    max_min = smap(
        lambda b: (
            jaxmpi.allreduce(b, jaxmpi.MAX, comm=COMM),
            jaxmpi.allreduce(b, jaxmpi.MIN, comm=COMM),
        ),
        out_specs=(BLOCKS, BLOCKS),
    )
    for holder in range(N):
        x = rows(dtype)
        x[:, 1], x[:, 2] = np.inf, -np.inf
        x[holder, :3] = np.nan
        got_max, got_min = max_min(put(x))
        for got, op in ((got_max, np.maximum), (got_min, np.minimum)):
            expected = folded(x, op)
            assert np.isnan(expected[:3]).all(), expected
            check(got, np.broadcast_to(expected, x.shape), f"{op.__name__}, NaN on {holder}")


def test_allgather_and_alltoall():
    x = rows()
    got = smap(lambda b: jaxmpi.allgather(b[0], comm=COMM)[None])(put(x))
    check(got, np.broadcast_to(x, (N, *x.shape)), "allgather")
    table = np.arange(N * N * 2, dtype=np.int32).reshape(N, N, 2)
    got = smap(lambda b: jaxmpi.alltoall(b[0], comm=COMM)[None])(put(table))
    check(got, table.transpose(1, 0, 2), "alltoall")


def test_rooted_ops_give_every_device_a_result():
    x, root = rows(), N - 1
    got = smap(lambda b: jaxmpi.bcast(b, root, comm=COMM))(put(x))
    check(got, np.broadcast_to(x[root], x.shape), "bcast")
    got = smap(lambda b: jaxmpi.reduce(b, jaxmpi.SUM, root, comm=COMM))(put(x))
    expected = x.copy()
    expected[root] = folded(x)
    check_reduced(got, expected, "reduce: the root's the sum, the others' their operand")
    got = smap(lambda b: jaxmpi.gather(b[0], 0, comm=COMM)[None])(put(x))
    expected = np.zeros((N, *x.shape), x.dtype)
    expected[0] = x
    check(got, expected, "gather: the root's every row, the others' zeros")
    table = np.arange(N * N * 3, dtype=np.float32).reshape(N, N, 3)
    got = smap(lambda b: jaxmpi.scatter(b[0], root, comm=COMM)[None])(put(table))
    check(got, table[root], "scatter")


def test_a_periodic_halo_exchange_with_sendrecv():
    x = rows()

    def halo(b):
        left = jaxmpi.sendrecv(b[:, -1:], b[:, :1], RING_LEFT, RING_RIGHT, comm=COMM)
        right = jaxmpi.sendrecv(b[:, :1], b[:, -1:], RING_RIGHT, RING_LEFT, comm=COMM)
        return jnp.concatenate([left, b, right], axis=1)

    got = smap(halo)(put(x))
    expected = np.concatenate([np.roll(x[:, -1:], 1, 0), x, np.roll(x[:, :1], -1, 0)], axis=1)
    check(got, expected, "halo")


def test_open_ends_receive_nothing_and_keep_their_template():
    x = rows()
    left = [r - 1 if r > 0 else jaxmpi.PROC_NULL for r in range(N)]
    right = [r + 1 if r < N - 1 else jaxmpi.PROC_NULL for r in range(N)]
    got = smap(lambda b: jaxmpi.sendrecv(b, -b, left, right, comm=COMM))(put(x))
    expected = np.concatenate([-x[:1], x[:-1]])
    check(got, expected, "sendrecv with PROC_NULL at the ends")


def test_send_then_recv_in_separate_calls_around_a_ring():
    x = rows()

    def ring(b):
        jaxmpi.send(b, RING_RIGHT, tag=4, comm=COMM)
        return jaxmpi.recv(jnp.zeros_like(b), RING_LEFT, tag=4, comm=COMM)

    check(smap(ring)(put(x)), np.roll(x, 1, 0), "send, then recv")


@pytest.mark.parametrize("receive_first", [True, False], ids=["irecv-first", "isend-first"])
def test_a_non_blocking_ring(receive_first):
    """A receive started before its send (from a device of the same process too) completes
    at its wait; the interior computes meanwhile."""
    x = rows()

    def ring(b):
        if receive_first:
            got = jaxmpi.irecv(jnp.zeros_like(b), RING_LEFT, tag=2, comm=COMM)
            sent = jaxmpi.isend(b, RING_RIGHT, tag=2, comm=COMM)
        else:
            sent = jaxmpi.isend(b, RING_RIGHT, tag=2, comm=COMM)
            got = jaxmpi.irecv(jnp.zeros_like(b), RING_LEFT, tag=2, comm=COMM)
        interior = 2 * b
        jaxmpi.wait(sent)
        return jaxmpi.wait(got, after=interior) + interior

    check(smap(ring)(put(x)), np.roll(x, 1, 0) + 2 * x, "non-blocking ring")


def test_started_collectives():
    x = rows()

    def body(b):
        request = jaxmpi.iallreduce(b, jaxmpi.SUM, comm=COMM)
        return jaxmpi.wait(request) + jaxmpi.wait(jaxmpi.ibcast(b, 0, comm=COMM))

    check_reduced(
        smap(body)(put(x)), np.broadcast_to(folded(x) + x[0], x.shape), "iallreduce, ibcast"
    )


def test_ragged_alltoallv_moves_particles():
    """Rank r sends (r + q) % 3 rows to rank q, counts computed inside jit."""
    cols, capacity = 2, 3 * N
    rank = np.arange(N)
    counts = (rank[:, None] + rank[None, :]) % 3  # counts[r, q]: r sends to q
    x = np.arange(N * capacity * cols, dtype=np.float32).reshape(N, capacity, cols)

    def migrate(b):
        r = COMM.Get_rank()
        send = (r + jnp.arange(N)) % 3
        recv = (jnp.arange(N) + r) % 3
        return jaxmpi.alltoallv(b[0], send, recv, comm=COMM, recv_capacity=capacity)[None]

    got = smap(migrate)(put(x))
    expected = np.zeros_like(x)
    for q in range(N):
        parts = [x[r, counts[r, :q].sum() : counts[r, : q + 1].sum()] for r in range(N)]
        moved = np.concatenate(parts)
        expected[q, : len(moved)] = moved
    for shard in got.addressable_shards:
        q = shard.index[0].start
        n = counts[:, q].sum()
        assert_array(np.asarray(shard.data)[0, :n], expected[q, :n], f"alltoallv at rank {q}")


def test_sub_communicators_along_one_mesh_axis():
    if N % 2:
        pytest.skip(f"no 2-D mesh of {N} devices")
    grid = Mesh(np.array(DEVICES).reshape(2, N // 2), ("a", "b"))
    along_b = jaxmpi.MeshComm(grid, "b")
    x = rows().reshape(2, N // 2, -1)
    spec = P("a", "b")

    def body(block):
        return jaxmpi.allreduce(block, jaxmpi.SUM, comm=along_b) + 0 * along_b.Get_rank()

    got = smap(body, mesh=grid, in_specs=spec, out_specs=spec)(put(x, spec, grid))
    sums = np.stack([folded(x[a]) for a in range(2)])
    check_reduced(got, np.broadcast_to(sums[:, None], x.shape), "allreduce along b")


def test_gradient_of_an_allreduce_on_the_mesh_comm():
    """As on an MPI communicator (mpi4jax's rule: a rank's cotangent of the sum passes
    through to its operand), on every device."""
    x = rows()

    def loss(b):
        total = smap(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM, comm=COMM))(b)
        return jnp.sum(total**2)

    got = jax.jit(jax.grad(loss))(put(x))
    expected = np.broadcast_to(2 * folded(x), x.shape)
    for shard in got.addressable_shards:
        np.testing.assert_allclose(np.asarray(shard.data), expected[shard.index], rtol=1e-5)


def test_devices_delayed_differently_keep_every_op_in_order():
    """Each device computes a different while before each op, so the devices of a process
    reach the ops at different times and in a different order each step."""
    x, table = rows(), np.arange(N * N * 2, dtype=np.float32).reshape(N, N, 2)

    def busy(v, turns):
        spin = jax.lax.fori_loop(0, turns * 3000, lambda i, a: jnp.sin(a) + 1.0, v)
        return v + 0.0 * spin

    def body(b, t):
        r = COMM.Get_rank()
        for step in range(3):
            b = jaxmpi.allreduce(busy(b, (r + step) % N), jaxmpi.SUM, comm=COMM)
            t = jaxmpi.alltoall(busy(t[0], (N - r + step) % N), comm=COMM)[None]
            b = jaxmpi.sendrecv(busy(b, (r * step) % N), b, RING_LEFT, RING_RIGHT, comm=COMM)
        return b, t

    got_b, got_t = smap(body, in_specs=(BLOCKS, BLOCKS), out_specs=(BLOCKS, BLOCKS))(
        put(x), put(table)
    )
    b = x
    for _ in range(3):
        b = np.broadcast_to(folded(b), x.shape)
        table = table.transpose(1, 0, 2)
    check_reduced(got_b, b, "allreduce and sendrecv, three steps")
    check(got_t, table, "alltoall, three steps")


def test_vmap_over_a_batch_on_every_device():
    x = rows().reshape(N, 1, 5).repeat(3, axis=1) * np.arange(1, 4, dtype=np.float32)[:, None]
    body = jax.vmap(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM, comm=COMM), in_axes=1, out_axes=1)
    got = smap(body)(put(x))
    check_reduced(got, np.broadcast_to(folded(x), x.shape), "vmapped allreduce")


def test_checked_mode_compares_the_calls_of_every_device(checked):
    x = rows()
    got = smap(lambda b: jaxmpi.allreduce(b, jaxmpi.SUM, comm=COMM))(put(x))
    check_reduced(got, np.broadcast_to(folded(x), x.shape), "allreduce, checked")

    def mismatched(b):
        sum_or_max = [
            lambda v: jaxmpi.allreduce(v, jaxmpi.SUM, comm=COMM),
            lambda v: jaxmpi.allreduce(v, jaxmpi.MAX, comm=COMM),
        ]
        return jax.lax.switch(jnp.minimum(COMM.Get_rank(), 1), sum_or_max, b)

    with pytest.raises(Exception, match=r"do not make the same call: rank 0: .* SUM .* MAX"):
        jax.block_until_ready(smap(mismatched)(put(x)))


@pytest.mark.skipif(LOCAL == 1, reason="one device per process: an MPI communicator works")
def test_an_mpi_communicator_in_a_multi_device_program_points_to_mesh_comm():
    with pytest.raises(ValueError, match="MeshComm"):
        smap(lambda b: jaxmpi.allreduce(b, jaxmpi.SUM))(put(rows()))


def test_what_is_not_built_on_a_mesh_comm_says_so():
    with pytest.raises(ValueError, match="MeshComm"):
        smap(lambda b: jaxmpi.gatherv(b, [1] * N, 0, comm=COMM))(put(rows()))
    with pytest.raises(ValueError, match=r"inside jax\.shard_map"):
        COMM.Get_rank()
    with pytest.raises(ValueError, match="ANY_SOURCE on a MeshComm"):
        smap(lambda b: jaxmpi.recv(b, comm=COMM))(put(rows()))
    if MPI is not None:
        with pytest.raises(ValueError, match="status= on a MeshComm"):
            smap(lambda b: jaxmpi.recv(b, 0, status=MPI.Status(), comm=COMM))(put(rows()))
    with pytest.raises(ValueError, match="axis_names"):
        jaxmpi.MeshComm(MESH, "nope")


def test_v_ops_with_counts_read_at_run_time():
    """Rank r gives r % 3 + 1 rows (counts as an array: the form whose shapes do not
    follow the rank); every device gets a result, zeros away from gatherv's root."""
    counts = np.arange(N) % 3 + 1
    cols, capacity = 2, int(counts.sum())
    x = np.arange(N * 3 * cols, dtype=np.float32).reshape(N, 3, cols)
    rows = np.concatenate([x[r, : counts[r]] for r in range(N)])

    def gathered(b):
        return jaxmpi.allgatherv(b[0], jnp.asarray(counts), recv_capacity=capacity, comm=COMM)

    check(
        smap(lambda b: gathered(b)[None])(put(x)),
        np.broadcast_to(rows, (N, *rows.shape)),
        "allgatherv",
    )
    root = N - 1
    got = smap(
        lambda b: jaxmpi.gatherv(
            b[0], jnp.asarray(counts), root, recv_capacity=capacity, comm=COMM
        )[None]
    )(put(x))
    expected = np.zeros((N, *rows.shape), np.float32)
    expected[root] = rows
    check(got, expected, "gatherv: the root's, zeros elsewhere")
    table = np.broadcast_to(rows, (N, *rows.shape)).copy()
    got = smap(
        lambda b: jaxmpi.scatterv(b[0], jnp.asarray(counts), 0, recv_capacity=3, comm=COMM)[None]
    )(put(table))
    expected = np.zeros((N, 3, cols), np.float32)
    for r in range(N):
        expected[r, : counts[r]] = x[r, : counts[r]]
    check(got, expected, "scatterv")


def test_a_mesh_comm_over_other_devices_than_the_program_is_refused_when_lowered():
    half = jaxmpi.MeshComm(Mesh(np.array(DEVICES[: N // 2]), ("i",)))
    with pytest.raises(ValueError, match="are no rank of its MeshComm"):
        smap(lambda b: jaxmpi.allreduce(b, jaxmpi.SUM, comm=half))(put(rows()))
    with pytest.raises(ValueError, match="never run this program"):
        jax.jit(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM, comm=COMM))(np.ones(3, np.float32))
