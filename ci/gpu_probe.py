"""ci/gpu_probe.py -- what the GPU run finds before it tests anything, one JSON file per rank.

usage: mpiexec -n N python ci/gpu_probe.py OUTDIR

Each rank writes OUTDIR/rank<R>.json: `python -m jaxmpi info`'s lines; the CUDA side as
jaxmpi found it (driver file and version, every libcuda mapped in the process, the GPU
chosen for this rank, by which rule and whether before MPI_Init); and what the CUDA driver
says of buffers JAX allocated (legacy CUDA IPC capability, handle types, memory pool),
with what jaxmpi does with each under this run's JAXMPI_CUDA_AWARE and why. Run with it
unset, this is what `auto` decides on this machine's allocator; ci/gpu_run.sh reads the
legacy CUDA IPC answer (gpu_verdict.py ipc) to set up Intel MPI for its direct leg. Also
the environment that steered it (JAXMPI_*, I_MPI_*, JAX's and XLA's variables).

A diagnostic: it records what fails instead of failing, and exits 0 whatever it found
(ci/gpu_verdict.py probe reads the files and never fails the run on them).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path


def attempt(found: dict, name: str, fn) -> None:
    try:
        found[name] = fn()
    except Exception as err:  # a diagnostic: every failure is a finding
        found[name] = f"ERROR {type(err).__name__}: {err}"
        found.setdefault("tracebacks", {})[name] = traceback.format_exc()


def buffers(jax, jnp, device, native) -> dict:
    """The driver's view of JAX buffers of a few sizes (allocators switch with size)."""
    seen = {}
    for mib in (1, 64):
        x = jax.device_put(jnp.zeros((mib << 20) // 4, jnp.float32), device)
        x.block_until_ready()
        seen[f"{mib} MiB"] = dict(native.cuda_buffer(x.unsafe_buffer_pointer()))
    return seen


def main(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    steering = ("JAXMPI_", "I_MPI_", "MPI4PY_", "JAX_", "XLA_", "CUDA_VISIBLE_DEVICES")
    found: dict = {
        "rank": None,
        "env": {k: v for k, v in os.environ.items() if k.startswith(steering)},
    }
    try:
        import jax
        import jax.numpy as jnp

        import jaxmpi
        from jaxmpi import _native
        from jaxmpi.__main__ import info_lines
    except Exception as err:
        found["import"] = f"ERROR {type(err).__name__}: {err}"
        found["tracebacks"] = {"import": traceback.format_exc()}
        rank = 0
    else:
        rank = jaxmpi.COMM_WORLD.Get_rank()
        found["rank"] = rank
        attempt(found, "info", info_lines)
        cuda = jaxmpi._runtime.gpu.cuda
        found["cuda"] = dict(cuda)
        library = jaxmpi._runtime.library.info
        found["cuda_aware"] = {
            k: library[k] for k in ("cuda_aware", "cuda_aware_reason", "cuda_aware_checks_buffers")
        }
        attempt(found, "jax_devices", lambda: [str(d) for d in jax.devices()])
        if cuda["driver"]:
            gpu = lambda: jax.devices("gpu")[0]  # noqa: E731  (raises inside `attempt`)
            attempt(found, "buffers", lambda: buffers(jax, jnp, gpu(), _native))
            # Again, now that JAX's client and the MPI have started: still one libcuda?
            attempt(found, "driver_after", lambda: dict(_native.cuda_info()))
        found["counters"] = dict(_native.gpu_counters())
    path = folder / f"rank{rank}.json"
    path.write_text(json.dumps(found, indent=1, default=str))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
