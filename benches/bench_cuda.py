"""GPU benchmark (2 ranks): sendrecv/allreduce bandwidth on device arrays, 1-256 MiB, against
two bounds measured in the same run, on both ranks at once as the ops run:
- pinned PCIe: a device->pinned host copy and back (what the staged path must do at least);
- device copy: an on-device elementwise copy (what the direct path's copies cost at least);
and the same ops through mpi4jax where it is importable with CUDA support (in the same mode:
device pointers when jaxmpi passes them, host copies otherwise). Prints a Markdown table.
Every figure is the best of REPEATS timed runs after a warm-up. Run by ci/gpu_run.sh, at the
sizes JAXMPI_BENCH_MIB lists (default 1 4 16 64 256); with JAXMPI_TEST_STANDIN=cpu (its dry
run) on the CPU, which checks the script, not the figures."""

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi
from jaxmpi import COMM_WORLD as comm

REPEATS = 5
NO_GPU_EXIT = 3  # ci/gpu_run.sh reads it as "nothing measured: no GPU"


def _gpu():
    if os.environ.get("JAXMPI_TEST_STANDIN") == "cpu":
        return jax.devices("cpu")[0]
    if not jaxmpi.has_cuda_support():
        return None
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


rank, size = comm.Get_rank(), comm.Get_size()
gpu = _gpu()
if gpu is None:
    if rank == 0:
        print(
            "bench_cuda: needs a CUDA GPU, and this process has none (jaxlib without CUDA, "
            "JAX_PLATFORMS without cuda, or no driver; see `python -m jaxmpi info`): "
            "nothing measured",
            file=sys.stderr,
        )
    sys.exit(NO_GPU_EXIT)

# Like for like: mpi4jax stages through the host unless told that the MPI is CUDA-aware.
os.environ.setdefault(
    "MPI4JAX_USE_CUDA_MPI", "1" if jaxmpi._runtime.library.info["cuda_aware"] else "0"
)
try:
    import mpi4jax
    from mpi4py import MPI
except Exception as err:
    # built against the packed MPICH, mpi4jax will not run over Intel MPI)
    mpi4jax, no_mpi4jax = None, f"mpi4jax is not importable ({str(err).splitlines()[0]})"
else:
    no_mpi4jax = None if mpi4jax.has_cuda_support() else "mpi4jax is built without CUDA"
    mpi4jax = None if no_mpi4jax else mpi4jax


def best(fn, *args):
    """Seconds of the fastest of REPEATS runs of fn(*args), all ranks starting together."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(REPEATS):
        comm.Barrier()
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def memory(kind):
    """The GPU's memory of that kind, as a sharding over a mesh of that one device: every
    JAX from 0.6.2 takes it (SingleDeviceSharding is deprecated from 0.12.1)."""
    mesh = jax.sharding.Mesh(np.array([gpu]), ("gpu",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(), memory_kind=kind)


def host_round_trip():
    """A device->host->device copy, through pinned memory where this JAX offers it."""
    try:
        pinned, on_gpu = memory("pinned_host"), memory("device")
        jax.device_put(jnp.ones(4), pinned).block_until_ready()
    except (ValueError, RuntimeError, NotImplementedError) as err:
        cpu = jax.devices("cpu")[0]
        why = f"pageable host memory (no pinned_host memory kind: {err})"
        return (lambda a: jax.device_put(jax.device_put(a, cpu), gpu)), why
    return (lambda a: jax.device_put(jax.device_put(a, pinned), on_gpu)), "pinned host memory"


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
round_trip, host_kind = host_round_trip()
device_copy = jax.jit(lambda a: a + 1.0)  # reads and writes every byte once, as a copy does

rows = []
for mib in [int(m) for m in os.environ.get("JAXMPI_BENCH_MIB", "1 4 16 64 256").split()]:
    nbytes = mib << 20
    x = jax.device_put(jnp.ones(nbytes // 4, jnp.float32), gpu)
    pcie, dcopy = best(round_trip, x), best(device_copy, x)
    for name, fn in ops.items():
        t = best(fn, x)
        theirs = best(mpi4jax_ops[name], x) if mpi4jax_ops else None
        rows.append(
            (name, mib, nbytes / t, nbytes / pcie, nbytes / dcopy, theirs and nbytes / theirs)
        )
if rank == 0:
    mode = jaxmpi._runtime.gpu.cuda["mode"] or "the CPU standing in (figures meaningless)"
    print(f"mode: {mode}; {size} ranks on {gpu.device_kind}")
    print(f"PCIe bound: device -> {host_kind} -> device; device bound: a + 1 on the GPU")
    if no_mpi4jax:
        print(f"mpi4jax columns left out: {no_mpi4jax}")
    else:
        print(f"mpi4jax with MPI4JAX_USE_CUDA_MPI={os.environ['MPI4JAX_USE_CUDA_MPI']}")
    head = "| op | MiB | GB/s | PCIe bound GB/s | / PCIe | device copy GB/s | / device |"
    rule = "|---|---|---|---|---|---|---|"
    if not no_mpi4jax:
        head += " mpi4jax GB/s | jaxmpi / mpi4jax |"
        rule += "---|---|"
    print(head)
    print(rule)
    for name, mib, bw, pcie, dcopy, theirs in rows:
        line = f"| {name} | {mib} | {bw / 1e9:.2f} | {pcie / 1e9:.2f} | {bw / pcie:.2f} |"
        line += f" {dcopy / 1e9:.2f} | {bw / dcopy:.2f} |"
        if theirs is not None:
            line += f" {theirs / 1e9:.2f} | {bw / theirs:.2f} |"
        print(line)
