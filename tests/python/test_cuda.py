"""Every op on CUDA device arrays under jit, compared with the same op on CPU arrays; and
what the paths added beside the ops do on a GPU machine: JAX's own collectives over MPI
(refused: XLA runs a GPU process's collectives over NCCL), jaxlib loading jaxmpi's MPI
plug-in beside its CUDA plugin, and an mpi4jax 0.7 token program on device arrays.
Runs at 2 ranks sharing one GPU (ci/gpu_run.sh); skipped where jaxmpi has no GPU to use."""

import os

import _jaxmpi_startup
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_mpi4jax_name import presenting  # noqa: F401  (a fixture)

import jaxmpi
from helpers import needs_gpu
from jaxmpi import COMM_WORLD as comm
from jaxmpi import _native
from jaxmpi._binding import xla_collectives as _xla_collectives

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


def test_jax_collectives_over_mpi_are_refused_on_gpus():
    """Before anything starts: no jax.distributed, no MPI call."""
    with pytest.raises(RuntimeError, match="on GPUs, whose collectives XLA runs over NCCL"):
        jaxmpi.distributed.initialize(collectives="mpi")
    implementation, why = _xla_collectives.choose("auto")
    assert (implementation, "NCCL" in why) == ("gloo", True), why


def test_jaxlib_loads_the_plugin_beside_its_cuda_plugin():
    """As from an installed wheel: the startup hook ran at this process's start (ci/gpu_run.sh
    processes the wheel's .pth), and jaxlib either loaded jaxmpi's MPI plug-in at `import jax`
    -- the GPU ops above ran with it loaded -- or is a release the plug-in was not checked
    against, where the hook must leave MPITRAMPOLINE_LIB unset."""
    if _jaxmpi_startup.checked_jaxlib():
        assert os.environ.get("MPITRAMPOLINE_LIB") == _xla_collectives.plugin_path()
        assert _native.xla_plugin_loaded()
    else:
        assert "MPITRAMPOLINE_LIB" not in os.environ


def test_an_mpi4jax_0_7_token_program_on_gpu(presenting):  # noqa: F811
    mpi4jax = presenting("0.7.2")
    source, dest = (rank - 1) % size, (rank + 1) % size

    def step(a):
        token = jax.lax.create_token()
        total, token = mpi4jax.allreduce(a, op=jaxmpi.SUM, comm=comm, token=token)
        swapped, token = mpi4jax.sendrecv(a, a, source, dest, comm=comm, token=token)
        token = mpi4jax.barrier(comm=comm, token=token)
        return total, swapped

    x = jnp.arange(1000, dtype=jnp.float32) * (rank + 1)
    on_gpu = jax.jit(step)(jax.device_put(x, jax.devices("gpu")[0]))
    on_cpu = jax.jit(step)(jax.device_put(x, jax.devices("cpu")[0]))
    assert all(r.devices() == {jax.devices("gpu")[0]} for r in on_gpu)
    for got, want in zip(on_gpu, on_cpu):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
