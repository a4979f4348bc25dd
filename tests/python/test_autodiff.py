"""Derivatives of every op, checked across ranks in float64.

Forward mode: the JVP must match central finite differences in which every rank perturbs
its own input at once (a distributed function has one input: all ranks' arrays).
Reverse mode: the transpose must be the adjoint across ranks,
sum_r <ct_r, (J v)_r> == sum_r <(J^T ct)_r, v_r>.
allreduce-SUM keeps mpi4jax's convention instead (its transpose is the identity on each
rank: every rank holds the same, replicated loss), checked on its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import MPI, RANK, SIZE, assert_array, needs_ranks

# Derivatives come from the ops' rules, whatever the MPI; the number of ranks enters.
pytestmark = pytest.mark.same_on_every_mpi

LEFT, RIGHT = (RANK - 1) % SIZE, (RANK + 1) % SIZE
USER_OP = None if MPI is None else MPI.Op.Create(lambda a, b, t: None, commute=True)
LAST = SIZE - 1
COUNTS = tuple(range(1, SIZE + 1))  # rows per rank for the v-variants


def global_sum(value) -> float:
    """A sum over ranks of a local number (plain communication, not differentiated)."""
    return float(jaxmpi.allreduce(jnp.asarray(value, jnp.float64), jaxmpi.SUM))


def check_derivatives(f, x, *, reverse=True, eps=1e-6, tol=1e-7):
    rng = np.random.default_rng(1234 + RANK)
    v = jnp.asarray(rng.standard_normal(np.shape(x)))
    y, jv = jax.jvp(f, (x,), (v,))
    numeric = (f(x + eps * v) - f(x - eps * v)) / (2 * eps)
    error = global_sum(jnp.max(jnp.abs(numeric - jv)) if jv.size else 0.0)
    assert error < 1e-5, f"forward mode differs from finite differences by {error}"
    if reverse:
        ct = jnp.asarray(rng.standard_normal(np.shape(y)))
        (xbar,) = jax.vjp(f, x)[1](ct)
        lhs, rhs = global_sum(jnp.vdot(ct, jv)), global_sum(jnp.vdot(xbar, v))
        assert abs(lhs - rhs) <= tol * max(1.0, abs(lhs)), (
            f"<ct, Jv> = {lhs} but <J^T ct, v> = {rhs}"
        )


def data(shape=(3,)):
    return jnp.asarray(
        np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * (RANK + 1) + RANK
    )


def block_data():
    """One row per rank, for ops that split the leading axis by rank."""
    return data((SIZE, 2))


def send_recv_pair(x):
    """Rank 0 sends 2x to rank 1, which returns 3 * what it received; the others pass x."""
    if RANK == 0:
        jaxmpi.send(x * 2, 1)
        return x
    if RANK == 1:
        return jaxmpi.recv(x, 0) * 3
    return x


LINEAR_CASES = {
    "reduce SUM to 0": (lambda x: jaxmpi.reduce(x, jaxmpi.SUM, 0), data),
    "reduce SUM to last": (lambda x: jaxmpi.reduce(x, jaxmpi.SUM, LAST), data),
    "scan SUM": (lambda x: jaxmpi.scan(x, jaxmpi.SUM), data),
    "exscan SUM": (lambda x: jaxmpi.exscan(x, jaxmpi.SUM), data),
    "reduce_scatter SUM": (lambda x: jaxmpi.reduce_scatter(x, jaxmpi.SUM), block_data),
    "bcast from last": (lambda x: jaxmpi.bcast(x, LAST), data),
    "gather to 0": (lambda x: jaxmpi.gather(x, 0), data),
    "allgather": (jaxmpi.allgather, data),
    "scatter from 0": (
        lambda x: jaxmpi.scatter(x, 0),
        lambda: block_data() if RANK == 0 else data((2,)),
    ),
    "alltoall": (jaxmpi.alltoall, block_data),
    "gatherv to last": (
        lambda x: jaxmpi.gatherv(x, COUNTS, LAST),
        lambda: data((COUNTS[RANK], 2)),
    ),
    "allgatherv": (lambda x: jaxmpi.allgatherv(x, COUNTS), lambda: data((COUNTS[RANK], 2))),
    "scatterv from 0": (
        lambda x: jaxmpi.scatterv(x, COUNTS, 0),
        lambda: data((sum(COUNTS) if RANK == 0 else COUNTS[RANK], 2)),
    ),
    "alltoallv": (
        lambda x: jaxmpi.alltoallv(x, COUNTS, (RANK + 1,) * SIZE),
        lambda: data((sum(COUNTS), 2)),
    ),
    "sendrecv ring": (lambda x: jaxmpi.sendrecv(x, x, source=LEFT, dest=RIGHT), data),
    "send/recv pair": (send_recv_pair, data),
}


@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_linear_ops_forward_and_reverse(case):
    if case == "send/recv pair" and SIZE < 2:
        pytest.skip("needs at least 2 MPI ranks")
    f, make_input = LINEAR_CASES[case]
    check_derivatives(f, make_input())


@pytest.mark.parametrize("op", ["MIN", "MAX", "PROD"])
def test_reduce_through_min_max_prod(op):
    check_derivatives(lambda x: jaxmpi.reduce(x, getattr(jaxmpi, op), LAST), data())


@pytest.mark.parametrize("op", ["MIN", "MAX", "PROD"])
def test_allreduce_min_max_prod_forward(op):
    """Forward mode: the selected elements' (or the other factors') tangents."""
    check_derivatives(lambda x: jaxmpi.allreduce(x, getattr(jaxmpi, op)), data(), reverse=False)


def test_allreduce_max_gradient_goes_to_the_rank_holding_the_max():
    """Replicated loss sum(allreduce(x, MAX)): the last rank holds every maximum here."""
    grad = jax.grad(lambda x: jnp.sum(jaxmpi.allreduce(x, jaxmpi.MAX)))(data())
    assert_array(grad, np.full(3, 1.0 if RANK == LAST else 0.0))


def test_ties_share_the_derivative_equally():
    grad = jax.grad(lambda x: jnp.sum(jaxmpi.allreduce(x, jaxmpi.MIN)))(jnp.ones(3))
    assert_array(grad, np.full(3, 1.0 / SIZE))


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_grad_of_allreduce_sum_uses_the_identity_transpose(mode):
    """mpi4jax's convention: d/dx sum(allreduce(x)**2) = 2 * allreduce(x) on each rank."""

    def loss(x):
        return jnp.sum(jaxmpi.allreduce(x, jaxmpi.SUM) ** 2)

    grad = jax.grad(loss) if mode == "eager" else jax.jit(jax.grad(loss))
    total = sum(np.arange(3.0) * (r + 1) + r for r in range(SIZE))
    assert_array(grad(data()), 2 * total)


def test_double_transpose_gives_allreduce_back():
    x = data()
    transpose = jax.linear_transpose(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM), x)
    assert_array(transpose(x)[0], x, "transpose (identity)")
    twice = jax.linear_transpose(lambda ct: transpose(ct)[0], x)
    assert_array(twice(x)[0], jaxmpi.allreduce(x, jaxmpi.SUM), "transpose of the transpose")


@pytest.mark.parametrize(
    "f, message",
    [
        (lambda x: jaxmpi.allreduce(x, USER_OP), "a user-defined op has no derivative"),
        (lambda x: jaxmpi.scan(x, jaxmpi.MAX), "op=SUM only, not MAX"),
        (lambda x: jaxmpi.recv(x), "ANY_SOURCE"),
    ],
    ids=["allreduce with a user op", "scan MAX", "recv from ANY_SOURCE"],
)
def test_ops_without_a_derivative_say_so(f, message):
    if USER_OP is None and "user" in message:
        pytest.skip("needs mpi4py to create a user-defined op")
    with pytest.raises(NotImplementedError, match=message):
        jax.jvp(f, (data(),), (data(),))


def test_distributed_dot_product():
    """Each rank holds a slice of x and y; the dot product is one allreduce. Its gradient
    with respect to the local slice of x is the local slice of y."""
    x, y = data(), data() * 0.5 + 1
    grad = jax.grad(lambda x: jaxmpi.allreduce(jnp.vdot(x, y), jaxmpi.SUM))(x)
    assert_array(grad, y)


def test_distributed_matvec():
    """A (SIZE*2, SIZE*2) matrix split by rows, x split alike: y_local = A_local @ x_full,
    with x_full = allgather(x). The gradient of the sum of all y, with respect to each
    rank's x, is the column sums of A restricted to that rank's entries."""
    n = 2 * SIZE
    a_full = np.arange(n * n, dtype=np.float64).reshape(n, n) / n
    rows = a_full[2 * RANK : 2 * RANK + 2]
    x = jnp.asarray(np.arange(2.0) + 2 * RANK)

    def total(x):
        y = jnp.asarray(rows) @ jaxmpi.allgather(x).reshape(-1)
        return jaxmpi.allreduce(jnp.sum(y), jaxmpi.SUM)

    grad = jax.grad(total)(x)
    assert_array(grad, a_full.sum(axis=0)[2 * RANK : 2 * RANK + 2])
    check_derivatives(lambda x: jnp.asarray(rows) @ jaxmpi.allgather(x).reshape(-1), x)


@needs_ranks(2)
def test_halo_exchange_inside_grad_matches_the_serial_gradient():
    """A periodic 1-D diffusion step, the domain split over ranks with one halo cell on each
    side exchanged by sendrecv; the gradient of the global energy after 3 steps equals the
    gradient of the same computation on the whole array in one process."""
    cells = 4
    full = np.sin(np.arange(cells * SIZE, dtype=np.float64))

    def step_serial(u):
        return u + 0.1 * (jnp.roll(u, 1) + jnp.roll(u, -1) - 2 * u)

    def step_local(u):
        left_halo = jaxmpi.sendrecv(u[-1:], u[-1:], source=LEFT, dest=RIGHT)
        right_halo = jaxmpi.sendrecv(u[:1], u[:1], source=RIGHT, dest=LEFT)
        padded = jnp.concatenate([left_halo, u, right_halo])
        return u + 0.1 * (padded[:-2] + padded[2:] - 2 * u)

    def energy_local(u):
        for _ in range(3):
            u = step_local(u)
        return jaxmpi.allreduce(jnp.sum(u**2), jaxmpi.SUM)

    def energy_serial(u):
        for _ in range(3):
            u = step_serial(u)
        return jnp.sum(u**2)

    mine = jnp.asarray(full[cells * RANK : cells * (RANK + 1)])
    grad = jax.jit(jax.grad(energy_local))(mine)
    expected = jax.grad(energy_serial)(jnp.asarray(full))[cells * RANK : cells * (RANK + 1)]
    np.testing.assert_allclose(np.asarray(grad), np.asarray(expected), rtol=1e-12, atol=1e-14)
