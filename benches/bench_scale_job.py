"""A job of many device ranks on one machine: P processes of L CPU devices (16 x 64 =
1,024 device ranks by default), each program a collective over them all, checked against
numpy: a psum over every device, a psum along the local axis (rows), an all-gather along
an inner dimension over the process axis, a ring ppermute over every device and a
MeshComm allreduce. Each process prints its wall time and peak RSS; the driver runs the
job once per build and mode and prints the largest of each.

    python benches/bench_scale_job.py BEFORE_DIR AFTER_DIR [--processes 16] [--local 64]
                                      [--modes fast,ordered]

Each DIR holds an installed jaxmpi (its python package with _native beside it) that goes
first on PYTHONPATH. Run with the Python of the venv whose MPI the job uses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path


def worker(local: int) -> None:
    import resource

    import jax
    import numpy as np
    from jax import shard_map
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxmpi
    from jaxmpi import distributed

    t0 = time.perf_counter()
    distributed.initialize(collectives="jaxmpi")
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    processes = len(devices) // local
    n = len(devices)
    grid = Mesh(np.array(devices).reshape(processes, local), ("p", "l"))
    line = Mesh(np.array(devices), ("i",))
    x = (np.arange(n * 4, dtype=np.float32).reshape(n, 4) % 5).astype(np.float32)

    def run(mesh, body, spec_in, spec_out, value):
        smap = shard_map(body, mesh=mesh, in_specs=spec_in, out_specs=spec_out, check_vma=False)
        program = jax.jit(smap)
        sharding = NamedSharding(mesh, spec_in)
        arg = jax.make_array_from_callback(value.shape, sharding, lambda i: value[i])
        out = program(arg)
        return [(s.index, np.asarray(s.data)) for s in out.addressable_shards]

    def check(name, got, expected):
        for index, block in got:
            if not np.array_equal(block, expected[index]):
                raise SystemExit(f"{name}: block {index} is wrong")

    both = P(("p", "l"))
    total = np.tile(x.sum(0), (n, 1))
    check("psum", run(grid, lambda v: jax.lax.psum(v, ("p", "l")), both, both, x), total)
    rows = x.reshape(processes, local, 4).sum(1, keepdims=True)
    rows = np.broadcast_to(rows, (processes, local, 4)).reshape(n, 4)
    check("row psum", run(grid, lambda v: jax.lax.psum(v, "l"), both, both, x), rows)
    # Blocks of 2 columns per process along dimension 1, gathered over the process axis.
    wide = np.arange(local * processes * 2, dtype=np.float32).reshape(local, processes * 2)
    gathered = run(
        grid,
        lambda v: jax.lax.all_gather(v, "p", axis=1, tiled=True),
        P("l", "p"),
        P("l", None),
        wide,
    )
    check("inner all-gather", gathered, wide)
    ring = [(i, (i + 1) % n) for i in range(n)]
    check(
        "ring ppermute",
        run(line, lambda v: jax.lax.ppermute(v, "i", ring), P("i"), P("i"), x),
        np.roll(x, 1, axis=0),
    )
    comm = jaxmpi.MeshComm(line)
    check(
        "MeshComm allreduce",
        run(line, lambda v: jaxmpi.allreduce(v, jaxmpi.SUM, comm=comm), P("i"), P("i"), x),
        total,
    )
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {"jaxmpi": jaxmpi.__file__, "seconds": seconds, "peak_mib": peak}
    print(json.dumps(report), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--local", type=int, default=64)
    parser.add_argument("--modes", default="fast,ordered")
    args = parser.parse_args()
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    print(f"{args.processes} processes x {args.local} devices; the largest over the processes")
    print("| build | mode | seconds | peak RSS MiB |")
    print("|---|---|---:|---:|")
    for mode in args.modes.split(","):
        for build in ("before", "after"):
            folder = getattr(args, build)
            env = dict(
                os.environ,
                PYTHONPATH=str(folder),
                JAX_PLATFORMS="cpu",
                JAXMPI_MESH_REDUCTIONS=mode,
                XLA_FLAGS=f"--xla_force_host_platform_device_count={args.local}",
            )
            command = [mpiexec, "-n", str(args.processes), sys.executable, __file__]
            command += ["--worker", str(args.local)]
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
            if done.returncode:
                sys.exit(f"failed: {shlex.join(command)}\n{done.stdout}\n{done.stderr[-3000:]}")
            # The processes' lines may run together in the launcher's output.
            reports = [json.loads(r) for r in re.findall(r"\{[^{}]*\}", done.stdout)]
            for r in reports:
                if not Path(r["jaxmpi"]).resolve().is_relative_to(folder.resolve()):
                    sys.exit(f"{folder}: the job imported {r['jaxmpi']}")
            seconds = max(r["seconds"] for r in reports)
            peak = max(r["peak_mib"] for r in reports)
            print(f"| {build} | {mode} | {seconds:.1f} | {peak:.0f} |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(int(sys.argv[2]))
    else:
        main()
