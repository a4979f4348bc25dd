"""Derivatives and batching with mpi4jax 0.9's conventions: allreduce-SUM (forward and
reverse; its transpose is the identity on each rank), sendrecv (forward and reverse: the
cotangent travels back), and vmap of allreduce, sendrecv and barrier as ONE MPI call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxmpi
import numpy as np
import pytest
from conftest import RANK, SIZE, assert_array, needs_ranks

LEFT, RIGHT = (RANK - 1) % SIZE, (RANK + 1) % SIZE


def mine(rank: int = RANK) -> jnp.ndarray:
    return jnp.arange(3.0, dtype=jnp.float64) + rank


def total() -> np.ndarray:
    return sum(np.arange(3.0) + r for r in range(SIZE))


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_grad_of_allreduce_sum_uses_the_identity_transpose(mode):
    """d/dx sum(allreduce(x)**2) = 2 * allreduce(x) on each rank: the cotangent is not
    summed again (mpi4jax's convention)."""

    def loss(x):
        return jnp.sum(jaxmpi.allreduce(x, jaxmpi.SUM) ** 2)

    grad = jax.grad(loss) if mode == "eager" else jax.jit(jax.grad(loss))
    assert_array(grad(mine()), 2 * total())


def test_jvp_and_jacfwd_of_allreduce_sum():
    primal, tangent = jax.jvp(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM), (mine(),), (jnp.ones(3),))
    assert_array(primal, total(), "primal")
    assert_array(tangent, np.full(3, float(SIZE)), "tangent")
    jacobian = jax.jacfwd(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM))(mine())
    assert_array(jacobian, np.eye(3) * SIZE, "jacobian")


def test_double_transpose_gives_allreduce_back():
    """linear_transpose of the transpose is allreduce-SUM again."""
    transpose = jax.linear_transpose(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM), mine())
    assert_array(transpose(mine())[0], mine(), "transpose (identity)")
    twice = jax.linear_transpose(lambda ct: transpose(ct)[0], mine())
    assert_array(twice(mine())[0], total(), "transpose of the transpose")


def test_derivative_of_allreduce_max_is_refused_with_the_op_named():
    with pytest.raises(NotImplementedError, match="op=SUM only, not MAX"):
        jax.grad(lambda x: jnp.sum(jaxmpi.allreduce(x, jaxmpi.MAX)))(mine())


@needs_ranks(2)
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_grad_of_sendrecv_sends_the_cotangent_back(mode):
    """Each rank weighs what it received by (rank + 1): the gradient of its own data is
    the weight of the rank it sent to."""

    def loss(x):
        received = jaxmpi.sendrecv(x, x, source=LEFT, dest=RIGHT)
        return jnp.sum(received * (RANK + 1))

    grad = jax.grad(loss) if mode == "eager" else jax.jit(jax.grad(loss))
    assert_array(grad(mine()), np.full(3, float(RIGHT + 1)))


@needs_ranks(2)
def test_jvp_of_sendrecv_moves_the_tangent_like_the_data():
    _, tangent = jax.jvp(
        lambda x: jaxmpi.sendrecv(x, x, source=LEFT, dest=RIGHT), (mine(),), (mine() * 10,)
    )
    assert_array(tangent, np.asarray(mine(LEFT)) * 10)


@pytest.mark.parametrize("in_axes", [0, 1])
def test_vmap_of_allreduce(in_axes):
    batch = jnp.stack([mine() * (b + 1) for b in range(4)], axis=in_axes)
    out = jax.vmap(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM), in_axes=in_axes)(batch)
    assert_array(out, np.stack([total() * (b + 1) for b in range(4)]))


@needs_ranks(2)
def test_vmap_of_sendrecv_with_an_unbatched_template():
    batch = jnp.stack([mine() * (b + 1) for b in range(4)], axis=1)
    out = jax.vmap(lambda v, t: jaxmpi.sendrecv(v, t, source=LEFT, dest=RIGHT), in_axes=(1, None))(
        batch, jnp.zeros(3, jnp.float64)
    )
    assert_array(out, np.stack([np.asarray(mine(LEFT)) * (b + 1) for b in range(4)]))


def test_vmap_of_barrier():
    out = jax.vmap(lambda v: (jaxmpi.barrier(), v + 1)[1])(jnp.arange(4.0))
    assert_array(out, np.arange(4.0) + 1)
