"""GPU benchmark (2 ranks): sendrecv/allreduce bandwidth on device arrays, 1-256 MiB, versus
the pinned host<->device copy bound measured in the same run. Prints a Markdown table."""

import time

import jax
import jax.numpy as jnp
import jaxmpi
import numpy as np
from jaxmpi import COMM_WORLD as comm

rank, size = comm.Get_rank(), comm.Get_size()
gpu = jax.devices("gpu")[0]


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


ops = {
    "sendrecv": jax.jit(lambda a: jaxmpi.sendrecv(a, a, source=(rank + 1) % size,
                                                  dest=(rank + 1) % size, comm=comm)),
    "allreduce": jax.jit(lambda a: jaxmpi.allreduce(a, jaxmpi.SUM, comm=comm)),
}
rows = []
for mib in (1, 4, 16, 64, 256):
    nbytes = mib << 20
    x = jax.device_put(jnp.ones(nbytes // 4, jnp.float32), gpu)
    bound = copy_bound(nbytes)
    for name, fn in ops.items():
        t = best(fn, x)
        rows.append((name, mib, nbytes / t / 1e9, nbytes / bound / 1e9, bound / t))
if rank == 0:
    print(f"mode: {jaxmpi._runtime.cuda['mode']}")
    print("| op | MiB | GB/s | copy bound GB/s | ratio (target >= 0.8) |")
    print("|---|---|---|---|---|")
    for name, mib, bw, cb, ratio in rows:
        print(f"| {name} | {mib} | {bw:.2f} | {cb:.2f} | {ratio:.2f} |")
