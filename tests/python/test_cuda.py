"""Every op on CUDA device arrays under jit, compared with the same op on CPU arrays.
Runs at 2 ranks sharing one GPU (ci/gpu_run.sh); skipped where jaxmpi has no GPU to use."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import needs_gpu
from jaxmpi import COMM_WORLD as comm

pytestmark = needs_gpu

rank, size = comm.Get_rank(), comm.Get_size()

OPS = {
    "allreduce": lambda x: jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm),
    "reduce": lambda x: jaxmpi.reduce(x, jaxmpi.SUM, root=0, comm=comm),
    "scan": lambda x: jaxmpi.scan(x, jaxmpi.SUM, comm=comm),
    "bcast": lambda x: jaxmpi.bcast(x, root=0, comm=comm),
    "allgather": lambda x: jaxmpi.allgather(x, comm=comm),
    "gather": lambda x: jaxmpi.gather(x, root=0, comm=comm),
    "alltoall": lambda x: jaxmpi.alltoall(jnp.stack([x] * size), comm=comm),
    "scatter": lambda x: jaxmpi.scatter(jnp.stack([x] * size), root=0, comm=comm),
    "sendrecv": lambda x: jaxmpi.sendrecv(
        x, x, source=(rank - 1) % size, dest=(rank + 1) % size, comm=comm
    ),
}


def _on(platform, fn, x):
    device = jax.devices(platform)[0]
    return np.asarray(jax.jit(fn)(jax.device_put(x, device)))


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("n", [1, 1000, 3 << 20])  # the largest spans several staging chunks
def test_op_on_gpu_equals_cpu(name, n):
    x = jnp.arange(n, dtype=jnp.float32) * (rank + 1)
    np.testing.assert_array_equal(_on("gpu", OPS[name], x), _on("cpu", OPS[name], x))


def test_send_recv_on_gpu():
    x = jax.device_put(jnp.full(1000, rank, jnp.float32), jax.devices("gpu")[0])
    if rank == 0:
        jax.jit(lambda a: jaxmpi.send(a, dest=1, comm=comm))(x)
    elif rank == 1:
        got = jax.jit(lambda a: jaxmpi.recv(a, source=0, comm=comm))(x)
        np.testing.assert_array_equal(np.asarray(got), np.zeros(1000, np.float32))


def test_non_blocking_ops_refuse_gpu_arrays_at_trace_time():
    """Not built for device memory yet: a clear refusal naming the op, before any MPI."""
    x = jax.device_put(jnp.ones(8, jnp.float32), jax.devices("gpu")[0])

    def exchange(a):
        request = jaxmpi.irecv(a, source=(rank - 1) % size, comm=comm)
        return jaxmpi.wait(request)

    with pytest.raises(NotImplementedError, match=r"jaxmpi\.irecv: non-blocking transfers of GPU"):
        jax.jit(exchange)(x)
