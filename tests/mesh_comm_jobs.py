"""Jobs for tests/mesh_comm_jobs.sh: jaxmpi's ops on a MeshComm over every device of the
job, whatever the devices per process (XLA_FLAGS sets them), one case per run.

    debug   an allreduce and a sendrecv; JAXMPI_DEBUG's lines name each call's MeshComm
            rank and device
    stuck   process 1 never runs the program: process 0's devices wait for its ranks until
            JAXMPI_TIMEOUT ends the job, naming the op and where it waits
    serialized  MPI initialized (by mpi4py) at MPI_THREAD_SERIALIZED: several devices of
            a process, each calling MPI from its own thread, are refused, naming the level
    beside_psum  a MeshComm allreduce and JAX's psum in one jitted loop of 100 steps, on the
            route COLLECTIVES names (jaxmpi's pass, the default, or gloo): prints
            "BESIDE right" or what it got
"""

from __future__ import annotations

import os
import sys

case = sys.argv[1]
if case == "serialized":  # before jaxmpi, which would initialize MPI at MULTIPLE
    import mpi4py

    mpi4py.rc.thread_level = "serialized"
    from mpi4py import MPI  # noqa: F401  (initializes MPI at that level)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxmpi  # noqa: E402
from jaxmpi import distributed  # noqa: E402

try:
    from jax import shard_map

    UNCHECKED = {"check_vma": False}
except ImportError:  # JAX before 0.7
    from jax.experimental.shard_map import shard_map

    UNCHECKED = {"check_rep": False}

if jaxmpi.COMM_WORLD.Get_size() > 1:
    distributed.initialize(collectives=os.environ.get("COLLECTIVES", "auto"))
devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
mesh = Mesh(np.array(devices), ("i",))
comm = jaxmpi.MeshComm(mesh)
n = len(devices)


def body(x):
    x = jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm)
    return jaxmpi.sendrecv(x, x, lambda r: (r - 1) % n, lambda r: (r + 1) % n, comm=comm)


def beside_psum(x):
    def step(k, v):
        return jaxmpi.allreduce(v, jaxmpi.SUM, comm=comm) / n + jax.lax.psum(v, "i") / n - v

    return jax.lax.fori_loop(0, 100, step, x)


if case == "beside_psum":
    body = beside_psum
f = jax.jit(shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), **UNCHECKED))
x = jax.make_array_from_callback(
    (n,), NamedSharding(mesh, P("i")), lambda i: np.arange(n, dtype=np.float32)[i]
)
if case == "stuck" and jax.process_index() == 1:
    sys.exit(0)  # never runs the program
try:
    y = jax.block_until_ready(f(x))
except Exception as err:  # the refusal, on every process
    print(f"process {jax.process_index()} REFUSED: {err}")
    sys.exit(0)
print(f"process {jax.process_index()}: {np.asarray(y.addressable_shards[0].data).tolist()}")
if case == "beside_psum":  # each step makes v 2 * mean - v: after an even number, v again
    want = np.arange(n, dtype=np.float32)
    got = np.concatenate([np.asarray(s.data) for s in y.addressable_shards])
    mine = np.concatenate([want[s.index] for s in y.addressable_shards])
    ok = np.allclose(got, mine, atol=1e-4)
    from jaxmpi._binding import jax_collectives

    route = jax_collectives.chosen[0]
    print(f"BESIDE {'right' if ok else 'WRONG'} on {route}, process {jax.process_index()}: {got}")
