"""Programs whose devices take different paths, through the device-rank layer
(core/src/xla/mesh/): the cases issue 57 found hanging, each at every layout of the
layouts' cells (2x1, 2x2, 1x4, 4x1, 3x1, 3x2), and the divergences no collective can
match, which must fail every member alike, never hang or corrupt.

- a `cond` per local device whose branches hold collectives over the process axis (a
  ppermute's pairs name devices of both branches: each permute is split into the groups
  its pairs connect);
- permutes, GSPMD reductions and a loop with a trip count per device, where a process's
  pieces may all be local (every process of a group makes its communicators, whatever
  its own part);
- MeshComm point to point with PROC_NULL ends (a PROC_NULL end meets too);
- collectives that differ between the devices of one group: an error naming each
  device's call, on every process, and the layer works on.

Expected values are numpy's, from the global input. Each program runs under `within`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from layouts import DEVICES, LOCAL, MESH, PROCESSES, N, check, check_ppermute, per_block, put, smap

import jaxmpi
from helpers import within

CELLS = P(("proc", "local"))  # block (p, l) of the global array on device (p, l)


@functools.cache
def grid() -> Mesh:
    """The (process, local device) mesh (made when first asked: collecting the tests
    elsewhere than in their layout must not fail)."""
    return Mesh(np.array(DEVICES).reshape(PROCESSES, LOCAL), ("proc", "local"))


def cells(rows: int = 2, cols: int = 3, dtype=np.float32) -> np.ndarray:
    """A global array of one (rows, cols) block per device, integers (exact in any order)."""
    return (np.arange(N * rows * cols) % 29 - 9).reshape(N * rows, cols).astype(dtype)


def on_grid(x: np.ndarray) -> np.ndarray:
    """`x`'s blocks as [p, l, rows, cols]."""
    return per_block(x).reshape(PROCESSES, LOCAL, *per_block(x).shape[1:])


def from_grid(blocks: np.ndarray) -> np.ndarray:
    return blocks.reshape(N * blocks.shape[2], *blocks.shape[3:])


# --- 1. Branches per local device, each with collectives over the process axis ---------


def test_branches_per_device_with_a_permute_naming_devices_of_both():
    """Devices of local index 0 psum over the process axis; the others pmax over it, then
    pass the result around the process ring: the permute's pairs name every device, but
    only the devices of the second branch run it."""
    ring = [(p, (p + 1) % PROCESSES) for p in range(PROCESSES)]

    def body(v):
        return jax.lax.cond(
            jax.lax.axis_index("local") == 0,
            lambda v: jax.lax.psum(v, "proc"),
            lambda v: jax.lax.ppermute(jax.lax.pmax(v, "proc"), "proc", ring) + 0.5,
            v,
        )

    x = cells()
    with within("cond: psum, or pmax then a ring permute, per local device"):
        got = jax.block_until_ready(smap(body, CELLS, CELLS, grid())(put(x, CELLS, grid())))
    blocks = on_grid(x)
    want = np.empty_like(blocks)
    want[:, 0] = blocks[:, 0].sum(0)
    want[:, 1:] = blocks[:, 1:].max(0) + 0.5  # the same on every process: the ring moves it
    check(got, from_grid(want), "psum or ppermute(pmax) per local device")


def test_a_loop_whose_trip_count_differs_per_device_around_a_permute():
    """Row p of the grid runs p + 1 steps of a ring permute along its own devices, and
    column l runs l + 1 steps along the process axis: each permute's groups take one trip
    count, while a process's devices run different ones."""
    local_ring = [(j, (j + 1) % LOCAL) for j in range(LOCAL)]
    proc_ring = [(p, (p + 1) % PROCESSES) for p in range(PROCESSES)]

    def body(v):
        along_local = jax.lax.fori_loop(
            0,
            jax.lax.axis_index("proc") + 1,
            lambda _, w: jax.lax.ppermute(w, "local", local_ring) + 1,
            v,
        )
        along_proc = jax.lax.fori_loop(
            0,
            jax.lax.axis_index("local") + 1,
            lambda _, w: jax.lax.ppermute(w, "proc", proc_ring) * 2,
            v,
        )
        return along_local, along_proc

    x = cells()
    with within("loops of permutes, a trip count per device"):
        a, b = jax.block_until_ready(
            smap(body, CELLS, (CELLS, CELLS), grid())(put(x, CELLS, grid()))
        )
    blocks = on_grid(x)
    want_a, want_b = np.empty_like(blocks), np.empty_like(blocks)
    for p in range(PROCESSES):
        want_a[p] = np.roll(blocks[p], p + 1, axis=0) + p + 1
    for j in range(LOCAL):
        want_b[:, j] = np.roll(blocks[:, j], j + 1, axis=0) * 2 ** (j + 1)
    check(a, from_grid(want_a), "ring along local, p + 1 steps")
    check(b, from_grid(want_b), "ring along proc, l + 1 steps")


# --- 2. Groups whose processes have nothing to send themselves -------------------------


def test_a_permute_with_self_loops_at_both_ends_and_swaps_between():
    """Devices 0 and N - 1 keep their blocks, the devices between swap in pairs (the odd
    one out keeps its own too): at 3 x 2, process 1's pieces are all its own."""
    middle = list(range(1, N - 1))
    perm = [(0, 0)] + ([(N - 1, N - 1)] if N > 1 else [])
    for a, b in zip(middle[::2], middle[1::2]):
        perm += [(a, b), (b, a)]
    if len(middle) % 2:
        perm.append((middle[-1], middle[-1]))
    check_ppermute(cells(dtype=np.int32), perm)


@pytest.mark.parametrize("along", [0, 1])
def test_gspmd_reductions_along_a_sharded_axis(along):
    """A sum, a max and a cumulative sum along either axis of an array sharded over the
    (proc, local) grid: XLA inserts the collectives (all-reduces, all-gathers,
    permutes)."""
    spec = P("proc", "local")
    x = (np.arange(PROCESSES * 4 * LOCAL * 3) % 31 - 12).reshape(PROCESSES * 4, LOCAL * 3)
    x = x.astype(np.float32)
    kept = P("local") if along == 0 else P("proc")
    program = jax.jit(
        lambda v: (v.sum(along), v.max(along), jnp.cumsum(v, along)),
        out_shardings=(
            NamedSharding(grid(), kept),
            NamedSharding(grid(), P()),
            NamedSharding(grid(), spec),
        ),
    )
    with within(f"sum, max and cumsum along axis {along}"):
        total, most, running = jax.block_until_ready(program(put(x, spec, grid())))
    check(total, x.sum(along), f"sum along {along}")
    check(most, x.max(along), f"max along {along}")
    check(running, np.cumsum(x, along), f"cumsum along {along}")


# --- 3. MeshComm point to point with PROC_NULL ends ------------------------------------


COMM = jaxmpi.MeshComm(MESH)
NULL = jaxmpi.PROC_NULL


def test_a_pipeline_of_sends_and_receives_with_open_ends():
    """Rank q sends to q + 1 and receives from q - 1; the last sends to nobody, the first
    receives from nobody (keeping its template)."""
    dest = [q + 1 if q + 1 < N else NULL for q in range(N)]
    source = [q - 1 if q > 0 else NULL for q in range(N)]
    x = cells()

    def pipeline(b):
        jaxmpi.send(b, dest, comm=COMM)
        return jaxmpi.recv(-b, source, comm=COMM)

    with within("send, then recv, PROC_NULL at the ends"):
        got = jax.block_until_ready(smap(pipeline)(put(x)))
    xs = per_block(x)
    check(got, np.concatenate([-xs[:1], xs[:-1]]).reshape(x.shape), "pipeline")


def test_point_to_point_where_most_ranks_talk_to_nobody():
    """Rank 0 sends to rank N - 1, which receives from it; every other rank's peers are
    PROC_NULL, in separate sends and receives and in one sendrecv."""
    last = N - 1
    dest = [last if q == 0 else NULL for q in range(N)]
    source = [0 if q == last else NULL for q in range(N)]
    x = cells()

    def talk(b):
        jaxmpi.send(b, dest, tag=3, comm=COMM)
        received = jaxmpi.recv(-b, source, tag=3, comm=COMM)
        exchanged = jaxmpi.sendrecv(b * 2, -b, source, dest, comm=COMM)
        return received, exchanged

    with within("point to point, PROC_NULL but for one pair"):
        received, exchanged = jax.block_until_ready(smap(talk, out_specs=(P("i"), P("i")))(put(x)))
    xs = per_block(x)
    want = -xs.copy()
    want[last] = xs[0]
    check(received, want.reshape(x.shape), "send and recv")
    want[last] = xs[0] * 2
    check(exchanged, want.reshape(x.shape), "sendrecv")


# --- 4. Collectives no meeting can match --------------------------------------------------


def divergent(body, x, spec, mesh):
    """The error `body` raises on this process, after which a psum still runs right."""
    with within("collectives that differ between the devices of a group"):
        try:
            jax.block_until_ready(smap(body, spec, spec, mesh)(put(x, spec, mesh)))
            message = None
        except Exception as err:  # JAX wraps it in its own type
            message = str(err)
        after = smap(lambda v: jax.lax.psum(v, "i"))(put(cells()))
        jax.block_until_ready(after)
    check(after, np.tile(per_block(cells()).sum(0), (N, 1)), "psum after the failed program")
    return message


needs_local_devices = pytest.mark.skipif(LOCAL < 2, reason="needs 2 devices or more a process")


@needs_local_devices
@pytest.mark.parametrize("differ", ["op", "shape"])
def test_collectives_that_differ_between_the_devices_of_a_group_fail_every_one(differ):
    """Devices of one group take different branches, each with a collective over the
    group: a psum against a pmax, or all-gathers of different lengths (which a meeting
    would have run on the first device's length). Every device fails, naming each call."""

    branches = {
        "op": (lambda v: jax.lax.psum(v, "local"), lambda v: jax.lax.pmax(v, "local")),
        "shape": (
            lambda v: jax.lax.all_gather(v, "local", tiled=True),
            lambda v: jnp.tile(jax.lax.all_gather(v[:1], "local", tiled=True), (2, 1)),
        ),
    }[differ]

    def body(v):
        return jax.lax.cond(jax.lax.axis_index("local") == 0, *branches, v)

    message = divergent(body, cells(), CELLS, grid())
    assert message is not None, "the divergent program returned"
    assert "took different paths through the program" in message, message
    called = "hlo_all_reduce" if differ == "op" else "hlo_all_gather"
    assert message.count(f"calls {called}") == LOCAL, message


@needs_local_devices
def test_mesh_comm_ops_that_differ_between_ranks_of_a_process_fail_every_one():
    """Even ranks sum, odd ranks take the max, on one MeshComm."""

    def body(v):
        return jax.lax.cond(
            COMM.Get_rank() % 2 == 0,
            lambda v: jaxmpi.allreduce(v, jaxmpi.SUM, comm=COMM),
            lambda v: jaxmpi.allreduce(v, jaxmpi.MAX, comm=COMM),
            v,
        )

    message = divergent(body, cells(), P("i"), MESH)
    assert message is not None, "the divergent program returned"
    assert "took different paths through the program" in message, message
    assert "calls allreduce" in message, message
