"""Order and freshness of GPU messages under stress: each rank does its own random amount
of GPU work before and between rank-asymmetric sends and receives (even ranks send first)
in consecutive jitted calls, and every value must arrive whole, where and in the order it
was sent. Stale data and reordering under jit are what mpi4jax's GPU users report; this
file is the evidence for making fast dispatch (no runtime token between jitted calls) the
default on CUDA. ci/gpu_run.sh runs it at 2 ranks sharing one GPU with
JAXMPI_DISPATCH=fast; skipped where jaxmpi has no GPU to use."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxmpi
from helpers import RANK, needs_gpu, needs_ranks, p2p_partner
from jaxmpi._binding import dispatch as _dispatch

pytestmark = [needs_gpu, needs_ranks(2)]

BIG = 1 << 19  # float32 elements: 2 MiB, above every eager limit: a send waits for its receiver
ROUNDS = 40
PARTNER = p2p_partner()
SENDS_FIRST = RANK % 2 == 0


def on_gpu(x):
    return jax.device_put(x, jax.devices("gpu")[0])


def work_matrix():
    return on_gpu(jnp.eye(1024, dtype=jnp.float32) * 0.5)


def busy(m, reps):
    """Up to a few ms of GPU work whose amount is only known at run time (one compile)."""
    return lax.fori_loop(0, reps, lambda _, a: jnp.tanh(a @ m), m)


def after(m, reps):
    """0.0, but only once busy() is done: makes the op in the same program wait for it."""
    return jnp.where(jnp.isnan(jnp.sum(busy(m, reps))), jnp.nan, 0.0)


def random_reps(rng, rounds):
    """Per-rank random work amounts (the seed differs by rank: the timing is asymmetric)."""
    return [int(r) for r in rng.integers(0, 24, size=rounds)]


def test_dispatch_mode_is_the_one_asked_for():
    # Ordered is the default on GPUs until this file's evidence says otherwise.
    mode, why = _dispatch.dispatch_mode()
    assert mode == (os.environ.get("JAXMPI_DISPATCH") or "ordered"), why


def test_sends_and_receives_in_consecutive_jitted_calls_keep_order():
    send = jax.jit(lambda x, k, m, r: jaxmpi.send(x * k + after(m, r), PARTNER, tag=21))
    recv = jax.jit(lambda t, m, r: jaxmpi.recv(t + after(m, r), PARTNER, tag=21) * 1.0)
    spin = jax.jit(busy)
    rng = np.random.default_rng(100 + RANK)
    m, ones, zeros = (
        work_matrix(),
        on_gpu(jnp.ones(BIG, jnp.float32)),
        on_gpu(jnp.zeros(BIG, jnp.float32)),
    )
    got, in_flight = [], []
    if PARTNER is not None:
        for k, (r_send, r_recv, r_between) in enumerate(
            zip(*(random_reps(rng, ROUNDS) for _ in range(3)), strict=True)
        ):
            in_flight.append(spin(m, r_between))  # unrelated work queued, never waited for
            if SENDS_FIRST:
                send(ones, np.float32(k), m, r_send)
                got.append(recv(zeros, m, r_recv))
            else:
                got.append(recv(zeros, m, r_recv))
                send(ones, np.float32(k), m, r_send)
    wrong = [(k, np.unique(np.asarray(g))[:4]) for k, g in enumerate(got) if not np.all(g == k)]
    assert len(got) == (ROUNDS if PARTNER is not None else 0) and not wrong, wrong


def test_a_chain_of_exchanges_feeding_each_other():
    """Each round's received array is the next round's payload: one value lost, late or
    reordered changes every later one."""
    exchange = jax.jit(
        lambda y, m, r: jaxmpi.sendrecv(y + 1.0 + after(m, r), y, source=PARTNER, dest=PARTNER)
    )
    rng = np.random.default_rng(200 + RANK)
    m = work_matrix()
    y = on_gpu(jnp.full(BIG, 1000.0 * RANK, jnp.float32))
    if PARTNER is not None:
        for r in random_reps(rng, ROUNDS):
            y = exchange(y, m, r)
    # What both ranks hold after n rounds, computed alongside: a, b = b + 1, a + 1.
    mine, theirs = 1000.0 * RANK, 1000.0 * (PARTNER or 0)
    for _ in range(ROUNDS if PARTNER is not None else 0):
        mine, theirs = theirs + 1.0, mine + 1.0
    assert np.all(np.asarray(y) == mine), (np.unique(np.asarray(y))[:4], mine)


def test_a_send_reads_its_buffer_before_the_buffer_is_reused():
    """The sender donates the buffer it just sent to the next (in-place) update: the
    receiver must still get the value at send time, never the update."""
    send = jax.jit(lambda x: jaxmpi.send(x, PARTNER, tag=22))
    bump = jax.jit(lambda x, m, r: x + 1.0 + after(m, r), donate_argnums=0)
    recv = jax.jit(lambda t, m, r: jaxmpi.recv(t + after(m, r), PARTNER, tag=22) * 1.0)
    rng = np.random.default_rng(300 + RANK)
    m, buf, zeros = (
        work_matrix(),
        on_gpu(jnp.zeros(BIG, jnp.float32)),
        on_gpu(jnp.zeros(BIG, jnp.float32)),
    )
    got = []
    if PARTNER is not None:
        for r in random_reps(rng, ROUNDS):
            if SENDS_FIRST:
                send(buf)
                buf = bump(buf, m, r)
            else:
                got.append(recv(zeros, m, r))
    wrong = [(k, np.unique(np.asarray(g))[:4]) for k, g in enumerate(got) if not np.all(g == k)]
    assert not wrong, wrong
