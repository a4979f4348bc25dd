"""User communicators (mpi4py's and jaxmpi's own) and living next to mpi4py's traffic.

`make_comm(kind)` builds a communicator on every rank and says which world ranks it holds,
in the order of their rank inside it; expected values are computed from that list.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import (
    MODES,
    MPI,
    RANK,
    SIZE,
    assert_array,
    call,
    expected_allreduce,
    expected_exscan,
    expected_reduce,
    expected_scan,
    needs_mpi4py,
    needs_ranks,
    partner_or_skip,
    rank_data,
)
from jaxmpi import Comm

# Across hosts, a transport of its own.
pytestmark = pytest.mark.across_hosts

COMM_KINDS = [
    "mpi4py-world",
    "mpi4py-dup",
    "mpi4py-split",
    "mpi4py-create",
    "mpi4py-self",
    "mpi4py-cart",
    "jaxmpi-world",
    "jaxmpi-clone",
    "jaxmpi-split",
    "jaxmpi-split-undefined",
]


def make_comm(kind: str):
    """(comm, members, free): `comm` is None on ranks left out of it; `members` lists the
    world ranks in it, ordered by their rank in `comm`; `free()` releases it."""
    everyone = list(range(SIZE))
    parity = [r for r in everyone if r % 2 == RANK % 2]

    def nothing_to_free():
        pass

    if kind == "mpi4py-world":
        return MPI.COMM_WORLD, everyone, nothing_to_free
    if kind == "mpi4py-self":
        return MPI.COMM_SELF, [RANK], nothing_to_free
    if kind == "jaxmpi-world":
        return jaxmpi.COMM_WORLD, everyone, nothing_to_free
    if kind == "mpi4py-cart":  # a periodic 1-d Cartesian topology (an Intracomm too)
        comm = MPI.COMM_WORLD.Create_cart([SIZE], periods=[True], reorder=False)
        return comm, everyone, comm.Free
    if kind == "mpi4py-dup":
        comm = MPI.COMM_WORLD.Dup()
        return comm, everyone, comm.Free
    if kind == "mpi4py-split":  # by parity, in reverse world order
        comm = MPI.COMM_WORLD.Split(RANK % 2, key=-RANK)
        return comm, parity[::-1], comm.Free
    if kind == "mpi4py-create":  # every rank but 0 (if there are others), reversed
        members = everyone[:0:-1] or [0]
        group = MPI.COMM_WORLD.Get_group()
        subgroup = group.Incl(members)
        comm = MPI.COMM_WORLD.Create(subgroup)
        subgroup.Free()
        group.Free()
        if comm == MPI.COMM_NULL:
            return None, members, nothing_to_free
        return comm, members, comm.Free
    if kind == "jaxmpi-clone":
        comm = jaxmpi.COMM_WORLD.Clone()
        return comm, everyone, comm.Free
    if kind == "jaxmpi-split":  # by parity, in reverse world order
        comm = jaxmpi.COMM_WORLD.Split(RANK % 2, -RANK)
        return comm, parity[::-1], comm.Free
    if kind == "jaxmpi-split-undefined":  # rank 0 is left out (color None)
        comm = jaxmpi.COMM_WORLD.Split(None if RANK == 0 else 7, RANK)
        members = everyone[1:]
        return comm, members, (comm.Free if comm is not None else nothing_to_free)
    raise ValueError(kind)


def _ops_on(comm, members):
    """Runs every op once on `comm`; returns their results by name."""
    size, me = len(members), members.index(RANK)
    left, right = (me - 1) % size, (me + 1) % size
    last = size - 1
    scatter_in = (
        np.stack([rank_data(w, "float32") for w in members]) if me == 0 else np.zeros(3, np.float32)
    )
    alltoall_in = np.stack([rank_data(100 * RANK + w, "float32") for w in members])

    def run(x, scatter_in, alltoall_in):
        return {
            "allreduce": jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm),
            "reduce": jaxmpi.reduce(x, jaxmpi.SUM, last, comm=comm),
            "scan": jaxmpi.scan(x, jaxmpi.SUM, comm=comm),
            "exscan": jaxmpi.exscan(x, jaxmpi.SUM, comm=comm),
            "bcast": jaxmpi.bcast(x, last, comm=comm),
            "gather": jaxmpi.gather(x, 0, comm=comm),
            "allgather": jaxmpi.allgather(x, comm=comm),
            "scatter": jaxmpi.scatter(scatter_in, 0, comm=comm),
            "alltoall": jaxmpi.alltoall(alltoall_in, comm=comm),
            "sendrecv": jaxmpi.sendrecv(x, x, source=left, dest=right, comm=comm),
            "barrier": jaxmpi.barrier(comm=comm),
        }

    return run, (rank_data(RANK, "float32"), scatter_in, alltoall_in)


def _expected_on(members):
    size, me = len(members), members.index(RANK)
    inputs = [rank_data(w, "float32") for w in members]
    mine = inputs[me]
    return {
        "allreduce": expected_allreduce("SUM", inputs),
        "reduce": expected_reduce("SUM", inputs, size - 1, me),
        "scan": expected_scan("SUM", inputs, me),
        "exscan": expected_exscan("SUM", inputs, me),
        "bcast": inputs[-1],
        "gather": np.stack(inputs) if me == 0 else mine,
        "allgather": np.stack(inputs),
        "scatter": mine,
        "alltoall": np.stack([rank_data(100 * w + RANK, "float32") for w in members]),
        "sendrecv": inputs[(me - 1) % size],
        "barrier": [],
    }


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", COMM_KINDS)
def test_every_op_on_a_user_communicator(kind, mode):
    if kind.startswith("mpi4py") and MPI is None:
        pytest.skip("needs mpi4py")
    comm, members, free = make_comm(kind)
    try:
        if comm is None:  # this rank is not in the communicator
            assert RANK not in members
            return
        rank_size = (comm.Get_rank(), comm.Get_size())
        run, args = _ops_on(comm, members)
        got = call(mode, run, *args)
    finally:
        jax.effects_barrier()
        free()
    assert rank_size == (members.index(RANK), len(members))
    expected = _expected_on(members)
    assert got.pop("barrier") == expected.pop("barrier")
    for name, value in expected.items():
        assert_array(got[name], value, name)


def test_jaxmpi_comm_world_agrees_with_mpi4py():
    assert jaxmpi.COMM_WORLD.Get_rank() == RANK
    assert jaxmpi.COMM_WORLD.Get_size() == SIZE
    if MPI is not None:
        assert (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()) == (RANK, SIZE)


def test_jaxmpi_comm_methods():
    clone = jaxmpi.COMM_WORLD.Clone()
    dup = jaxmpi.COMM_WORLD.Dup()
    try:
        distinct = clone != jaxmpi.COMM_WORLD and dup != clone and clone == Comm(clone.handle)
        hashable = len({clone, dup, jaxmpi.COMM_WORLD}) == 3
        text = repr(clone)
        clone.Barrier()
    finally:
        clone.Free()
        dup.Free()
    assert distinct
    assert hashable
    assert text.startswith("jaxmpi.Comm(")


def test_split_with_undefined_color_gives_none():
    comm = jaxmpi.COMM_WORLD.Split(None)
    assert comm is None


def test_split_defaults_are_mpi4py_s():
    """mpi4py's `Split(color=0, key=0)`: no arguments keeps every rank, in its order."""
    comm = jaxmpi.COMM_WORLD.Split()
    try:
        got = (comm.Get_rank(), comm.Get_size())
    finally:
        comm.Free()
    if MPI is not None:
        reference = MPI.COMM_WORLD.Split()
        expected = (reference.Get_rank(), reference.Get_size())
        reference.Free()
        assert expected == (RANK, SIZE)
    assert got == (RANK, SIZE)


def test_jit_with_a_communicator_as_static_argument():
    """jaxmpi.Comm is hashable, so it can be a static argument: one compilation each."""
    summed = jax.jit(
        lambda x, comm: jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm), static_argnames="comm"
    )
    parity = jaxmpi.COMM_WORLD.Split(RANK % 2, RANK)
    try:
        on_world = summed(jnp.int32(RANK), comm=jaxmpi.COMM_WORLD)
        on_parity = summed(jnp.int32(RANK), comm=parity)
        on_world_again = summed(jnp.int32(RANK), comm=jaxmpi.COMM_WORLD)
        jax.effects_barrier()
    finally:
        parity.Free()
    same_parity = [r for r in range(SIZE) if r % 2 == RANK % 2]
    assert int(on_world) == int(on_world_again) == sum(range(SIZE))
    assert int(on_parity) == sum(same_parity)


def test_two_communicators_in_one_program():
    """Alternating calls on two communicators in one jitted function keep program order."""
    parity = jaxmpi.COMM_WORLD.Split(RANK % 2, RANK)
    try:

        @jax.jit
        def run(x):
            results = []
            for k in range(4):
                comm = parity if k % 2 else jaxmpi.COMM_WORLD
                results.append(jaxmpi.allgather(x + 10 * k, comm=comm))
            return results

        got = run(jnp.int32(RANK))
        jax.effects_barrier()
    finally:
        parity.Free()
    same_parity = np.array([r for r in range(SIZE) if r % 2 == RANK % 2], np.int32)
    for k, value in enumerate(got):
        members = same_parity if k % 2 else np.arange(SIZE, dtype=np.int32)
        assert_array(value, members + 10 * k, f"call {k}")


# ---------------------------------------------------------------------------------------
# Next to mpi4py's own traffic on COMM_WORLD
# ---------------------------------------------------------------------------------------


# MPICH 5.0.2 over UCX (its default netmod) loses a message across hosts: a Recv from
# MPI_ANY_SOURCE on a Dup of COMM_WORLD never completes when a wildcard Mprobe/Mrecv
# (mpi4py's pickled recv) on COMM_WORLD came first; reproduced with mpi4py alone, gone with
# MPIR_CVAR_CH4_NETMOD=ofi, fine with Open MPI. This test does exactly that.
@pytest.mark.skipif(
    "JAXMPI_TEST_HOSTS" in os.environ and jaxmpi._runtime.library.info["family"] == "mpich",
    reason="MPICH over UCX loses a wildcard message across hosts (mpi4py alone shows it)",
)
@needs_mpi4py
@needs_ranks(2)
@pytest.mark.parametrize("first", ["mpi4py", "jaxmpi"])
def test_messages_do_not_mix_with_mpi4py_traffic(first):
    """Both libraries send a message with the same tag between the same two ranks, and
    the receiver takes them in the other order, with wildcards. Messages only reach the
    right receiver because jaxmpi's default communicator is a clone of COMM_WORLD, not
    COMM_WORLD itself (mpi4jax's convention)."""
    partner = partner_or_skip()
    payload = np.arange(4, dtype=np.float64) + 10 * RANK
    if RANK % 2 == 0:
        requests = []
        for lib in (first, "jaxmpi" if first == "mpi4py" else "mpi4py"):
            if lib == "mpi4py":
                requests.append(MPI.COMM_WORLD.isend({"from": "mpi4py"}, dest=partner, tag=5))
            else:
                jaxmpi.send(payload, partner, tag=5)
        jax.effects_barrier()
        for request in requests:
            request.wait()
        return
    # The receiver takes them in the opposite order, with wildcards on both.
    if first == "mpi4py":
        from_jaxmpi = jaxmpi.recv(np.zeros(4), jaxmpi.ANY_SOURCE, tag=jaxmpi.ANY_TAG)
        from_jaxmpi = jax.device_get(from_jaxmpi)
        from_mpi4py = MPI.COMM_WORLD.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    else:
        from_mpi4py = MPI.COMM_WORLD.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
        from_jaxmpi = jax.device_get(jaxmpi.recv(np.zeros(4), jaxmpi.ANY_SOURCE))
    assert from_mpi4py == {"from": "mpi4py"}
    assert_array(from_jaxmpi, np.arange(4, dtype=np.float64) + 10 * partner)


@needs_mpi4py
def test_collectives_interleaved_with_mpi4py_collectives():
    """mpi4py's collectives on COMM_WORLD from the Python thread, jaxmpi's (eager ones run
    asynchronously on XLA's threads, so possibly at the same time) in between."""
    jitted_gather = jax.jit(jaxmpi.allgather)
    results = []
    for k in range(5):
        results.append(("jaxmpi-eager", jaxmpi.allreduce(np.int64(RANK + k), jaxmpi.SUM)))
        results.append(("mpi4py", MPI.COMM_WORLD.allreduce(RANK + k, op=MPI.SUM)))
        results.append(("jaxmpi-jit", jitted_gather(np.int64(RANK * k))))
        results.append(("mpi4py", MPI.COMM_WORLD.bcast(k if RANK == 0 else None, root=0)))
        MPI.COMM_WORLD.Barrier()
    got = [(lib, jax.device_get(value)) for lib, value in results]
    expected = []
    for k in range(5):
        expected.append(("jaxmpi-eager", sum(range(SIZE)) + SIZE * k))
        expected.append(("mpi4py", sum(range(SIZE)) + SIZE * k))
        expected.append(("jaxmpi-jit", [r * k for r in range(SIZE)]))
        expected.append(("mpi4py", k))
    assert [(lib, np.asarray(v).tolist()) for lib, v in got] == expected


@needs_mpi4py
@pytest.mark.parametrize("mode", MODES)
def test_explicit_mpi4py_comm_world(mode):
    """Passing MPI.COMM_WORLD itself (no clone) works too."""
    got = call(mode, lambda x: jaxmpi.allreduce(x, MPI.SUM, comm=MPI.COMM_WORLD), np.int32(RANK))
    assert int(got) == sum(range(SIZE))


def test_start_up_collectives_move_what_each_rank_needs():
    """What jaxmpi's start-up exchanges, each rank moving as much whatever the ranks:
    rank 0's coordinator address (a bcast), whether any rank uses GPUs (a MAX), and
    whether every rank's settings are the same (the MAX of a digest and its negation)."""
    from jaxmpi import _native
    from jaxmpi._runtime import agree

    world = _native.world()
    rank, size = _native.comm_rank(world), _native.comm_size(world)
    for root in range(size):
        assert _native.bcast_bytes(world, b"%4d" % rank, root) == b"%4d" % root
    assert _native.allreduce_max(world, [rank, -rank, 7]) == [size - 1, 0, 7]
    same = _native.allreduce_max(world, agree.digest_words(b"JAXMPI_TIMEOUT=60"))
    assert agree.same_everywhere(same)
    last_differs = b"JAXMPI_TIMEOUT=60" if rank < size - 1 else b"JAXMPI_TIMEOUT=61"
    differ = _native.allreduce_max(world, agree.digest_words(last_differs))
    assert agree.same_everywhere(differ) == (size == 1)
