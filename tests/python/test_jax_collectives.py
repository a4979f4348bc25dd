"""JAX's collectives through jaxmpi's own calls (`collectives="jaxmpi"`, JAX >= 0.10.2), in
every layout of devices per process: each collective XLA emits against numpy, every dtype,
groups over each axis of a mesh that splits processes and local devices, a mesh over some
of the processes only, the collectives GSPMD inserts, loops and branches holding them,
many in one program with ranks delayed differently (jaxmpi's own ops beside them:
test_ops_beside_collectives.py).

Runs in the layouts' cells of its own (layouts.py starts jax.distributed in the layout the
cell sets). Expected values are computed from the global input on every rank, and each rank
checks the blocks it holds.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import shard_map
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from layouts import (
    BLOCKS,
    DEVICES,
    LOCAL,
    MESH,
    PROCESSES,
    N,
    blocks_of,
    check,
    check_close,
    per_block,
    put,
    smap,
)

from helpers import ALL_DTYPES, FLOAT_DTYPES, RANK, SIZE, assert_array
from jaxmpi._binding import hlo_pass, jax_collectives


def test_the_layout_is_the_one_asked_for():
    assert (SIZE, jax.local_device_count()) == (PROCESSES, LOCAL)
    assert jax_collectives.chosen[0] == "jaxmpi", jax_collectives.chosen


def test_info_says_which_route_and_how_much_it_took():
    from jaxmpi.__main__ import info_lines

    smap(lambda a: jax.lax.psum(a, "i"))(put(blocks_of("float32")))
    line = next(line for line in info_lines() if line.startswith("JAX collectives"))
    assert "jaxmpi: asked for: jaxmpi's pass hands every collective" in line, line
    assert f"{hlo_pass.rewritten['collectives']} collectives in" in line, line


REDUCTIONS = {
    "psum": (jax.lax.psum, np.sum),
    "pmax": (jax.lax.pmax, np.max),
    "pmin": (jax.lax.pmin, np.min),
}


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_psum_pmax_pmin_of_every_dtype(dtype):
    x = blocks_of(dtype)
    got = {}
    for name, (collective, _) in REDUCTIONS.items():
        if dtype.startswith("complex") and name != "psum":
            continue  # XLA has no MIN/MAX on complex numbers
        if dtype == "bool" and name == "psum":
            continue  # JAX sums booleans as int32 (checked below)
        got[name] = smap(lambda a, c=collective: c(a, "i"))(put(x))
    for name, out in got.items():
        reducer = REDUCTIONS[name][1]
        # In float64 or complex128 (exact for these values), then back to the input's type.
        wide = per_block(x).astype(np.complex128 if dtype.startswith("complex") else np.float64)
        total = reducer(wide, axis=0).astype(x.dtype)
        check(out, np.tile(total, (N, 1)), f"{name} {dtype}")


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_collective_that_moves_data_and_psum_scatter_of_every_dtype(dtype):
    """all_gather, all_to_all, ppermute and psum_scatter in one program per dtype."""
    x = blocks_of(dtype, rows=N, cols=2)
    ring = [(j, (j + 1) % N) for j in range(N)]

    def body(a):
        gathered = jax.lax.all_gather(a, "i", tiled=True)[None]
        exchanged = jax.lax.all_to_all(a, "i", 0, 0, tiled=True)
        moved = jax.lax.ppermute(a, "i", ring)
        if dtype == "bool":
            return gathered, exchanged, moved
        return gathered, exchanged, moved, jax.lax.psum_scatter(a, "i", tiled=True)

    got = smap(body, out_specs=(BLOCKS,) * (3 if dtype == "bool" else 4))(put(x))
    blocks = per_block(x)
    check(got[0], np.stack([x] * N), f"all_gather {dtype}")
    chunks = [np.split(b, N) for b in blocks]
    swapped = [np.concatenate([chunks[s][t] for s in range(N)]) for t in range(N)]
    check(got[1], np.concatenate(swapped), f"all_to_all {dtype}")
    check(got[2], np.concatenate(np.roll(blocks, 1, axis=0)), f"ppermute {dtype}")
    if dtype != "bool":
        wide = blocks.astype(np.complex128 if dtype.startswith("complex") else np.float64)
        total = wide.sum(0).astype(x.dtype)
        check(got[3], total, f"psum_scatter {dtype}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_pmax_and_pmin_give_nan_wherever_it_is(dtype):
    """A NaN on any one device makes pmax and pmin NaN on every device, as XLA's max and
    min over the stacked blocks on one device give. MPI's own MAX and MIN keep or drop a
    NaN by which operand holds it, and so do reductions among a process's devices that
    use them: each device holds the NaN in turn, against a number and an infinity."""
    both = smap(lambda a: (jax.lax.pmax(a, "i"), jax.lax.pmin(a, "i")), out_specs=(BLOCKS,) * 2)
    on_one_device = {"pmax": jax.jit(lambda b: b.max(0)), "pmin": jax.jit(lambda b: b.min(0))}
    for holder in range(N):
        x = per_block(blocks_of(dtype)).copy()
        x[:, 1, 0], x[:, 1, 1] = np.inf, -np.inf
        x[holder, 0, 0] = x[holder, 1, 0] = x[holder, 1, 1] = np.nan
        x = np.concatenate(x)
        got = dict(zip(("pmax", "pmin"), both(put(x))))
        for name, out in got.items():
            total = np.asarray(on_one_device[name](jnp.asarray(per_block(x))))
            assert np.isnan(total[0, 0]) and np.isnan(total[1, :2]).all(), total
            check(out, np.tile(total, (N, 1)), f"{name} {dtype}, NaN on device {holder}")


def test_a_sum_of_booleans_is_an_int32_sum():
    x = blocks_of("bool")
    got = smap(lambda a: jax.lax.psum(a, "i"))(put(x))
    check(got, np.tile(per_block(x).sum(0, dtype=np.int32), (N, 1)), "psum bool")


def test_independent_sums_of_mixed_types_in_one_program():
    """XLA merges independent sums into one variadic all-reduce: one call, several arrays."""
    xs = [blocks_of(d) for d in ("float32", "float32", "int32", "float16")]
    got = smap(lambda *a: tuple(jax.lax.psum(v, "i") for v in a), (P("i"),) * 4, (P("i"),) * 4)(
        *map(put, xs)
    )
    for x, out in zip(xs, got):
        check(out, np.tile(per_block(x).sum(0).astype(x.dtype), (N, 1)), f"psum {x.dtype}")


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("tiled", [True, False])
def test_all_gather(axis, tiled):
    x = blocks_of("float32")
    got = smap(lambda a: jax.lax.all_gather(a, "i", axis=axis, tiled=tiled)[None])(put(x))
    blocks = per_block(x)
    whole = np.concatenate(blocks, axis=axis) if tiled else np.stack(blocks, axis=axis)
    check(got, np.stack([whole] * N), f"all_gather axis={axis} tiled={tiled}")


@pytest.mark.parametrize("dimension", [0, 1])
def test_psum_scatter(dimension):
    x = blocks_of("int32", rows=N * 2, cols=N * 3)
    got = smap(lambda a: jax.lax.psum_scatter(a, "i", scatter_dimension=dimension, tiled=True))(
        put(x)
    )
    total = per_block(x).sum(0).astype(x.dtype)
    parts = np.split(total, N, axis=dimension)
    check(got, np.concatenate(parts, axis=0), f"psum_scatter dimension={dimension}")


@pytest.mark.skipif(
    not hasattr(jax.lax, "psum_scatter_start"),
    reason=f"JAX {jax.__version__} has no asynchronous collectives (JAX >= 0.12)",
)
@pytest.mark.parametrize("dimension", [0, 1])
def test_psum_scatter_started_and_done(dimension):
    """JAX 0.12's asynchronous form: XLA:CPU hands the pass a plain reduce-scatter, which
    MPI carries like psum_scatter's (the compiled program calls jaxmpi's handler)."""
    x = blocks_of("int32", rows=N * 2, cols=N * 3)
    started = smap(
        lambda a: jax.lax.psum_scatter_start(a, "i", scatter_dimension=dimension, tiled=True).done()
    )
    compiled = started.lower(put(x)).compile().as_text()
    assert 'custom_call_target="jaxmpi_hlo_reduce_scatter"' in compiled, compiled
    total = per_block(x).sum(0).astype(x.dtype)
    parts = np.split(total, N, axis=dimension)
    check(started(put(x)), np.concatenate(parts, axis=0), f"started dimension={dimension}")


@pytest.mark.parametrize("split_axis,concat_axis", [(0, 0), (1, 0), (0, 1)])
def test_all_to_all(split_axis, concat_axis):
    x = blocks_of("float64", rows=N * 2, cols=N * 3)
    got = smap(lambda a: jax.lax.all_to_all(a, "i", split_axis, concat_axis, tiled=True))(put(x))
    blocks = per_block(x)
    chunks = [np.split(b, N, axis=split_axis) for b in blocks]  # chunks[source][target]
    expected = [
        np.concatenate([chunks[s][t] for s in range(N)], axis=concat_axis) for t in range(N)
    ]
    check(got, np.concatenate(expected, axis=0), f"all_to_all {split_axis}->{concat_axis}")


@pytest.mark.parametrize("axis", [0, 1])
def test_a_tiled_all_to_all_is_one_call_on_the_whole_array(axis):
    """XLA takes a tiled all_to_all apart before the pass (a slice per device, a tuple
    all-to-all, a concatenate of its results); the pass puts back one all-to-all on the
    array itself, so the compiled program copies nothing around the call."""
    x = blocks_of("float32", rows=N * 2, cols=N * 3)
    exchange = smap(lambda a: jax.lax.all_to_all(a, "i", axis, axis, tiled=True))
    compiled = exchange.lower(put(x)).compile().as_text()
    calls = [line for line in compiled.splitlines() if "jaxmpi_hlo_all_to_all" in line]
    assert len(calls) == 1, compiled
    assert "outer = dense<[" in calls[0], compiled  # the array form, not the tuple form
    for copying in (" concatenate(", " slice(", "calls=%wrapped_slice"):
        assert copying not in compiled, compiled
    chunks = [np.split(b, N, axis=axis) for b in per_block(x)]  # chunks[source][target]
    expected = [np.concatenate([chunks[s][t] for s in range(N)], axis=axis) for t in range(N)]
    check(exchange(put(x)), np.concatenate(expected, axis=0), f"tiled all_to_all {axis}")


def test_a_tiled_all_to_all_of_a_loop_state_or_a_donated_argument():
    """Where XLA must put the result in the array's own memory (the loop state element it
    gives back, a donated argument), the call reads a copy: MPI refuses one buffer for both
    (before the copy: "Buffers must not be aliased")."""
    x = blocks_of("float32", rows=N * 2, cols=3)

    def swapped(v: np.ndarray) -> np.ndarray:
        chunks = [np.split(b, N, axis=0) for b in per_block(v)]
        return np.concatenate([np.concatenate([chunks[s][t] for s in range(N)]) for t in range(N)])

    def step(_, a):
        return jax.lax.all_to_all(a, "i", 0, 0, tiled=True) + 1

    looped = smap(lambda a: jax.lax.fori_loop(0, 3, step, a))
    expected = x
    for _ in range(3):
        expected = swapped(expected) + 1
    check(looped(put(x)), expected, "tiled all_to_all in a loop")
    donated = jax.jit(
        shard_map(
            lambda a: jax.lax.all_to_all(a, "i", 0, 0, tiled=True),
            mesh=MESH,
            in_specs=BLOCKS,
            out_specs=BLOCKS,
            check_vma=False,
        ),
        donate_argnums=0,
    )
    check(donated(put(x)), swapped(x), "tiled all_to_all of a donated argument")


@pytest.mark.parametrize(
    "pairs", ["ring", "reversed", "one pair", "self-loop beside a ring", "self-loops and a chain"]
)
def test_ppermute(pairs):
    """Beside the plain permutations, those that are no set of swaps: a device sending to
    itself while others exchange (XLA's permute for a sharded reshape or `rev`), and a
    chain that starts and ends nowhere."""
    perm = {
        "ring": [(j, (j + 1) % N) for j in range(N)],
        "reversed": [(j, N - 1 - j) for j in range(N)],
        "one pair": [(0, N - 1)],
        "self-loop beside a ring": [(0, 0)]
        + [(1 + j, 1 + (j + 1) % (N - 1)) for j in range(N - 1)],
        "self-loops and a chain": [(0, 0), (N - 1, N - 1)] + [(j, j + 1) for j in range(1, N - 2)],
    }[pairs]
    x = blocks_of("complex64")
    got = smap(lambda a: jax.lax.ppermute(a, "i", perm))(put(x))
    blocks = per_block(x)
    expected = np.zeros_like(blocks)
    for source, target in perm:
        expected[target] = blocks[source]
    check(got, np.concatenate(expected), f"ppermute {pairs}")


def test_a_reshape_of_a_sharded_array_gspmd_permutes():
    """(N, 2) split by rows, reshaped to (2, N) split by columns: GSPMD moves the pieces
    with an all-to-all and a collective-permute in which some devices keep their own piece
    (at 4 x 1: pairs {0,0},{2,1},{1,2},{3,3}), which hung while those made no communicator."""
    x = np.arange(N * 2, dtype=np.float32).reshape(N, 2)
    columns = NamedSharding(MESH, P(None, "i"))
    reshaped = jax.jit(lambda v: v.reshape(2, N), out_shardings=columns)
    check(reshaped(put(x)), x.reshape(2, N), "reshape")


def test_ragged_all_to_all():
    """Device s sends s + t + 1 rows to device t (its rows after the first ones it sent),
    placed at the rows it names in t's output; XLA:CPU itself cannot run this at all.
    Inputs and outputs have room for the most any device sends or receives (N(N-1)/2 +
    N^2 rows, at device N-1), and two rows more."""
    rows = N * (N - 1) // 2 + N * N + 2
    sizes = np.array([[s + t + 1 for t in range(N)] for s in range(N)])
    send_offsets = np.cumsum(np.concatenate([np.zeros((N, 1), int), sizes[:, :-1]], 1), 1)
    # Receiver t takes sender s's rows at the sum of what senders before s send it.
    out_offsets = np.cumsum(np.concatenate([np.zeros((1, N), int), sizes[:-1]], 0), 0)
    x = np.arange(N * rows * 2, dtype=np.float32).reshape(N * rows, 2)
    out = np.full((N * rows, 2), -1.0, np.float32)

    def body(a, o, so, ss, oo, rs):
        return jax.lax.ragged_all_to_all(a, o, so[0], ss[0], oo[0], rs[0], axis_name="i")

    def table(values):  # per device: its own row of `values`
        return put(np.asarray(values, np.int32).reshape(N, N))

    got = smap(body, (P("i"),) * 6)(
        put(x), put(out), table(send_offsets), table(sizes), table(out_offsets), table(sizes.T)
    )
    expected = per_block(out).copy()
    blocks = per_block(x)
    for s in range(N):
        for t in range(N):
            rows_sent = blocks[s][send_offsets[s, t] : send_offsets[s, t] + sizes[s, t]]
            expected[t][out_offsets[s, t] : out_offsets[s, t] + sizes[s, t]] = rows_sent
    check(got, np.concatenate(expected), "ragged_all_to_all")


def mesh_2d() -> Mesh:
    """Processes on one axis, each process's devices on the other (4 x 1: 2 x 2 of
    processes)."""
    if LOCAL > 1:
        return Mesh(np.array(DEVICES).reshape(PROCESSES, LOCAL), ("proc", "local"))
    if N % 2:
        pytest.skip(f"no 2-D mesh of {N} devices")
    return Mesh(np.array(DEVICES).reshape(2, N // 2), ("proc", "local"))


@pytest.mark.parametrize("axes", [("proc",), ("local",), ("proc", "local")])
def test_psum_over_each_axis_of_a_2d_mesh(axes):
    mesh = mesh_2d()
    rows, cols = mesh.devices.shape
    x = blocks_of("float32")
    spec = P(("proc", "local"))
    got = smap(lambda a: jax.lax.psum(a, axes), spec, spec, mesh)(put(x, spec, mesh))
    blocks = per_block(x).reshape(rows, cols, 2, 3)
    over = tuple(("proc", "local").index(a) for a in axes)
    total = np.broadcast_to(blocks.sum(over, keepdims=True), blocks.shape)
    check(got, total.reshape(N * 2, 3), f"psum over {axes}")


def test_all_gather_and_ppermute_along_one_axis_of_a_2d_mesh():
    mesh = mesh_2d()
    rows, cols = mesh.devices.shape
    x = blocks_of("int16")
    spec = P(("proc", "local"))

    def body(a):
        gathered = jax.lax.all_gather(a, "local", tiled=True)
        moved = jax.lax.ppermute(a, "proc", [(p, (p + 1) % rows) for p in range(rows)])
        inside = jax.lax.ppermute(a, "local", [(c, (c + 1) % cols) for c in range(cols)])
        return gathered, moved, inside

    gathered, moved, inside = smap(body, spec, (spec,) * 3, mesh)(put(x, spec, mesh))
    blocks = per_block(x).reshape(rows, cols, 2, 3)
    want_gathered = np.concatenate(
        [np.concatenate(list(blocks[r]), 0)[None].repeat(cols, 0) for r in range(rows)]
    )
    check(gathered, want_gathered.reshape(N * 2 * cols, 3), "all_gather over local")
    check(moved, np.roll(blocks, 1, axis=0).reshape(N * 2, 3), "ppermute over proc")
    check(inside, np.roll(blocks, 1, axis=1).reshape(N * 2, 3), "ppermute over local")


def test_a_mesh_over_some_processes_only():
    """The processes outside the mesh do not run the program at all: its communicators
    are made by its members alone."""
    if PROCESSES < 3:
        pytest.skip("needs 3 or more processes")
    members = [d for d in DEVICES if d.process_index < 2]
    mesh = Mesh(np.array(members), ("i",))
    x = blocks_of("float32", devices=len(members))
    if RANK < 2:
        got = smap(lambda a: jax.lax.psum(a, "i"), mesh=mesh)(put(x, mesh=mesh))
        expected = np.tile(per_block(x, len(members)).sum(0), (len(members), 1))
        check(got, expected, "psum over processes 0 and 1")


def test_pmap_s_collectives_over_replicas():
    """pmap runs every device as a replica: its collectives name replica ids (XLA's
    cross-replica form, no channel)."""
    x = np.arange(LOCAL, dtype=np.float32) + RANK * LOCAL
    total = jax.pmap(lambda v: jax.lax.psum(v, "r"), axis_name="r")(x)
    gathered = jax.pmap(lambda v: jax.lax.all_gather(v, "r"), axis_name="r")(x)
    assert_array(np.asarray(total), np.full(LOCAL, N * (N - 1) / 2, np.float32), "pmap psum")
    everyone = np.arange(N, dtype=np.float32)
    assert_array(np.asarray(gathered), np.stack([everyone] * LOCAL), "pmap all_gather")


def test_a_matmul_whose_contraction_is_split():
    """GSPMD inserts the all-reduce (its replica groups in the mesh-axes form)."""
    a = np.arange(8 * 4 * N, dtype=np.float32).reshape(8, 4 * N) % 7
    b = np.arange(4 * N * 6, dtype=np.float32).reshape(4 * N, 6) % 5
    replicated = NamedSharding(MESH, P())
    got = jax.jit(lambda u, v: u @ v, out_shardings=replicated)(
        put(a, P(None, "i")), put(b, P("i", None))
    )
    check_close(got, a @ b, "matmul")


def test_a_data_parallel_training_step_written_with_shardings_only():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 2)).astype(np.float32)
    xs = rng.normal(size=(4 * N, 3)).astype(np.float32)
    ys = rng.normal(size=(4 * N, 2)).astype(np.float32)

    def loss(w, x, y):
        return jnp.mean((x @ w - y) ** 2)

    step = jax.jit(
        lambda w, x, y: w - 0.1 * jax.grad(loss)(w, x, y),
        out_shardings=NamedSharding(MESH, P()),
    )
    got = step(put(w, P()), put(xs), put(ys))
    gradient = 2.0 / ys.size * xs.T @ (xs @ w - ys)
    check_close(got, w - 0.1 * gradient, "trained weights")


def test_collectives_in_loops_and_branches():
    x = blocks_of("float64")

    def body(a):
        looped = jax.lax.fori_loop(0, 5, lambda k, c: jax.lax.psum(c, "i") / N + c * 0, a)
        branched = jax.lax.cond(
            jnp.sum(a) > -1, lambda b: jax.lax.pmax(b, "i") + 0 * b, lambda b: b * 2, a
        )
        counted = jax.lax.while_loop(
            lambda c: jax.lax.psum(c[1], "i") < 3 * N, lambda c: (c[0] + 1, c[1] + 1), (a, 0)
        )[0]
        return looped, branched, counted

    looped, branched, counted = smap(body, P("i"), (P("i"),) * 3)(put(x))
    blocks = per_block(x)
    # To rounding: XLA may divide by N as a product by 1 / N, inexact where N is odd.
    check_close(looped, np.tile(blocks.mean(0), (N, 1)), "psum in fori_loop")
    check(branched, np.tile(blocks.max(0), (N, 1)), "pmax in cond")
    check(counted, x + 3, "psum in a while condition")


def test_a_loop_state_summed_in_place_and_read_again():
    """The psum works in the loop's own memory where nothing else reads that state; where
    the state is read again after the psum, that read sees the state from before it."""
    x = blocks_of("float64")

    def body(a):
        alone = jax.lax.fori_loop(0, 3, lambda k, c: jax.lax.psum(c, "i"), a)
        twice = jax.lax.fori_loop(0, 3, lambda k, c: jax.lax.psum(c, "i") - c, a)
        return alone, twice

    alone, twice = smap(body, P("i"), (P("i"),) * 2)(put(x))
    blocks = per_block(x)
    want_alone, want_twice = blocks.copy(), blocks.copy()
    for _ in range(3):
        want_alone = np.broadcast_to(want_alone.sum(0), blocks.shape).copy()
        want_twice = want_twice.sum(0) - want_twice
    check(alone, np.concatenate(want_alone), "psum of the whole state, three times")
    check(twice, np.concatenate(want_twice), "psum minus the state, three times")


def test_many_collectives_of_every_kind_with_ranks_delayed_differently():
    """70 collectives whose calls XLA:CPU would run concurrently; a host callback delays
    each rank by a different time between them."""
    x = blocks_of("float32")

    def delay(v):
        time.sleep(0.002 * (RANK % 3))
        return v

    def body(a):
        outs = []
        for k in range(70):
            v = a * (k + 1)
            if k % 10 == 5:
                v = jax.pure_callback(delay, jax.ShapeDtypeStruct(v.shape, v.dtype), v)
            kind = k % 4
            if kind == 0:
                outs.append(jax.lax.psum(v, "i"))
            elif kind == 1:
                outs.append(jax.lax.all_gather(v, "i", tiled=True)[: v.shape[0]])
            elif kind == 2:
                outs.append(jax.lax.ppermute(v, "i", [(j, (j + 1) % N) for j in range(N)]))
            else:
                outs.append(jax.lax.pmax(v, "i"))
        return sum(outs)

    got = smap(body)(put(x))
    blocks = per_block(x)
    expected = np.zeros_like(blocks)
    for k in range(70):
        v = blocks * (k + 1)
        kind = k % 4
        if kind == 0:
            expected += v.sum(0)
        elif kind == 1:
            expected += v[0]
        elif kind == 2:
            expected += np.roll(v, 1, axis=0)
        else:
            expected += v.max(0)
    check(got, np.concatenate(expected), "70 collectives")
    assert hlo_pass.rewritten["collectives"] >= 70


def test_types_xla_widens_first_are_summed_too():
    """float8 and int4 reach the pass widened (to float32 and int8): their sums are exact."""
    x = put(blocks_of("float32") % 4)
    got = smap(
        lambda a: (
            jax.lax.psum(a.astype(jnp.float8_e4m3fn), "i").astype(jnp.float32),
            jax.lax.psum(a.astype(jnp.int4), "i").astype(jnp.float32),
        ),
        out_specs=(P("i"), P("i")),
    )(x)
    total = np.tile(per_block(blocks_of("float32") % 4).sum(0), (N, 1))
    check(got[0], total, "psum float8")
    check(got[1], ((total + 8) % 16 - 8).astype(np.float32), "psum int4 (wraps)")
