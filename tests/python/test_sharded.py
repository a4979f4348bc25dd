"""jaxmpi inside JAX's sharded programs: jax.distributed started by
`jaxmpi.distributed.initialize`, a mesh over every process's one device, ops inside
`shard_map` next to JAX's own collectives (over MPI too: the default).

Runs in a pytest cell of its own (JAXMPI_TEST_SHARDED=1; see sharding.py).
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from sharding import MESH, UNCHECKED, shard_map, sharded

import jaxmpi
import jaxmpi.distributed
from helpers import MPI, RANK, SIZE, assert_array, needs_mpi4py, needs_ranks

# For the tests that start their own processes: shard_map wherever this JAX has it, and a
# jitted allreduce inside it over every device (`f`).
_ALLREDUCE_OVER_EVERY_DEVICE = (
    "try:\n"
    "    from jax import shard_map; kw = {'check_vma': False}\n"
    "except ImportError:\n"
    "    from jax.experimental.shard_map import shard_map; kw = {'check_rep': False}\n"
    "mesh = Mesh(np.array(jax.devices()), ('x',))\n"
    "f = jax.jit(shard_map(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM), mesh=mesh,\n"
    "                      in_specs=P('x'), out_specs=P('x'), **kw))\n"
)

pytestmark = needs_ranks(2)


def rows(rank, n=3):
    return np.arange(n, dtype=np.float64) + 10.0 * rank


ALL = [rows(r) for r in range(SIZE)]
TABLE = np.stack([rows(r) for r in range(SIZE)])  # (SIZE, 3): row r is rank r's

# op: (body on this rank's block, this rank's input, the expected result)
CASES = {
    "allreduce": (lambda x: jaxmpi.allreduce(x, jaxmpi.SUM), rows(RANK), sum(ALL)),
    "reduce": (
        lambda x: jaxmpi.reduce(x, jaxmpi.MAX, 0),
        rows(RANK),
        ALL[-1] if RANK == 0 else rows(RANK),
    ),
    "scan": (lambda x: jaxmpi.scan(x, jaxmpi.SUM), rows(RANK), sum(ALL[: RANK + 1])),
    "exscan": (
        lambda x: jaxmpi.exscan(x, jaxmpi.SUM),
        rows(RANK),
        sum(ALL[:RANK]) if RANK else np.zeros(3),
    ),
    "reduce_scatter": (
        lambda x: jaxmpi.reduce_scatter(x, jaxmpi.SUM),
        TABLE + RANK,
        SIZE * TABLE[RANK] + sum(range(SIZE)),
    ),
    "bcast": (lambda x: jaxmpi.bcast(x, 1), rows(RANK), rows(1)),
    # Inside shard_map the rooted ops bind the root's result on every rank (one program
    # for every rank): zeros away from gather's root, scatter's operand the root's shape.
    "gather": (
        lambda x: jaxmpi.gather(x, 0),
        rows(RANK),
        TABLE if RANK == 0 else np.zeros((SIZE, 3)),
    ),
    "allgather": (jaxmpi.allgather, rows(RANK), TABLE),
    "scatter": (lambda x: jaxmpi.scatter(x, 0), TABLE, TABLE[RANK]),
    "alltoall": (jaxmpi.alltoall, TABLE + 100 * RANK, TABLE[RANK] + 100 * np.arange(SIZE)[:, None]),
    "allgatherv": (
        lambda x: jaxmpi.allgatherv(x[: RANK + 1], list(range(1, SIZE + 1))),
        TABLE + RANK,
        np.concatenate([(TABLE + r)[: r + 1] for r in range(SIZE)]),
    ),
    "gatherv": (
        lambda x: jnp.broadcast_to(jaxmpi.gatherv(x[:1], [1] * SIZE, 0), (SIZE, 3)),
        TABLE[RANK : RANK + 1].repeat(SIZE, 0),
        TABLE if RANK == 0 else np.broadcast_to(TABLE[RANK], (SIZE, 3)),
    ),
    "scatterv": (
        lambda x: jaxmpi.scatterv(x if RANK == 0 else x[:1], [1] * SIZE, 0),
        TABLE,
        TABLE[RANK : RANK + 1],
    ),
    "alltoallv": (
        lambda x: jaxmpi.alltoallv(x, [1] * SIZE, [1] * SIZE),
        TABLE + 100 * RANK,
        TABLE[RANK] + 100 * np.arange(SIZE)[:, None],
    ),
    "sendrecv": (
        lambda x: jaxmpi.sendrecv(x, x, source=(RANK - 1) % SIZE, dest=(RANK + 1) % SIZE),
        rows(RANK),
        rows((RANK - 1) % SIZE),
    ),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_op_insideshard_map(op):
    body, local, expected = CASES[op]
    assert_array(sharded(body, local), np.asarray(expected, np.float64), op)


def test_send_and_recv_in_rank_asymmetric_order():
    """Rank 0 sends then receives, rank 1 receives then sends: each body is its own
    process's program, traced with its own rank."""
    partner = RANK ^ 1

    def body(x):
        if RANK % 2 == 0:
            jaxmpi.send(x, partner, tag=1)
            return jaxmpi.recv(x, partner, tag=2)
        got = jaxmpi.recv(x, partner, tag=1)
        jaxmpi.send(x, partner, tag=2)
        return got

    got = sharded(body, rows(RANK)) if partner < SIZE else rows(RANK)
    assert_array(got, rows(partner) if partner < SIZE else rows(RANK))


def test_mixed_with_jax_collectives_in_one_body():
    def body(x):
        total = jaxmpi.allreduce(x, jaxmpi.SUM)
        gathered = jax.lax.all_gather(x, "x")
        shifted = jax.lax.ppermute(x, "x", [(r, (r + 1) % SIZE) for r in range(SIZE)])
        halo = jaxmpi.sendrecv(x, x, source=(RANK + 1) % SIZE, dest=(RANK - 1) % SIZE)
        return total - jax.lax.psum(x, "x"), gathered, shifted, halo

    zero, gathered, shifted, halo = sharded(body, rows(RANK))
    assert_array(zero, np.zeros(3))
    assert_array(gathered, TABLE)
    assert_array(shifted, rows((RANK - 1) % SIZE))
    assert_array(halo, rows((RANK + 1) % SIZE))


def test_a_loop_carrying_an_op_result_passes_shard_maps_checks():
    """With shard_map's default checks (JAX 0.7+: varying manual axes), a loop carry that
    an op replaces keeps its type."""

    def body(x):
        def step(_, y):
            return jaxmpi.sendrecv(y, y, source=(RANK + 1) % SIZE, dest=(RANK - 1) % SIZE)

        return jax.lax.fori_loop(0, SIZE, step, x)

    program = jax.jit(shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P("x")))
    x = jax.make_array_from_process_local_data(NamedSharding(MESH, P("x")), rows(RANK))
    assert_array(program(x).addressable_data(0), rows(RANK))


def test_many_iterations_of_a_loop_insideshard_map():
    steps = 200

    def body(x):
        def step(_, carry):
            total = jaxmpi.allreduce(carry, jaxmpi.SUM)
            right = jaxmpi.sendrecv(carry, carry, source=(RANK + 1) % SIZE, dest=(RANK - 1) % SIZE)
            return (total - jax.lax.psum(carry, "x")) + right

        return jax.lax.fori_loop(0, steps, step, x)

    # Each step is a rotation to the left: after `steps`, rank r holds rank r+steps's rows.
    assert_array(sharded(body, rows(RANK)), rows((RANK + steps) % SIZE))


def test_successive_programs_keep_their_order():
    """Many short programs back to back, each with an allreduce: no token crosses them."""
    results = [
        sharded(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM), rows(RANK) * k) for k in range(30)
    ]
    for k, got in enumerate(results):
        assert_array(got, sum(ALL) * k, f"program {k}")


def test_grad_through_an_op_insideshard_map():
    def loss(x):
        return jnp.sum(jaxmpi.allreduce(x * x, jaxmpi.SUM))

    grad = sharded(jax.grad(loss), rows(RANK))
    # The transpose of allreduce-SUM is the identity on each rank (the loss is replicated).
    assert_array(grad, 2 * rows(RANK))


def test_vmap_through_an_op_insideshard_map():
    def body(x):
        return jax.vmap(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM))(x)

    assert_array(sharded(body, TABLE + RANK), SIZE * TABLE + sum(range(SIZE)))


def test_counts_computed_inside_the_body_reach_a_ragged_exchange():
    """Run-time counts (issue 26) inside shard_map: each rank sends rank t row t of its
    block, the counts computed in the body, exchanged by an alltoall."""

    def body(x):
        send = (x[:, 0] * 0 + 1).astype(jnp.int32)  # one row to every rank, traced
        recv = jaxmpi.alltoall(send)
        return jaxmpi.alltoallv(x, send, recv, recv_capacity=SIZE + 1)

    mine = np.arange(SIZE * 2, dtype=np.float64).reshape(SIZE, 2) + 100.0 * RANK
    got = sharded(body, mine)
    expected = np.zeros((SIZE + 1, 2))
    for source in range(SIZE):
        expected[source] = np.arange(2) + 2.0 * RANK + 100.0 * source
    assert_array(got, expected)


def test_a_body_that_only_sends_is_kept():
    def body(x):
        if RANK == 0:
            for dest in range(1, SIZE):
                jaxmpi.send(x, dest, tag=5)
            return x
        return jaxmpi.recv(x, 0, tag=5)

    assert_array(sharded(body, rows(RANK)), rows(0))


def test_an_op_on_a_global_array_outside_shard_map_is_refused():
    sharding = NamedSharding(MESH, P("x"))
    x = jax.make_array_from_single_device_arrays(
        (SIZE, 3), sharding, [jax.device_put(rows(RANK)[None], jax.local_devices()[0])]
    )
    with pytest.raises(ValueError, match=r"jaxmpi\.allreduce: .*global array.*shard_map"):
        jax.jit(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM))(x)


def test_a_mesh_axis_left_automatic_is_refused():
    """A 2-D mesh (processes x 1) with the op inside a shard_map manual over the size-1
    axis only: the block the op sees still spans the processes."""
    mesh = Mesh(MESH.devices.reshape(SIZE, 1), ("procs", "one"))
    try:
        program = shard_map(
            lambda v: jaxmpi.allreduce(v, jaxmpi.SUM),
            mesh=mesh,
            in_specs=P(None, "one"),
            out_specs=P(None, "one"),
            axis_names={"one"},
            **UNCHECKED,
        )
    except TypeError:  # JAX 0.6's shard_map names its automatic axes instead
        program = shard_map(
            lambda v: jaxmpi.allreduce(v, jaxmpi.SUM),
            mesh=mesh,
            in_specs=P(None, "one"),
            out_specs=P(None, "one"),
            auto=frozenset({"procs"}),
            **UNCHECKED,
        )
    x = jax.device_put(np.ones((SIZE, 1)), NamedSharding(mesh, P(None, "one")))
    with pytest.raises(ValueError, match=r"jaxmpi\.allreduce: .*shard_map"):
        jax.jit(program)(x)


def _allreduce_over(processes, comm=None):
    """jit(shard_map) of an allreduce on `comm` over a mesh of the devices of `processes`
    (one each), and its operand: a global array every process can make."""
    mesh = Mesh(np.array([d for d in MESH.devices if d.process_index in processes]), ("x",))
    program = shard_map(
        lambda v: jaxmpi.allreduce(v, jaxmpi.SUM, comm=comm),
        mesh=mesh,
        in_specs=P("x"),
        out_specs=P("x"),
        **UNCHECKED,
    )
    table = np.stack([rows(r) for r in sorted(processes)])
    return jax.jit(program), jax.device_put(table, NamedSharding(mesh, P("x")))


def _refusal_when_lowered(processes, comm=None) -> str:
    """What lowering (never running) the allreduce over `processes` raises here, or ''."""
    program, x = _allreduce_over(processes, comm)
    try:
        program.lower(x)
    except ValueError as err:
        return str(err)
    return ""


def test_a_mesh_of_one_process_is_refused_where_it_does_not_run():
    """Rank 0's one device as the mesh: rank 0 cannot tell it from its own program, but
    every other rank knows it never runs it while rank 0's allreduce waits for it."""
    refused = _refusal_when_lowered({0})
    if RANK == 0:
        assert refused == "", refused
    else:
        assert refused.startswith(
            "jaxmpi.allreduce: in a program over the devices of processes [0] only"
        ), refused
        assert f"has all {SIZE} ranks of MPI's world" in refused, refused
        assert f"processes {list(range(1, SIZE))} never run the program" in refused, refused
        assert "Mesh(jax.devices()" in refused and "Split" in refused, refused


@needs_ranks(3)
def test_a_mesh_that_leaves_out_ranks_of_the_world_is_refused_on_every_rank():
    refused = _refusal_when_lowered({0, 1})
    assert "jaxmpi.allreduce: in a program over the devices of processes [0, 1] only" in refused
    assert f"its communicator has all {SIZE} ranks of MPI's world" in refused, refused
    assert f"processes {list(range(2, SIZE))} never run the program" in refused, refused


@needs_ranks(4)
def test_a_communicator_of_the_meshs_processes_runs():
    """A split of ranks {0, 1} and {2, 3} with a mesh over processes 0 and 1: ranks 0 and 1
    run the allreduce between them, ranks 2 and 3 run nothing and wait for nobody."""
    pairs = jaxmpi.COMM_WORLD.Split(RANK // 2)
    program, x = _allreduce_over({0, 1}, pairs)
    got = [np.asarray(shard.data) for shard in program(x).addressable_shards]
    pairs.Free()
    assert len(got) == (1 if RANK < 2 else 0)
    if got:
        assert_array(got[0][0], rows(0) + rows(1))


@needs_ranks(4)
@needs_mpi4py
def test_a_communicator_across_the_mesh_edge_is_refused_through_mpi4py():
    """Ranks {0, 2} and {1, 3} with a mesh over processes 0 and 1: each pair has one rank
    inside and one outside. Their sizes fit the mesh; mpi4py's groups name the members."""
    odd_even = MPI.COMM_WORLD.Split(RANK % 2)
    refused = _refusal_when_lowered({0, 1}, odd_even)
    odd_even.Free()
    assert "its communicator has 2 ranks" in refused, refused
    assert f"(world ranks [{RANK % 2}, {RANK % 2 + 2}]): world ranks [{RANK % 2 + 2}]" in refused


@needs_ranks(4)
def test_without_mpi4py_a_communicator_larger_than_the_mesh_is_refused(monkeypatch):
    """Without mpi4py only a communicator's size is known: on the mesh's processes, one of
    3 ranks over a mesh of 2 processes is refused."""
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", None)  # jaxmpi then looks no further
    three = jaxmpi.COMM_WORLD.Split(0 if RANK < 3 else None)
    refused = _refusal_when_lowered({0, 1}, three) if three is not None else ""
    if three is not None:
        three.Free()
    if RANK < 2:
        assert "its communicator has 3 ranks: at least 1 of them never run" in refused


def test_distributed_initialize_refuses_what_it_sets_itself():
    with pytest.raises(TypeError, match="process_id"):
        jaxmpi.distributed.initialize(process_id=0)


def test_jax_process_index_is_the_mpi_rank():
    assert (jax.process_index(), jax.process_count()) == (RANK, SIZE)


@pytest.mark.same_at_every_size  # processes of its own, started on rank 0
def test_several_local_devices_are_refused_clearly():
    """One process with 2 CPU devices, started alone: a shard_map over both holding an op
    is refused before anything runs, naming the op, the device count and the fix."""
    if RANK != 0:
        pytest.skip("starts its own process; rank 0 does it")
    from test_startup import run_alone

    code = (
        "import jax, jaxmpi, numpy as np\n"
        "from jax.sharding import Mesh, PartitionSpec as P\n"
        + _ALLREDUCE_OVER_EVERY_DEVICE
        + "try:\n"
        "    f(np.ones(2))\n"
        "except ValueError as err:\n"
        "    print('REFUSED', err)\n"
    )
    result = run_alone(code, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = result.stdout + result.stderr
    assert "REFUSED jaxmpi.allreduce" in result.stdout, out
    assert "2 local devices" in result.stdout, out
    assert "one process per device" in result.stdout.lower(), out


def test_readme_example():
    """README.md's "With jax.distributed and shard_map": a halo exchange by sendrecv next
    to a psum of the residual, with shard_map's default checks."""
    mesh = Mesh(jax.devices(), ("x",))

    def relax(u):
        left = jaxmpi.sendrecv(u[-1:], u[:1], source=(RANK - 1) % SIZE, dest=(RANK + 1) % SIZE)
        right = jaxmpi.sendrecv(u[:1], u[-1:], source=(RANK + 1) % SIZE, dest=(RANK - 1) % SIZE)
        new = 0.5 * (jnp.concatenate([left, u[:-1]]) + jnp.concatenate([u[1:], right]))
        return new, jax.lax.psum(jnp.sum((new - u) ** 2), "x")

    relax = jax.jit(shard_map(relax, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())))
    local = np.arange(4.0) + 4 * RANK
    u = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), local)
    new, residual = relax(u)
    domain = np.arange(4.0 * SIZE)
    expected = 0.5 * (np.roll(domain, 1) + np.roll(domain, -1))
    assert_array(new.addressable_data(0), expected[4 * RANK : 4 * RANK + 4])
    assert_array(residual.addressable_data(0), np.sum((expected - domain) ** 2))


@pytest.mark.same_at_every_size  # processes of its own, started on rank 0
def test_a_jax_process_count_that_differs_from_the_mpi_world_is_refused():
    """Two processes that are each an MPI job of one rank (singletons) but one
    jax.distributed job of two: an op in a program over both is refused by name."""
    if RANK != 0:
        pytest.skip("starts its own processes; rank 0 does it")
    import socket
    import subprocess

    from test_startup import _LAUNCHER_PREFIXES

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = (
        "import sys, jax, jaxmpi, numpy as np\n"
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
        f"jax.distributed.initialize('127.0.0.1:{port}', 2, int(sys.argv[1]))\n"
        + _ALLREDUCE_OVER_EVERY_DEVICE
        + "x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x')), np.ones(1))\n"
        "try:\n"
        "    f(x)\n"
        "except ValueError as err:\n"
        "    print('REFUSED', err)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = [child.communicate(timeout=120)[0] for child in children]
    for out in outs:
        assert "REFUSED jaxmpi.allreduce" in out, out
        assert "2 processes and MPI's world 1 ranks" in out, out
