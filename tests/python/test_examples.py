"""The issue's seed examples and the README example, as tests. They run on any number of
ranks; the comments give the values on the rank counts the examples were written for."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import RANK, SIZE, assert_array, needs_ranks, partner_or_skip

# The README's examples, as the docs run them; their MPI calls are tested elsewhere.
pytestmark = [pytest.mark.same_on_every_mpi, pytest.mark.same_at_every_size]


def test_allreduce_of_ranks():
    """Every rank contributes its rank; everybody gets 0 + 1 + ... + (SIZE - 1)
    (6 on 4 ranks)."""
    total = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM))(jnp.float32(RANK))
    assert float(total) == SIZE * (SIZE - 1) / 2


@needs_ranks(2)
def test_send_recv_swap():
    """Two ranks swap arrays with send and recv (on 2 ranks: rank 0 ends up with rank 1's
    array and vice versa); larger jobs swap in pairs (0, 1), (2, 3), ..."""
    partner = partner_or_skip()
    mine = jnp.full(3, float(RANK), jnp.float32)

    @jax.jit
    def swap(x):
        if RANK < partner:
            jaxmpi.send(x, partner)
            return jaxmpi.recv(x, partner)
        received = jaxmpi.recv(x, partner)
        jaxmpi.send(x, partner)
        return received

    assert_array(swap(mine), np.full(3, float(partner), np.float32))


def test_readme_example():
    """README.md's example: an allreduce and a ring shift in one jitted step (ci/docs.sh runs
    the README's own copy, the start page's first example)."""

    @jax.jit
    def step(x):
        total = jaxmpi.allreduce(x, jaxmpi.SUM)
        left = jaxmpi.sendrecv(x, x, source=(RANK - 1) % SIZE, dest=(RANK + 1) % SIZE)
        return total, left

    total, left = step(jnp.full(3, float(RANK), jnp.float32))
    assert_array(total, np.full(3, SIZE * (SIZE - 1) / 2, np.float32), "total")
    assert_array(left, np.full(3, (RANK - 1) % SIZE, np.float32), "left")


def test_import_as_mpi4jax():
    """Existing programs do `import jaxmpi as mpi4jax`: every mpi4jax 0.9 name exists."""
    import jaxmpi as mpi4jax

    names = [
        "allgather", "allreduce", "alltoall", "barrier", "bcast", "gather", "recv",
        "reduce", "scan", "scatter", "send", "sendrecv", "has_cuda_support",
    ]  # fmt: skip
    missing = [name for name in names if not callable(getattr(mpi4jax, name, None))]
    assert not missing
