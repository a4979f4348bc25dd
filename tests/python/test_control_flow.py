"""Ops inside jit-compiled control flow, custom_vjp and checkpoint, and many independent
ops in one program (which only stay in the same order on every rank because jaxmpi orders
them)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxmpi
from helpers import (
    RANK,
    SIZE,
    assert_array,
    needs_ranks,
    partner_or_skip,
    rank_data,
)

# Control flow is JAX's, whatever the MPI; the number of ranks enters.
pytestmark = pytest.mark.same_on_every_mpi


def rank_sum() -> int:
    """0 + 1 + ... + (SIZE - 1)."""
    return SIZE * (SIZE - 1) // 2


def test_fori_loop():
    """x <- allreduce(x) / SIZE + 1, five times."""
    steps = 5

    @jax.jit
    def run(x):
        return lax.fori_loop(0, steps, lambda i, x: jaxmpi.allreduce(x, jaxmpi.SUM) / SIZE + 1, x)

    got = run(jnp.float64(RANK))
    # After the first step every rank holds mean(ranks) + 1; each later step adds 1.
    assert_array(got, np.float64(rank_sum() / SIZE + steps))


def test_scan_ring_shift():
    """lax.scan passes a value around the ring with sendrecv: after k steps rank r holds
    what rank r-k started with, and after SIZE steps its own value again."""

    @jax.jit
    def run(x):
        def step(carry, _):
            moved = jaxmpi.sendrecv(carry, carry, source=(RANK - 1) % SIZE, dest=(RANK + 1) % SIZE)
            return moved, moved

        return lax.scan(step, x, None, length=SIZE)

    final, history = run(rank_data(RANK, "float32", (2,)))
    expected_history = np.stack(
        [rank_data((RANK - k - 1) % SIZE, "float32", (2,)) for k in range(SIZE)]
    )
    assert_array(history, expected_history, "history")
    assert_array(final, rank_data(RANK, "float32", (2,)), "final")


def test_scan_with_collectives_and_rank_dependent_shapes():
    """A scan body with several collectives, including gather (whose shape depends on
    whether this rank is the root, decided at trace time)."""
    root = SIZE - 1

    @jax.jit
    def run(x):
        def step(carry, _):
            total = jaxmpi.allreduce(carry, jaxmpi.SUM)
            stacked = jaxmpi.gather(carry, root)
            everything = jaxmpi.allgather(carry)
            return carry + 1, (total, stacked, everything)

        return lax.scan(step, x, None, length=3)

    _, (totals, gathered, allgathered) = run(jnp.int32(RANK))
    ranks = np.arange(SIZE, dtype=np.int32)
    assert_array(totals, np.array([rank_sum() + k * SIZE for k in range(3)], np.int32))
    assert_array(allgathered, np.stack([ranks + k for k in range(3)]))
    if RANK == root:
        assert_array(gathered, np.stack([ranks + k for k in range(3)]))
    else:
        assert_array(gathered, np.arange(3, dtype=np.int32) + RANK)


def test_while_loop():
    """Every rank adds rank + 1 to a shared counter each iteration until it reaches a
    threshold: the loop condition comes from an allreduce, so all ranks loop equally often."""
    threshold = 25

    @jax.jit
    def run(counter):
        def body(state):
            counter, iterations = state
            counter = counter + jaxmpi.allreduce(jnp.int32(RANK + 1), jaxmpi.SUM)
            return counter, iterations + 1

        return lax.while_loop(lambda s: s[0] < threshold, body, (counter, jnp.int32(0)))

    counter, iterations = run(jnp.int32(0))
    per_iteration = SIZE * (SIZE + 1) // 2
    expected_iterations = -(-threshold // per_iteration)  # ceil
    assert int(iterations) == expected_iterations
    assert int(counter) == expected_iterations * per_iteration


def test_cond_with_the_same_branch_everywhere():
    """The predicate comes from an allreduce, so every rank takes the same branch; only
    one branch communicates."""

    @jax.jit
    def run(x):
        total = jaxmpi.allreduce(x, jaxmpi.SUM)
        return lax.cond(
            total > 0,
            lambda x: jaxmpi.allreduce(x * 2, jaxmpi.SUM),
            lambda x: x - 1,
            x,
        )

    got = run(jnp.float32(RANK + 1))
    assert_array(got, np.float32(2 * SIZE * (SIZE + 1) // 2))


@needs_ranks(2)
def test_cond_with_rank_dependent_branches():
    """Even ranks run the branch that sends then receives, odd ranks the one that receives
    then sends: the branch is chosen at run time from a traced rank."""
    partner = partner_or_skip()

    def send_first(x, t):
        jaxmpi.send(x, partner)
        return jaxmpi.recv(t, partner)

    def recv_first(x, t):
        received = jaxmpi.recv(t, partner)
        jaxmpi.send(x, partner)
        return received

    @jax.jit
    def run(rank, x, t):
        return lax.cond(rank % 2 == 0, send_first, recv_first, x, t)

    got = run(jnp.int32(RANK), rank_data(RANK, "int16", (3,)), jnp.zeros(3, jnp.int16))
    assert_array(got, rank_data(partner, "int16", (3,)))


def test_switch():
    """lax.switch on a value every rank agrees on."""
    branches = [
        lambda x: jaxmpi.allreduce(x, jaxmpi.MIN),
        lambda x: jaxmpi.allreduce(x, jaxmpi.MAX),
        lambda x: jaxmpi.bcast(x, 0),
    ]
    run = jax.jit(lambda i, x: lax.switch(i, branches, x))
    got = [run(i, jnp.int32(RANK + 10)) for i in range(3)]
    assert [int(v) for v in got] == [10, SIZE - 1 + 10, 10]


def test_custom_vjp():
    """A function whose forward pass and backward pass both communicate, differentiated
    under jit: d/dx sum(allreduce(x)) = SIZE on every rank."""

    @jax.custom_vjp
    def summed(x):
        return jaxmpi.allreduce(x, jaxmpi.SUM)

    def forward(x):
        return summed(x), None

    def backward(_, cotangent):
        return (jaxmpi.allreduce(cotangent, jaxmpi.SUM),)

    summed.defvjp(forward, backward)

    def loss(x):
        return jnp.sum(summed(x) * (RANK + 1.0))

    value, grad = jax.jit(jax.value_and_grad(loss))(jnp.arange(3.0) + RANK)
    expected_value = (RANK + 1.0) * np.sum(np.arange(3.0) * SIZE + rank_sum())
    # d loss_r / dx_r = allreduce over ranks of the cotangents (RANK + 1)
    expected_grad = np.full(3, SIZE * (SIZE + 1) / 2)
    assert_array(value, np.float64(expected_value), "value")
    assert_array(grad, expected_grad, "grad")


def test_checkpoint():
    """A rematerialized block containing an allreduce (of a value not differentiated):
    the backward pass runs it again, the same number of times on every rank."""

    def block(x):
        scale = jaxmpi.allreduce(lax.stop_gradient(x), jaxmpi.SUM)
        return jnp.sin(x) * scale

    def loss(x):
        return jnp.sum(jax.checkpoint(block)(x))

    x = jnp.arange(3.0) + RANK
    grad = jax.jit(jax.grad(loss))(x)
    scale = np.arange(3.0) * SIZE + rank_sum()
    np.testing.assert_allclose(np.asarray(grad), np.cos(np.asarray(x)) * scale, rtol=1e-12)


def test_nested_jit_and_repeated_calls():
    inner = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM))
    outer = jax.jit(lambda x: inner(inner(x)) + jaxmpi.bcast(x, 0))
    got = [outer(jnp.int64(RANK + 1)) for _ in range(3)]
    expected = SIZE * (SIZE * (SIZE + 1) // 2) + 1
    assert [int(v) for v in got] == [expected] * 3


def test_many_independent_collectives_in_one_program():
    """Twelve collectives whose inputs and outputs do not depend on each other, with
    different roots and kinds. XLA may run independent operations in any order; if two
    ranks ran them in different orders, the results would be mixed up or the job would
    hang."""
    roots = [k % SIZE for k in range(4)]

    @jax.jit
    def run(x):
        results = []
        for k, root in enumerate(roots):
            results.append(jaxmpi.bcast(x + 100 * k, root))
            results.append(jaxmpi.allgather(x + 100 * k))
            results.append(jaxmpi.reduce(x + 100 * k, jaxmpi.MAX, root))
        return results

    got = run(jnp.int32(RANK))
    ranks = np.arange(SIZE, dtype=np.int32)
    for k, root in enumerate(roots):
        bcasted, allgathered, reduced = got[3 * k : 3 * k + 3]
        assert_array(bcasted, np.int32(root + 100 * k), f"bcast {k}")
        assert_array(allgathered, ranks + 100 * k, f"allgather {k}")
        expected_reduced = SIZE - 1 + 100 * k if RANK == root else RANK + 100 * k
        assert_array(reduced, np.int32(expected_reduced), f"reduce {k}")


def test_eager_and_jit_calls_interleaved():
    """Eager calls (one dispatch each, asynchronous) and jitted calls, alternating."""
    jitted = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM))
    values = []
    for k in range(6):
        x = jnp.int32(RANK + k)
        values.append(jitted(x) if k % 2 else jaxmpi.allreduce(x, jaxmpi.SUM))
    assert [int(v) for v in values] == [rank_sum() + SIZE * k for k in range(6)]
