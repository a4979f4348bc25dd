"""Messages of more than 2^31 - 1 elements (int8, so they fit in memory): MPI-4 large-count
functions where the library has them, derived datatypes and segmented reductions where it
does not. Each rank needs about 8 GiB, so these run only when JAXMPI_TEST_LARGE=1
(./ci/test.sh does that on 2 ranks of one MPI of each kind)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import RANK, SIZE

N = 2**31 + 13

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("JAXMPI_TEST_LARGE") != "1", reason="set JAXMPI_TEST_LARGE=1"
    ),
    pytest.mark.skipif(SIZE != 2, reason="written for 2 ranks"),
    pytest.mark.large_messages,
]


def samples(a) -> np.ndarray:
    """A few positions around the 2^31 boundary and the segment edges, and the ends."""
    index = np.array([0, 1, 2**30 - 1, 2**30, 2**31 - 2, 2**31 - 1, 2**31, N - 1])
    return np.asarray(a[index])


def test_allreduce_of_more_than_2_31_elements():
    x = jnp.full(N, RANK + 1, jnp.int8)
    total = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM))(x)
    assert total.shape == (N,)
    assert (samples(total) == 3).all()


def test_send_recv_of_more_than_2_31_elements():
    if RANK == 0:
        payload = np.resize(np.arange(256, dtype=np.uint8), N).view(np.int8)  # i % 256
        jaxmpi.send(payload, 1, tag=5)
        del payload
    else:
        received = jaxmpi.recv(jnp.zeros(N, jnp.int8), 0, tag=5)
        index = np.array([0, 2**31 - 1, 2**31, N - 1])
        assert (np.asarray(received[index]) == (index % 256).astype(np.int8)).all()
