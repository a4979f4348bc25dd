"""Fast dispatch (no runtime token between jitted calls) keeps every MPI call in program
order, drops none, and loses no error; the same tests pass under JAXMPI_DISPATCH=ordered
(tests/dispatch_modes.sh runs this file that way too).

Messages are 2 MiB, above every library's eager limit, so a send completes only once its
receiver is there: calls run out of order would deadlock or deliver the wrong message.
Programs compute before they communicate (more than XLA's "cheap" threshold), so XLA runs
them asynchronously on its own threads instead of inline in the dispatching call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxmpi
from helpers import RANK, SIZE, count_python_dispatches, needs_ranks, p2p_partner
from jaxmpi._binding import dispatch as _dispatch
from jaxmpi._runtime.library import info

# Dispatch is JAX's and jaxmpi's, whatever the MPI and the number of ranks
# (tests/dispatch_modes.sh runs jobs on every build).
pytestmark = [pytest.mark.same_on_every_mpi, pytest.mark.same_at_every_size]

BIG = 1 << 19  # float32 elements: 2 MiB
MODE, WHY = _dispatch.dispatch_mode()
PARTNER = p2p_partner()
SENDS_FIRST = RANK % 2 == 0
LEFT, RIGHT = (RANK - 1) % SIZE, (RANK + 1) % SIZE

pairs = needs_ranks(2)
# Variables that make a process a rank of this job (see test_startup.py).
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDI_", "HYDRA_", "I_MPI_", "MPI_LOCALNRANKS")
# MPICH itself checks every handle it is given (MPICH derivatives may be built without).
VALIDATES_HANDLES = info["family"] == "mpich" and "MPICH" in info["version_string"]


def big(value: float) -> np.ndarray:
    return np.full(BIG, value, np.float32)


def first(x) -> float:
    return float(np.asarray(x)[0])


def test_the_mode_is_the_one_asked_for():
    # The suite runs on the CPU with one device per rank, where fast is the default.
    assert MODE == (os.environ.get("JAXMPI_DISPATCH") or "fast"), WHY


def test_jitted_mpi_calls_take_the_dispatch_path_of_the_mode():
    """Fast: JAX's C++ path dispatches the call, Python never runs; ordered: every call
    goes through Python to thread the runtime token."""
    f = jax.jit(lambda x: jaxmpi.allreduce(x * 2, jaxmpi.SUM))
    x = jnp.ones(4, jnp.float32)
    f(x).block_until_ready()
    f(x).block_until_ready()
    with count_python_dispatches() as count:
        for _ in range(5):
            y = f(x)
        y.block_until_ready()
    assert count[0] == (0 if MODE == "fast" else 5), (MODE, count[0])
    assert first(y) == 2.0 * SIZE


@pairs
def test_order_across_consecutive_jitted_calls():
    """Rank-dependent order (even ranks send first), same tag, nothing blocks between
    calls: values must arrive in the order they were sent."""
    send = jax.jit(lambda x, k: jaxmpi.send(x * k, PARTNER, tag=5))
    recv = jax.jit(lambda t: jaxmpi.recv(t, PARTNER, tag=5) + 0.0)
    got = []
    if PARTNER is not None:
        for k in range(1, 6):
            if SENDS_FIRST:
                send(big(1), np.float32(k))
                got.append(recv(big(0)))
            else:
                got.append(recv(big(0)))
                send(big(1), np.float32(k))
    assert [first(g) for g in got] == ([1.0, 2.0, 3.0, 4.0, 5.0] if PARTNER is not None else [])


@pairs
def test_eager_ops_between_jitted_calls_keep_their_place():
    send = jax.jit(lambda x: jaxmpi.send(x * 1.0, PARTNER, tag=6))
    recv = jax.jit(lambda t: jaxmpi.recv(t, PARTNER, tag=6) + 0.0)
    got = []
    if PARTNER is not None and SENDS_FIRST:
        send(big(1))
        jaxmpi.send(big(2), PARTNER, tag=6)
        send(big(3))
    elif PARTNER is not None:
        got = [
            jaxmpi.recv(big(0), PARTNER, tag=6),
            recv(big(0)),
            jaxmpi.recv(big(0), PARTNER, tag=6),
        ]
    assert [first(g) for g in got] == ([1.0, 2.0, 3.0] if got else [])


@pairs
def test_order_inside_one_program():
    def exchange(x):
        received = []
        for k in range(1, 4):
            if SENDS_FIRST:
                jaxmpi.send(x * k, PARTNER, tag=7)
                received.append(jaxmpi.recv(x, PARTNER, tag=7))
            else:
                received.append(jaxmpi.recv(x, PARTNER, tag=7))
                jaxmpi.send(x * k, PARTNER, tag=7)
        return jnp.stack([r[0] for r in received])

    got = jax.jit(exchange)(big(1)) if PARTNER is not None else None
    assert got is None or np.asarray(got).tolist() == [1.0, 2.0, 3.0]


def _sends_with_unused_results(kind: str):
    """A program whose sends (and barriers) have no result anyone uses: each must still
    run, in order. Returns (program, number of messages it sends)."""

    def step(c):
        jaxmpi.barrier()
        jaxmpi.send(jnp.full(BIG, c, jnp.float32) * 1.0, PARTNER, tag=8)
        return c + 1.0

    if kind == "nested jit":
        return jax.jit(lambda c: jax.jit(step)(c) * 0.0), 1
    if kind == "scan":
        return jax.jit(lambda c: lax.scan(lambda c, _: (step(c), None), c, None, length=3)[0]), 3
    if kind == "while":
        return jax.jit(lambda c: lax.while_loop(lambda c: c < 3.0, step, c)), 3
    # cond: both branches send, the taken one decides the value
    return jax.jit(lambda c: lax.cond(c >= 0.0, step, lambda c: step(c - 10.0), c)), 1


@pairs
@pytest.mark.parametrize("kind", ["nested jit", "scan", "while", "cond"])
def test_unused_results_of_send_and_barrier_in_control_flow(kind):
    program, messages = _sends_with_unused_results(kind)
    got = []
    if PARTNER is None:  # the odd rank out of an odd-sized job joins the barriers only
        for _ in range(messages):
            jaxmpi.barrier()
    elif SENDS_FIRST:
        program(np.float32(0.0))
    else:
        for _ in range(messages):
            jaxmpi.barrier()
            got.append(first(jaxmpi.recv(big(-1), PARTNER, tag=8)))
    jax.effects_barrier()
    if PARTNER is not None and not SENDS_FIRST:
        assert got == [float(k) for k in range(messages)]


def test_grad_and_linearize_through_sendrecv():
    """The transpose sends cotangents back the other way: d/dx of sum(w * y) where
    y = x of the left neighbour is the right neighbour's w."""
    w = np.float32(RANK + 1)

    def loss(x):
        y = jaxmpi.sendrecv(x, x, source=LEFT, dest=RIGHT)
        return jnp.sum(w * y)

    x = jnp.ones(8, jnp.float32)
    grad = jax.jit(jax.grad(loss))(x)
    _, f_jvp = jax.linearize(loss, x)
    tangent = jax.jit(f_jvp)(jnp.full(8, float(RANK), jnp.float32))
    assert np.asarray(grad).tolist() == [float(RIGHT + 1)] * 8
    assert float(tangent) == 8.0 * LEFT * (RANK + 1)


@pairs
def test_jvp_through_send_and_recv():
    """The sender's tangent travels with its value to the receiver."""
    got = None
    if PARTNER is not None and SENDS_FIRST:
        jax.jit(lambda x, t: jax.jvp(lambda v: jaxmpi.send(v, PARTNER, tag=9), (x,), (t,)))(
            jnp.ones(4, jnp.float32), jnp.full(4, 3.0, jnp.float32)
        )
    elif PARTNER is not None:
        got = jax.jit(lambda x, t: jax.jvp(lambda v: jaxmpi.recv(v, PARTNER, tag=9), (x,), (t,)))(
            jnp.zeros(4, jnp.float32), jnp.zeros(4, jnp.float32)
        )
    if got is not None:
        value, tangent = got
        assert np.asarray(value).tolist() == [1.0] * 4
        assert np.asarray(tangent).tolist() == [3.0] * 4


def test_vmap_of_sendrecv():
    xs = jnp.arange(3, dtype=jnp.float32)[:, None] + 10.0 * RANK * jnp.ones((3, 4), jnp.float32)
    got = jax.jit(jax.vmap(lambda x: jaxmpi.sendrecv(x, x, source=LEFT, dest=RIGHT)))(xs)
    expected = np.arange(3, dtype=np.float32)[:, None] + 10.0 * LEFT * np.ones((3, 4), np.float32)
    assert np.array_equal(np.asarray(got), expected)


def test_programs_with_mpi_ops_on_a_second_platform_are_refused_under_fast_dispatch(
    monkeypatch,
):
    """Each platform runs its own queue: fast dispatch could not keep a CPU program's MPI
    calls in order with a GPU program's. Lowered for the other platform without running
    (JAX lowers for a platform the process lacks), so a CPU machine checks it too: as a
    platform this process has (the one fact faked), refused; as what it is, a program
    lowered to be exported, which never runs here, accepted and claiming nothing."""

    def program():  # a function of its own each time: JAX caches lowerings per function
        return jax.jit(lambda x: jaxmpi.allreduce(x * 2, jaxmpi.SUM))

    program()(jnp.ones(3, jnp.float32)).block_until_ready()  # this process's, claimed
    here = jax.devices()[0].platform
    other = "cuda" if here == "cpu" else "cpu"
    with monkeypatch.context() as faked:
        faked.setattr(_dispatch, "_runs_here", lambda platform: True)
        traced = program().trace(jnp.ones(3, jnp.float32))
        if MODE == "fast":
            with pytest.raises(ValueError, match=f"program for {other}.*two platforms run in two"):
                traced.lower(lowering_platforms=(other,))
        else:  # the runtime token orders programs whatever their platform
            assert traced.lower(lowering_platforms=(other,)).as_text()
    if not _dispatch._runs_here(other):
        exported = program().trace(jnp.ones(3, jnp.float32))
        assert exported.lower(lowering_platforms=(other,)).as_text()
        assert _dispatch.policy.platform in (None, here)


@pytest.mark.skipif(
    MODE != "fast",
    reason="ordered dispatch: JAX's runtime token carries the failure into every later "
    "jaxmpi program of the process, which would fail the tests after this one",
)
@pytest.mark.skipif(
    not VALIDATES_HANDLES,
    reason="needs MPICH itself, which validates handles: a freed communicator is a "
    "dangling pointer in Open MPI (sending on one is undefined behaviour), and MPICH "
    "derivatives may be built without argument checks",
)
@pytest.mark.parametrize("reporter", ["effects_barrier", "eager op", "Comm method"])
def test_a_send_failing_in_the_background_is_raised_later_with_its_op(reporter):
    """A send whose program has no result fails after its call returned (the communicator
    was freed behind jaxmpi's back between tracing and running): effects_barrier, or the
    next eager op or Comm method after its own MPI call (so every rank makes that call and
    none is left waiting in it), raises it as MPIError naming the send, once. If XLA ran
    the program inline, the call itself raised it, and nothing is raised again."""
    comm = jaxmpi.COMM_WORLD.Dup()
    x = jnp.ones(1 << 16, jnp.float32)
    program = jax.jit(lambda x: jaxmpi.send(jnp.sin(x) * 2.0, RANK, comm=comm))
    program.lower(x).compile()  # traced and compiled while the communicator is alive
    comm.Free()
    try:
        program(x)
        raised_at_call = None
    except Exception as err:
        raised_at_call = err

    def report():
        if reporter == "effects_barrier":
            jax.effects_barrier()
        elif reporter == "eager op":
            jaxmpi.allreduce(jnp.float32(1.0), jaxmpi.SUM)
        else:
            jaxmpi.COMM_WORLD.Barrier()

    # The send may still be running when the next call returns (it is dispatched on
    # an XLA thread): every rank makes the same few reporting calls, a moment apart, and
    # exactly one of all these raises the failure.
    raised = [raised_at_call] if raised_at_call is not None else []
    for _ in range(3):
        try:
            report()
        except Exception as err:
            raised.append(err)
        time.sleep(0.2)
    jax.effects_barrier()  # nothing left to raise
    assert len(raised) == 1, f"raised {len(raised)} times: {raised!r}"
    err = jaxmpi.MPIError.from_exception(raised[0])
    assert err is not None, repr(raised[0])
    assert raised_at_call is not None or isinstance(raised[0], jaxmpi.MPIError), repr(raised)
    assert err.op == "send" and err.peer == RANK and err.error_class is not None
    assert "communicator" in err.error_string.lower()


_FALLBACK = """
import sys, warnings
import jax, jax.numpy as jnp, jaxmpi
from jaxmpi._binding import dispatch as _dispatch
sys.path.insert(0, {helpers!r})
from helpers import count_python_dispatches
# A JAX whose lowering differs from what fast dispatch assumes, as the self-check sees it.
_dispatch.policy.check = lambda result, created, thorough, own_tokens: "simulated difference"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    f = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM) + 1)
    g = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM) * 3)
    values = [float(f(jnp.float32(1))), float(g(jnp.float32(1)))]
with count_python_dispatches() as count:
    for _ in range(3):
        f(jnp.float32(1))
jax.effects_barrier()
mode, why = _dispatch.dispatch_mode()
print("RESULT", values, len(caught), mode, count[0], why, sep="|")
"""


@pytest.mark.skipif(RANK != 0, reason="starts its own process; rank 0 does it")
def test_a_jax_that_lowers_differently_falls_back_to_ordered_with_one_warning():
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    clean.update(
        JAX_PLATFORMS="cpu", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"
    )
    clean.pop("JAXMPI_DISPATCH", None)
    done = subprocess.run(
        [sys.executable, "-c", _FALLBACK.format(helpers=os.path.dirname(__file__))],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    line = [s for s in done.stdout.splitlines() if s.startswith("RESULT|")]
    assert done.returncode == 0 and line, done.stdout + done.stderr
    _, values, warnings, mode, python_calls, why = line[0].split("|")
    assert values == "[2.0, 3.0]"
    assert warnings == "1" and mode == "ordered" and python_calls == "3", line[0]
    assert "simulated difference" in why
