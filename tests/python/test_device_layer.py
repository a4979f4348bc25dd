"""The device-rank layer (core/src/xla/mesh/) where issue 50 found it wanting, through
JAX's own collectives (jaxmpi's pass): a ragged all-to-all whose sizes fail on one device
only, permutes that mix self-loops and pairs (at 3 x 1 too), many groups over a mesh of
scrambled devices made at once, collectives in branches that each device takes on its own,
and a MeshComm beside psum; scans along ranks that alternate between processes. Expected
values are numpy's, from the global input.

A hang must fail, not stall the cell: each program here runs under `within` (helpers.py),
which ends the process, naming the test, when it takes longer than a minute.

Runs in the layouts' cells (layouts.py starts jax.distributed in the cell's layout).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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
    check_ppermute,
    per_block,
    put,
    smap,
)

import jaxmpi
from helpers import RANK, within

# --- 1. A ragged all-to-all whose sizes fail on one device only ------------------------


def ragged_tables():
    """Device s sends s + t + 1 rows to device t, as test_jax_collectives' ragged test;
    every input and output has room for the most any device sends or receives."""
    rows = N * (N - 1) // 2 + N * N + 2
    sizes = np.array([[s + t + 1 for t in range(N)] for s in range(N)])
    send_offsets = np.cumsum(np.concatenate([np.zeros((N, 1), int), sizes[:, :-1]], 1), 1)
    out_offsets = np.cumsum(np.concatenate([np.zeros((1, N), int), sizes[:-1]], 0), 0)
    return rows, sizes, send_offsets, out_offsets


def ragged(x, out, send_offsets, sizes, out_offsets):
    def body(a, o, so, ss, oo, rs):
        return jax.lax.ragged_all_to_all(a, o, so[0], ss[0], oo[0], rs[0], axis_name="i")

    def table(values):
        return put(np.asarray(values, np.int32).reshape(N, N))

    program = smap(body, (P("i"),) * 6)
    return program(
        put(x), put(out), table(send_offsets), table(sizes), table(out_offsets), table(sizes.T)
    )


@pytest.mark.parametrize("fault", ["output_offsets", "send_sizes"])
def test_ragged_sizes_that_fail_on_one_device_end_every_call(fault):
    """Device 0 alone names rows that do not fit (its output offsets past the receiver's
    output, or more rows than its input holds): its call fails naming that, every other
    device's call fails naming device 0, nobody waits; then the layer works on."""
    if N < 2:
        pytest.skip("needs 2 devices")
    rows, sizes, send_offsets, out_offsets = ragged_tables()
    x = np.arange(N * rows * 2, dtype=np.float32).reshape(N * rows, 2)
    out = np.full((N * rows, 2), -1.0, np.float32)
    bad_sizes, bad_out = sizes.copy(), out_offsets.copy()
    if fault == "output_offsets":
        bad_out[0, N - 1] = rows - 1  # device 0's rows to the last device: past its end
        own = "outside its output's"
    else:
        bad_sizes[0, N - 1] = rows  # device 0 sends more rows than its input holds
        own = "outside the input's"
    with within(f"ragged_all_to_all, bad {fault} on device 0"):
        try:
            jax.block_until_ready(ragged(x, out, send_offsets, bad_sizes, bad_out))
            message = None
        except Exception as err:  # JAX wraps it in its own type
            message = str(err)
        # The layer goes on: the same program with good tables, then a psum.
        good = ragged(x, out, send_offsets, sizes, out_offsets)
        total = smap(lambda a: jax.lax.psum(a, "i"))(put(blocks_of()))
        jax.block_until_ready((good, total))
    assert message is not None, "the call with bad sizes returned"
    others = f"member 0 of the group (device {DEVICES[0].id}) gave sizes or offsets"
    if RANK == DEVICES[0].process_index:
        assert own in message and "sent to member" in message, message
    else:
        assert others in message, message
    expected = per_block(out).copy()
    xs = per_block(x)
    for s in range(N):
        for t in range(N):
            sent = xs[s][send_offsets[s, t] : send_offsets[s, t] + sizes[s, t]]
            expected[t][out_offsets[s, t] : out_offsets[s, t] + sizes[s, t]] = sent
    check(good, np.concatenate(expected), "ragged_all_to_all after the failed one")
    check(total, np.tile(per_block(blocks_of()).sum(0), (N, 1)), "psum after the failed one")


# --- 2. Permutes that mix self-loops and pairs ----------------------------------------


def test_flip_along_a_sharded_axis():
    """GSPMD reverses the blocks with a collective-permute; with N odd the middle device
    sends to itself while the others swap (3 x 1: {0,2},{1,1},{2,0})."""
    x = np.arange(N * 4, dtype=np.float32).reshape(N * 2, 2)
    with within("jnp.flip"):
        got = jax.jit(lambda v: jnp.flip(v, 0), out_shardings=NamedSharding(MESH, BLOCKS))(put(x))
        jax.block_until_ready(got)
    check(got, np.flip(x, 0), "flip")


def self_loop_and_reversal(n: int = N) -> list[tuple[int, int]]:
    """Device 0 to itself, the others reversed: at 3 devices {(0,0),(2,1),(1,2)}."""
    return [(0, 0)] + [(j, n - j) for j in range(1, n)]


@pytest.mark.parametrize(
    "pairs", ["self-loop and reversal", "incomplete", "self-loop and one pair"]
)
def test_ppermute_mixing_self_loops_and_pairs(pairs):
    perm = {
        "self-loop and reversal": self_loop_and_reversal(),
        "incomplete": [(0, N - 1)] + [(j, j) for j in range(1, N - 1)],
        "self-loop and one pair": [(N - 1, N - 1), (0, N // 2)] if N > 2 else [(1, 1), (0, 0)],
    }[pairs]
    check_ppermute(blocks_of(np.float64), perm)


def test_ppermute_with_a_self_loop_in_a_while_loop():
    """Five steps of the same permute (a self-loop beside a reversal) in a while loop, and
    a permute in the loop's condition's sum."""
    perm = self_loop_and_reversal()
    x = blocks_of(np.float32)

    def body(a):
        def step(carry):
            k, v = carry
            return k + 1, jax.lax.ppermute(v, "i", perm) + 1

        return jax.lax.while_loop(lambda c: c[0] < 5, step, (0, a))[1]

    with within("ppermute in a while loop"):
        got = jax.block_until_ready(smap(body)(put(x)))
    xs = per_block(x)
    for _ in range(5):
        moved = np.zeros_like(xs)
        for source, target in perm:
            moved[target] = xs[source]
        xs = moved + 1
    check(got, np.concatenate(xs), "ppermute in a while loop")


@pytest.mark.parametrize("moves", ["all_to_all", "ppermute"])
def test_a_collective_whose_operand_and_result_share_a_loop_state(moves):
    """A psum, then an all_to_all or a ring ppermute, in a loop body: XLA, which inserted
    its copies before the pass, gives the psum's result (taken in place, in the loop's
    state) and the next collective's result the same memory. MPI refuses one buffer as
    both sides of MPI_Alltoall (the differential tester's soak found it): the operand is
    copied aside first."""
    ring = [(j, (j + 1) % N) for j in range(N)]

    def body(a):
        def step(_, v):
            total = jax.lax.psum(v, "i")
            if moves == "all_to_all":
                return jax.lax.all_to_all(total, "i", 0, 0, tiled=True)
            return jax.lax.ppermute(total, "i", ring)

        return jax.lax.fori_loop(0, 2, step, a)

    x = np.arange(N * N * 2, dtype=np.float32).reshape(N * N, 2) % 7
    with within(f"psum, then {moves}, in a loop"):
        got = jax.block_until_ready(smap(body)(put(x)))
    xs = per_block(x)  # [device, N rows, 2]
    for _ in range(2):
        total = np.broadcast_to(xs.sum(0), xs.shape)
        if moves == "all_to_all":  # row block j of device i to device j, as block i
            xs = total.reshape(N, N, 1, 2).transpose(1, 0, 2, 3).reshape(xs.shape)
        else:
            xs = np.roll(total, 1, axis=0)
    check(got, np.concatenate(xs), f"psum, then {moves}, in a loop")


# --- 3. Many groups over a mesh of scrambled devices, made at once --------------------


@pytest.mark.parametrize("shape", ["rows", "columns"])
def test_psum_over_each_axis_of_a_scrambled_mesh(shape):
    """A 2-D mesh of every device in a random order (rows span processes), a psum along
    each axis: each axis's groups are made at once, each device's thread making its own,
    over the same processes (two rows given one MPI_Comm_create_group tag hung). Twenty
    calls of each of four orders, each a fresh compile."""
    if N < 4 or N % 2 or PROCESSES < 2:
        pytest.skip(
            f"needs an even number of devices, 4 or more, over 2 or more processes "
            f"({PROCESSES} x {LOCAL})"
        )
    dims = (2, N // 2) if shape == "rows" else (N // 2, 2)
    x = blocks_of()
    spec = P(("a", "b"))
    rng = np.random.default_rng(50)
    for _ in range(4):
        index = rng.permutation(N)
        mesh = Mesh(np.array(DEVICES)[index].reshape(dims), ("a", "b"))
        program = smap(
            lambda v: (jax.lax.psum(v, "a"), jax.lax.psum(v, "b")), spec, (spec, spec), mesh
        )
        with within(f"psums over a mesh of devices {index.tolist()}"):
            outs = [program(put(x * (k + 1), spec, mesh)) for k in range(20)]
            jax.block_until_ready(outs)
        # Block (r, c) of the mesh holds the global array's block r * cols + c.
        xs = per_block(x).reshape(*dims, 2, 3)
        over_a = np.broadcast_to(xs.sum(0, keepdims=True), xs.shape).reshape(N * 2, 3)
        over_b = np.broadcast_to(xs.sum(1, keepdims=True), xs.shape).reshape(N * 2, 3)
        for k, (a, b) in enumerate(outs):
            check(a, over_a * (k + 1), f"psum over a, order {index.tolist()}, call {k}")
            check(b, over_b * (k + 1), f"psum over b, order {index.tolist()}, call {k}")


# --- 4. Branches each device takes on its own, holding collectives --------------------


def test_branches_taken_per_device_each_holding_a_psum():
    """The predicate is the device's index on the mesh's local axis: the devices of one
    local index take one branch, and each branch's psum over the process axis joins exactly
    the devices that take it."""
    if LOCAL > 1:
        mesh = Mesh(np.array(DEVICES).reshape(PROCESSES, LOCAL), ("proc", "local"))
    elif N % 2 == 0:
        mesh = Mesh(np.array(DEVICES).reshape(2, N // 2), ("proc", "local"))
    else:
        pytest.skip(f"no 2-D mesh of {N} devices")
    rows, cols = mesh.devices.shape
    if cols < 2:
        pytest.skip("needs 2 or more devices on the local axis")
    spec = P(("proc", "local"))
    x = blocks_of()

    def body(a):
        first = jax.lax.axis_index("local") == 0
        return jax.lax.cond(
            first,
            lambda v: jax.lax.psum(v, "proc") + 1,
            lambda v: jax.lax.psum(v * 2, "proc"),
            a,
        )

    program = smap(body, spec, spec, mesh)
    with within("psums in branches taken per device"):
        compiled = program.lower(put(x, spec, mesh)).compile().as_text()
        got = jax.block_until_ready(program(put(x, spec, mesh)))
    # Each branch holds its own rewritten psum (not a select of both run by every device).
    assert " conditional(" in compiled, compiled
    assert compiled.count('custom_call_target="jaxmpi_hlo_all_reduce"') == 2, compiled
    xs = per_block(x).reshape(rows, cols, 2, 3)
    summed = np.broadcast_to(xs.sum(0, keepdims=True), xs.shape).copy()
    summed[:, 0] += 1
    summed[:, 1:] *= 2
    check(got, summed.reshape(N * 2, 3), "psum in per-device branches")


# --- 5. A MeshComm allreduce beside psum in one loop ----------------------------------


def test_mesh_comm_allreduce_beside_psum_in_a_loop():
    """100 steps of a loop whose body holds jaxmpi's allreduce on a MeshComm and JAX's
    psum (under gloo too: tests/mesh_comm_jobs.sh's beside_psum)."""
    comm = jaxmpi.MeshComm(MESH)
    x = blocks_of(np.float64)

    def body(a):
        def step(k, v):
            return jaxmpi.allreduce(v, jaxmpi.SUM, comm=comm) / N + jax.lax.psum(v, "i") / N - v

        return jax.lax.fori_loop(0, 100, step, a)

    with within("MeshComm allreduce beside psum, 100 steps"):
        got = jax.block_until_ready(smap(body)(put(x)))
    xs = per_block(x)
    for _ in range(100):
        xs = 2 * np.broadcast_to(xs.mean(0), xs.shape) - xs
    np.testing.assert_allclose(
        np.asarray(got.addressable_shards[0].data),
        np.concatenate(xs)[got.addressable_shards[0].index],
        rtol=1e-9,
        atol=1e-9,
    )


def test_checked_mode_compares_the_calls_of_the_pass(checked):
    """Checked mode covers JAX's collectives through the pass: processes whose psums
    differ (in dtype, here) all fail before any data moves, each naming every call."""
    if PROCESSES == 1:
        pytest.skip("one process compiles one program: its devices' calls cannot differ")
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    with within("a psum in checked mode"):
        got = smap(lambda b: jax.lax.psum(b, "i"))(put(x))
        check(got, np.broadcast_to(x.sum(0), x.shape), "psum, checked")
    dtype = np.float32 if jax.process_index() == 0 else np.int32
    differ = smap(lambda b: jax.lax.psum(b.astype(dtype), "i").astype(np.float32))
    with within("psums whose dtype differs between processes"):
        with pytest.raises(Exception, match="do not make the same call") as info:
            jax.block_until_ready(differ(put(x)))
    assert "hlo_all_reduce float32[3] SUM" in str(info.value), info.value
    assert "hlo_all_reduce int32[3] SUM" in str(info.value), info.value


# --- 6. Scans on a MeshComm whose ranks alternate between processes ------------------


def test_scans_along_ranks_that_alternate_between_processes():
    """Ranks ordered local index first (2 x 2: process 0, 1, 0, 1): the chain of a scan
    changes process at every rank, and each process holds several runs of it. The prefix
    is `(x0 + x1) + x2 ...` bit for bit, except with one device per process in the fast
    mode, where it is MPI_Scan's."""
    order = np.array(DEVICES).reshape(PROCESSES, LOCAL).T.reshape(-1)
    mesh = Mesh(order, ("i",))
    comm = jaxmpi.MeshComm(mesh)
    x = (np.random.default_rng(6).standard_normal((N, 5)) * 1e3).astype(np.float32)
    prefixes = [x[0]]
    for row in x[1:]:
        prefixes.append(prefixes[-1] + row)
    scanned = np.stack(prefixes)
    exscanned = np.concatenate([np.zeros_like(x[:1]), scanned[:-1]])
    exact = LOCAL > 1 or os.environ.get("JAXMPI_MESH_REDUCTIONS") == "ordered"
    compare = check if exact else check_close
    for k in range(3):  # the chain's messages match call after call
        with within(f"scans over devices {[d.id for d in order]}, call {k}"):
            got = smap(lambda b: jaxmpi.scan(b, jaxmpi.SUM, comm=comm), mesh=mesh)(
                put(x, mesh=mesh)
            )
            got_ex = smap(lambda b: jaxmpi.exscan(b, jaxmpi.SUM, comm=comm), mesh=mesh)(
                put(x, mesh=mesh)
            )
        compare(got, scanned, f"scan, call {k}")
        compare(got_ex, exscanned, f"exscan, call {k}")


# --- 7. Communicators: one per set of devices, one per set of a permute's processes ---


def test_communicators_are_shared_by_every_order_of_a_set_and_every_permute():
    """A psum over every device in process order, then over the same devices reversed and
    scrambled (each a mesh of its own): one communicator among the processes serves
    them all. Permutes of four patterns (rings both ways, a reversal, a random
    permutation): their messages share one communicator per set of processes their
    connected devices span, however many patterns run (a pattern's connected devices
    are any subset of the devices; a communicator each would run MPICH out of context
    ids)."""
    x = blocks_of()
    rng = np.random.default_rng(7)
    orders = [list(range(N)), list(range(N))[::-1], rng.permutation(N).tolist()]
    held = []
    for order in orders:
        mesh = Mesh(np.array(DEVICES)[order], ("i",))
        with within(f"psum over devices in the order {order}"):
            got = smap(lambda v: jax.lax.psum(v, "i"), mesh=mesh)(put(x, mesh=mesh))
        check(got, np.tile(per_block(x).sum(0), (N, 1)), f"psum, order {order}")
        held.append(jaxmpi._native.device_communicators())
    assert held == [held[0]] * len(held), f"communicators held after each order: {held}"
    random = rng.permutation(N).tolist()
    patterns = [
        [(i, (i + 1) % N) for i in range(N)],
        [(i, (i - 1) % N) for i in range(N)],
        [(i, N - 1 - i) for i in range(N)],
        [(i, random[i]) for i in range(N)],
    ]
    owner = [d.process_index for d in DEVICES]
    spans: set[frozenset] = set()
    before = held[-1]
    for pattern in patterns:
        check_ppermute(x, pattern)
        # The processes of each connected part (a ring's: every process).
        parts = {i: {i} for i in range(N)}
        for s, t in pattern:
            joined = parts[s] | parts[t]
            for d in joined:
                parts[d] = joined
        spans |= {frozenset(owner[d] for d in p) for p in parts.values() if len(p) > 1}
        now = jaxmpi._native.device_communicators()
        spanning = sum(len(s) > 1 for s in spans)
        assert now - before <= spanning, (
            f"after ppermute {pattern}: {now - before} communicators made by the permutes, "
            f"their connected devices span {spanning} sets of processes"
        )
    # Again, and over the same devices in new orders: nothing new.
    made = jaxmpi._native.device_communicators()
    for pattern in patterns:
        check_ppermute(x, pattern)
    for order in (rng.permutation(N).tolist(), rng.permutation(N).tolist()):
        mesh = Mesh(np.array(DEVICES)[order], ("i",))
        got = smap(lambda v: jax.lax.psum(v, "i"), mesh=mesh)(put(x, mesh=mesh))
        check(got, np.tile(per_block(x).sum(0), (N, 1)), f"psum, order {order}")
    assert jaxmpi._native.device_communicators() == made
