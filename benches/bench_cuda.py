"""GPU benchmark (2 ranks): sendrecv/allreduce bandwidth on device arrays, 1-256 MiB, versus
the pinned host<->device copy bound measured in the same run, and the same ops through
mpi4jax where it is importable with CUDA support (in the same mode: device pointers when
jaxmpi passes them, host copies otherwise). Prints a Markdown table."""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi
from jaxmpi import COMM_WORLD as comm

rank, size = comm.Get_rank(), comm.Get_size()
gpu = jax.devices("gpu")[0]

# Like for like: mpi4jax stages through the host unless told that the MPI is CUDA-aware.
os.environ.setdefault("MPI4JAX_USE_CUDA_MPI", "1" if jaxmpi._runtime.info["cuda_aware"] else "0")
try:
    import mpi4jax
    from mpi4py import MPI
except ImportError as err:
    mpi4jax, no_mpi4jax = None, f"mpi4jax is not importable ({err})"
else:
    no_mpi4jax = None if mpi4jax.has_cuda_support() else "mpi4jax is built without CUDA"
    mpi4jax = None if no_mpi4jax else mpi4jax


def best(fn, x, repeats=5):
    fn(x).block_until_ready()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return min(times)


def copy_bound(nbytes):
    """D2H + H2D of the message through pinned memory (what staging must do at least)."""
    x = jax.device_put(jnp.ones(nbytes // 4, jnp.float32), gpu)
    host = jax.device_put(x, jax.devices("cpu")[0])  # warm
    t0 = time.perf_counter()
    host = np.asarray(jax.device_get(x))
    jax.device_put(host, gpu).block_until_ready()
    return time.perf_counter() - t0


peer = (rank + 1) % size
ops = {
    "sendrecv": jax.jit(lambda a: jaxmpi.sendrecv(a, a, source=peer, dest=peer, comm=comm)),
    "allreduce": jax.jit(lambda a: jaxmpi.allreduce(a, jaxmpi.SUM, comm=comm)),
}
mpi4jax_ops = {}
if mpi4jax is not None:
    mpi4jax_ops = {
        "sendrecv": jax.jit(
            lambda a: mpi4jax.sendrecv(a, a, source=peer, dest=peer, comm=MPI.COMM_WORLD)
        ),
        "allreduce": jax.jit(lambda a: mpi4jax.allreduce(a, MPI.SUM, comm=MPI.COMM_WORLD)),
    }
rows = []
for mib in (1, 4, 16, 64, 256):
    nbytes = mib << 20
    x = jax.device_put(jnp.ones(nbytes // 4, jnp.float32), gpu)
    bound = copy_bound(nbytes)
    for name, fn in ops.items():
        t = best(fn, x)
        other = best(mpi4jax_ops[name], x) if mpi4jax_ops else None
        rows.append(
            (
                name,
                mib,
                nbytes / t / 1e9,
                nbytes / bound / 1e9,
                bound / t,
                None if other is None else (nbytes / other / 1e9, other / t),
            )
        )
if rank == 0:
    print(f"mode: {jaxmpi._runtime.cuda['mode']}")
    if no_mpi4jax:
        print(f"mpi4jax columns left out: {no_mpi4jax}")
    else:
        print(f"mpi4jax with MPI4JAX_USE_CUDA_MPI={os.environ['MPI4JAX_USE_CUDA_MPI']}")
    head = "| op | MiB | GB/s | copy bound GB/s | ratio (target >= 0.8) |"
    rule = "|---|---|---|---|---|"
    if not no_mpi4jax:
        head += " mpi4jax GB/s | jaxmpi speedup over mpi4jax |"
        rule += "---|---|"
    print(head)
    print(rule)
    for name, mib, bw, cb, ratio, theirs in rows:
        line = f"| {name} | {mib} | {bw:.2f} | {cb:.2f} | {ratio:.2f} |"
        if theirs is not None:
            line += f" {theirs[0]:.2f} | {theirs[1]:.2f} |"
        print(line)
