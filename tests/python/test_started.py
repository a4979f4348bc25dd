"""Non-blocking collectives: every started op against its blocking op (bit for bit, arrays
and pytrees, eager and under jit), many in flight at once and waited for in any order,
derivatives and vmap through them, control flow, misuse refused, checked mode.

The started ops are their ops run in starting mode (python/jaxmpi/_requests.py): the same
table row, one generic path. The data are `rank_data` (exact sums), so a started
reduction and a blocking one agree bit for bit whatever algorithm MPI picks for either.
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
    check_raises,
    entry_lines,
    needs_ranks,
    rank_data,
    reads_call,
)
from jaxmpi import _native
from jaxmpi._binding import primitives as prim

ROOT = SIZE - 1
COUNTS = tuple(r % 3 + 1 for r in range(SIZE))
SUM = jaxmpi.SUM
# 1 MiB of float32: past every eager-protocol limit (the transfer needs progress).
BIG = 1 << 18


def leaves(rank: int, rows: int | None = None) -> dict:
    """A pytree of mixed dtypes (with `rows` rows per leaf where given), or one array."""
    lead = () if rows is None else (rows,)
    return {
        "f": rank_data(rank, "float32", (*lead, 3)),
        "i": [rank_data(rank, "int32", (*lead, 2))],
        "z": rank_data(rank, "complex64", (*lead, 1)),
    }


# Each op: (blocking, started, input on this rank); the started one is waited for at once.
OPS = {
    "allreduce": (lambda t: jaxmpi.allreduce(t, SUM), jaxmpi.iallreduce, (SUM,), leaves(RANK)),
    "reduce": (lambda t: jaxmpi.reduce(t, SUM, ROOT), jaxmpi.ireduce, (SUM, ROOT), leaves(RANK)),
    "reduce_scatter": (
        lambda t: jaxmpi.reduce_scatter(t, SUM), jaxmpi.ireduce_scatter, (SUM,), leaves(RANK, SIZE)
    ),
    "bcast": (lambda t: jaxmpi.bcast(t, ROOT), jaxmpi.ibcast, (ROOT,), leaves(RANK)),
    "gather": (lambda t: jaxmpi.gather(t, ROOT), jaxmpi.igather, (ROOT,), leaves(RANK)),
    "allgather": (jaxmpi.allgather, jaxmpi.iallgather, (), leaves(RANK)),
    "scatter": (
        lambda t: jaxmpi.scatter(t, ROOT),
        jaxmpi.iscatter,
        (ROOT,),
        leaves(RANK, SIZE) if RANK == ROOT else leaves(0),
    ),
    "alltoall": (jaxmpi.alltoall, jaxmpi.ialltoall, (), leaves(RANK, SIZE)),
    "gatherv": (
        lambda t: jaxmpi.gatherv(t, COUNTS, ROOT), jaxmpi.igatherv, (COUNTS, ROOT),
        leaves(RANK, COUNTS[RANK]),
    ),
    "allgatherv": (
        lambda t: jaxmpi.allgatherv(t, COUNTS), jaxmpi.iallgatherv, (COUNTS,),
        leaves(RANK, COUNTS[RANK]),
    ),
    "scatterv": (
        lambda t: jaxmpi.scatterv(t, COUNTS, ROOT), jaxmpi.iscatterv, (COUNTS, ROOT),
        leaves(RANK, sum(COUNTS) if RANK == ROOT else COUNTS[RANK]),
    ),
    "alltoallv": (
        lambda t: jaxmpi.alltoallv(t, (1,) * SIZE, (1,) * SIZE), jaxmpi.ialltoallv,
        ((1,) * SIZE, (1,) * SIZE), leaves(RANK, SIZE),
    ),
}  # fmt: skip


@pytest.fixture(params=["non-blocking", "at start"])
def how(request):
    """Started collectives started non-blocking, or completed at their start (what the
    progress mode "at-start" does), on every rank alike."""
    _native.set_collectives_at_start(request.param == "at start")
    try:
        yield request.param
    finally:
        jax.effects_barrier()
        _native.set_collectives_at_start(None)


def assert_same(got, expected, what: str) -> None:
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected), what
    for g, e in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)):
        assert_array(g, e, what)


@pytest.mark.same_on_every_mpi
@pytest.mark.same_at_every_size
def test_every_started_op_is_declared_in_the_table_and_public():
    declared = {s["started"] for s in _native.signatures().values() if s["started"]}
    assert declared == {f"i{op}" for op in OPS} | {"isend", "irecv"}
    assert all(callable(getattr(jaxmpi, name)) and name in jaxmpi.__all__ for name in declared)
    assert set(prim.STARTED) == {s["starts"] for s in _native.signatures().values() if s["starts"]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", list(OPS))
def test_every_started_op_is_its_blocking_op(op, mode, how):
    blocking, started, args, tree = OPS[op]
    one = jax.tree_util.tree_leaves(tree)[0]  # a single array, not a pytree
    for x in (tree, one):
        expected = call(mode, blocking, x)
        got = call(mode, lambda x: jaxmpi.wait(started(x, *args)), x)
        assert_same(got, expected, f"{op} of {type(x).__name__}")


# Completed on the progress thread too: run again with it forced.
@pytest.mark.progress_thread
@pytest.mark.parametrize("mode", MODES)
def test_many_started_collectives_in_flight_complete_in_any_wait_order(mode, how):
    """Large allreduces, bcasts and allgathers all started before any wait, waited in
    reverse order; a point-to-point exchange among them."""
    x = jnp.full(BIG, float(RANK + 1), jnp.float32)
    partner = RANK ^ 1 if (RANK ^ 1) < SIZE else jaxmpi.PROC_NULL

    def many(x):
        requests = [jaxmpi.iallreduce(x + k, SUM) for k in range(3)]
        requests += [jaxmpi.ibcast(x * 2, 0), jaxmpi.iallgather(x[:5])]
        requests += [jaxmpi.isend(x, partner, tag=7), jaxmpi.irecv(x, partner, tag=7)]
        got = [jaxmpi.wait(r) for r in reversed(requests)]
        return got[::-1]

    got = call(mode, many, x)
    total = SIZE * (SIZE + 1) / 2
    for k in range(3):
        assert_array(got[k], np.full(BIG, total + SIZE * k, np.float32), f"iallreduce {k}")
    assert_array(got[3], np.full(BIG, 2.0, np.float32), "ibcast")
    assert_array(got[4], np.repeat(np.arange(1.0, SIZE + 1, dtype=np.float32), 5).reshape(SIZE, 5))
    assert got[5] is None
    other = float(partner + 1) if partner != jaxmpi.PROC_NULL else float(RANK + 1)
    assert_array(got[6], np.full(BIG, other, np.float32), "irecv")


# Completed on the progress thread too: run again with it forced.
@pytest.mark.progress_thread
def test_a_request_started_eagerly_is_waited_for_later(how):
    request = jaxmpi.iallreduce({"a": np.arange(4.0), "b": np.int32(RANK)}, SUM)
    between = jaxmpi.allreduce(np.float64(1.0), SUM)  # another collective meanwhile
    got = jaxmpi.wait(request)
    assert_array(got["a"], np.arange(4.0) * SIZE)
    assert int(got["b"]) == SIZE * (SIZE - 1) // 2 and float(between) == SIZE


# Rules of JAX (derivatives, batching, tracing), not of an MPI or a number of ranks.
@pytest.mark.same_on_every_mpi
@pytest.mark.same_at_every_size
def test_the_interior_runs_between_start_and_wait(how):
    """`after` and `wait(after=)` place the interior: in the compiled program the kernel
    computing it reads the start's request and comes before the wait. Where started
    collectives complete at their start, `after` gives its value back untouched: placing
    work then gains nothing, and the tie would cost a subtraction at every read."""

    def step(x, u):
        request = jaxmpi.iallreduce(x, SUM)
        interior = jnp.sin(jaxmpi.after(request, u)) * 2
        return jaxmpi.wait(request, after=interior), interior

    x, u = jnp.ones(1 << 12), jnp.ones(1 << 12)
    text = jax.jit(step).lower(x, u).compile().as_text()
    entry = entry_lines(text)
    start = [i for i, line in enumerate(entry) if '"jaxmpi_iallreduce"' in line]
    wait = [i for i, line in enumerate(entry) if '"jaxmpi_wait"' in line]
    tied = [
        i
        for i, line in enumerate(entry)
        if " fusion(" in line and reads_call(entry, line, "jaxmpi_iallreduce")
    ]
    request = jaxmpi.iallreduce(x, SUM)
    untouched = jaxmpi.after(request, u) is u
    jaxmpi.wait(request)
    assert len(start) == 1 and len(wait) == 1, entry
    if how == "at start":
        assert untouched and not tied, entry
    else:
        assert not untouched and tied and start[0] < min(tied) and max(tied) < wait[0], entry


# Rules of JAX (derivatives, batching, tracing), not of an MPI or a number of ranks.
@pytest.mark.same_on_every_mpi
@pytest.mark.same_at_every_size
@pytest.mark.parametrize("mode", MODES)
def test_derivatives_and_vmap_are_the_blocking_ops(mode, how):
    x = jnp.asarray(rank_data(RANK, "float32", (4,)))
    tangent = jnp.full(4, 0.5, jnp.float32)

    def through(started, blocking, *args):
        def f(x):
            return jnp.sum(jnp.sin(jaxmpi.wait(started(x, *args))))

        def g(x):
            return jnp.sum(jnp.sin(blocking(x, *args)))

        return f, g

    for name, (started, blocking, args) in {
        "iallreduce": (jaxmpi.iallreduce, jaxmpi.allreduce, (SUM,)),
        "ibcast": (jaxmpi.ibcast, jaxmpi.bcast, (ROOT,)),
        "iallgather": (jaxmpi.iallgather, jaxmpi.allgather, ()),
        "ireduce": (jaxmpi.ireduce, jaxmpi.reduce, (SUM, ROOT)),
    }.items():
        f, g = through(started, blocking, *args)
        assert_array(call(mode, jax.grad(f), x), call(mode, jax.grad(g), x), f"grad {name}")
        jf = call(mode, lambda x, f=f: jax.jvp(f, (x,), (tangent,)), x)
        jg = call(mode, lambda x, g=g: jax.jvp(g, (x,), (tangent,)), x)
        assert_same(jf, jg, f"jvp {name}")
    batch = jnp.stack([x, 2 * x, -x])
    started = call(mode, jax.vmap(lambda x: jaxmpi.wait(jaxmpi.iallgather(x))), batch)
    assert_array(started, call(mode, jax.vmap(jaxmpi.allgather), batch), "vmap iallgather")
    alltoall = jnp.stack([jnp.arange(SIZE * 2.0).reshape(SIZE, 2) + RANK] * 3)
    started = call(mode, jax.vmap(lambda x: jaxmpi.wait(jaxmpi.ialltoall(x))), alltoall)
    assert_array(started, call(mode, jax.vmap(jaxmpi.alltoall), alltoall), "vmap ialltoall")


def test_a_started_reduction_differentiates_only_sum():
    x = jnp.ones(3)
    loss = lambda x: jnp.sum(jaxmpi.wait(jaxmpi.iallreduce(x, jaxmpi.MAX)))  # noqa: E731
    check_raises(NotImplementedError, ["iallreduce", "op=SUM only", "MAX"], jax.grad(loss), x)
    allreduce_still_works()


@pytest.mark.parametrize("construct", ["fori_loop", "cond", "scan"])
def test_started_collectives_inside_control_flow(construct, how):
    def body(x):
        request = jaxmpi.iallreduce(x, SUM)
        interior = jaxmpi.after(request, x) * 0.5
        return jaxmpi.wait(request, after=interior) / SIZE + interior

    x = jnp.asarray(rank_data(RANK, "float32", (3,)))
    mean = np.mean([rank_data(r, "float32", (3,)) for r in range(SIZE)], axis=0)
    if construct == "fori_loop":
        got = jax.jit(lambda x: jax.lax.fori_loop(0, 2, lambda i, y: body(y), x))(x)
        once = mean + np.asarray(x) * 0.5
        expected = np.mean([mean + rank_data(r, "float32", (3,)) * 0.5 for r in range(SIZE)], 0)
        expected = expected + once * 0.5
    elif construct == "cond":
        got = jax.jit(lambda x: jax.lax.cond(x[0] < 100, body, lambda y: y, x))(x)
        expected = mean + np.asarray(x) * 0.5
    else:
        got = jax.jit(lambda x: jax.lax.scan(lambda c, _: (body(c), None), x, None, 1)[0])(x)
        expected = mean + np.asarray(x) * 0.5
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6)


# Rules of JAX (derivatives, batching, tracing), not of an MPI or a number of ranks.
@pytest.mark.same_on_every_mpi
@pytest.mark.same_at_every_size
def test_misuse_of_started_collectives_is_refused_at_trace_time():
    x = jnp.ones(3)

    def never_waited(x):
        jaxmpi.iallgather(x)
        return x

    def twice(x):
        r = jaxmpi.iallreduce(x, SUM)
        jaxmpi.wait(r)
        return jaxmpi.wait(r)

    def other_branch(x):
        r = jaxmpi.ibcast(x, 0)
        return jax.lax.cond(x[0] > 0, lambda y: jaxmpi.wait(r), lambda y: y, x)

    def read_before_wait(x):
        # The request is no array: what it will hold cannot be computed on before the wait.
        return jaxmpi.iallreduce(x, SUM) + 1

    check_raises(ValueError, ["iallgather", "never waited for", "test_started.py"], jax.jit(never_waited), x)  # fmt: skip
    check_raises(ValueError, ["waited for already"], jax.jit(twice), x)
    check_raises(ValueError, ["started in another function"], jax.jit(other_branch), x)
    check_raises(TypeError, ["Request"], jax.jit(read_before_wait), x)
    check_raises(
        NotImplementedError, ["iallgatherv", "no non-blocking form"],
        jaxmpi.iallgatherv, jnp.ones(COUNTS[RANK]), jnp.asarray(COUNTS), recv_capacity=8,
    )  # fmt: skip
    allreduce_still_works()


@needs_ranks(2)
def test_checked_mode_catches_ranks_that_start_different_calls(checked):
    """Rank 0 starts an allreduce of 3 floats, the others of 4: every rank fails at the
    start, naming each one's call; and a started op is told from its blocking one."""
    x = jnp.ones(3 if RANK == 0 else 4, jnp.float32)
    err = None
    try:
        jaxmpi.wait(jaxmpi.iallreduce(x, SUM))
    except Exception as e:  # the MPIError it stands for is what is checked
        err = jaxmpi.MPIError.from_exception(e) or e
    mixed = None
    try:
        y = jnp.ones(2, jnp.float32)
        jax.block_until_ready(
            jaxmpi.wait(jaxmpi.iallreduce(y, SUM)) if RANK == 0 else jaxmpi.allreduce(y, SUM)
        )
    except Exception as e:
        mixed = jaxmpi.MPIError.from_exception(e) or e
    assert isinstance(err, jaxmpi.MPIError), repr(err)
    assert "iallreduce float32[3]" in err.error_string and "float32[4]" in err.error_string
    assert isinstance(mixed, jaxmpi.MPIError), repr(mixed)
    assert "rank 0: iallreduce float32[2]" in mixed.error_string
    assert ": allreduce float32[2]" in mixed.error_string, mixed.error_string
