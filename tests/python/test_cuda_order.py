"""Order and freshness of device messages under stress: each rank queues its own random
amount of device work before its sends and before its receives, in consecutive jitted
calls with rank-asymmetric order (even ranks send first), and every value must arrive
whole, where and in the order it was sent, into NaN-filled templates. Stale data and
reordering under jit are what mpi4jax's GPU users report; this file is the evidence for
making fast dispatch (no runtime token between jitted calls) the default on CUDA.

The delays are real: before a send, the payload is computed from the device work (the
send reads it); before a receive, the work is a program of its own queued just before the
receive's program on the same stream, which the receive must wait for (its template is
never read, so work computed from it would be dropped). Every exchange is also checked
against the GPU counters (device_helpers.went). ci/gpu_run.sh runs it at 2 ranks
sharing one GPU, with JAXMPI_DISPATCH=fast and without."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from device_helpers import DEVICE, needs_device, on_device, poisoned, went
from jax import lax

import jaxmpi
from helpers import RANK, needs_ranks, p2p_partner
from jaxmpi._binding import dispatch as _dispatch

pytestmark = [needs_device, needs_ranks(2)]

BIG = 1 << 19  # float32 elements: 2 MiB, above every eager limit: a send waits for its receiver
ROUNDS = 40
PARTNER = p2p_partner()
SENDS_FIRST = RANK % 2 == 0
ON_GPU = DEVICE is not None and DEVICE.platform == "gpu"
WORK = 1024 if ON_GPU else 48  # the CPU stand-in gets a token amount of work
MOST = 24  # repetitions of the work, at most


def work_matrix():
    return on_device(jnp.eye(WORK, dtype=jnp.float32) * 0.5)


def busy(m, reps):
    """Up to a few ms of device work whose amount is only known at run time (one compile)."""
    return lax.fori_loop(0, reps, lambda _, a: jnp.tanh(a @ m), m)


def after(m, reps):
    """0.0, but only once busy() is done: what is computed from it waits for it."""
    return jnp.where(jnp.isnan(jnp.sum(busy(m, reps))), jnp.nan, 0.0)


spin = jax.jit(busy)


def random_reps(rng, rounds):
    """Per-rank random work amounts (the seed differs by rank: the timing is asymmetric)."""
    return [int(r) for r in rng.integers(0, MOST, size=rounds)]


def test_dispatch_mode_is_the_one_asked_for():
    # Ordered is the default on GPUs until this file's evidence says otherwise; fast on
    # the CPU that stands in for one.
    mode, why = _dispatch.dispatch_mode()
    default = "ordered" if ON_GPU else "fast"
    assert mode == (os.environ.get("JAXMPI_DISPATCH") or default), why


def test_sends_and_receives_in_consecutive_jitted_calls_keep_order():
    send = jax.jit(lambda x, k, m, r: jaxmpi.send(x * k + after(m, r), PARTNER, tag=21))
    recv = jax.jit(lambda t: jaxmpi.recv(t, PARTNER, tag=21))
    rng = np.random.default_rng(100 + RANK)
    m, ones = work_matrix(), on_device(jnp.ones(BIG, jnp.float32))
    nans = on_device(poisoned(BIG, np.float32))
    got, in_flight = [], []
    if PARTNER is not None:
        with went(ops=ROUNDS * 2):
            for k, (r_send, r_recv, r_between) in enumerate(
                zip(*(random_reps(rng, ROUNDS) for _ in range(3)), strict=True)
            ):
                in_flight.append(spin(m, r_between))  # unrelated work queued, never waited for
                if SENDS_FIRST:
                    send(ones, np.float32(k), m, r_send)
                    spin(m, r_recv)  # the receive below waits for it
                    got.append(recv(nans))
                else:
                    spin(m, r_recv)
                    got.append(recv(nans))
                    send(ones, np.float32(k), m, r_send)
            jax.block_until_ready((got, in_flight))
            jax.effects_barrier()
    wrong = [(k, np.unique(np.asarray(g))[:4]) for k, g in enumerate(got) if not np.all(g == k)]
    assert len(got) == (ROUNDS if PARTNER is not None else 0) and not wrong, wrong


def test_a_chain_of_exchanges_feeding_each_other():
    """Each round's received array is the next round's payload: one value lost, late or
    reordered changes every later one."""
    exchange = jax.jit(
        lambda y, t, m, r: jaxmpi.sendrecv(y + 1.0 + after(m, r), t, source=PARTNER, dest=PARTNER)
    )
    rng = np.random.default_rng(200 + RANK)
    m, nans = work_matrix(), on_device(poisoned(BIG, np.float32))
    y = on_device(jnp.full(BIG, 1000.0 * RANK, jnp.float32))
    if PARTNER is not None:
        with went(ops=ROUNDS):
            for r in random_reps(rng, ROUNDS):
                y = exchange(y, nans, m, r)
            y.block_until_ready()
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
    recv = jax.jit(lambda t: jaxmpi.recv(t, PARTNER, tag=22))
    rng = np.random.default_rng(300 + RANK)
    m, buf, nans = (
        work_matrix(),
        on_device(jnp.zeros(BIG, jnp.float32)),
        on_device(poisoned(BIG, np.float32)),
    )
    got = []
    if PARTNER is not None:
        with went(ops=ROUNDS):
            for r in random_reps(rng, ROUNDS):
                if SENDS_FIRST:
                    send(buf)
                    buf = bump(buf, m, r)
                else:
                    spin(m, r)
                    got.append(recv(nans))
            jax.block_until_ready((got, buf))
            jax.effects_barrier()
    wrong = [(k, np.unique(np.asarray(g))[:4]) for k, g in enumerate(got) if not np.all(g == k)]
    assert len(got) == (ROUNDS if PARTNER is not None and not SENDS_FIRST else 0), len(got)
    assert not wrong, wrong
