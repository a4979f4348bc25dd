"""What jaxmpi's NaN-propagating MIN/MAX on float32 and float64 (issues 50, 58) costs
against SUM on float32: `jaxmpi.allreduce` MAX and, as the control no build changes, SUM
on float32, at 1, 1 Ki, 4 Ki, 1 Mi and 4 Mi elements (4 B to 16 MiB), in a jitted
`fori_loop`, two builds alternated in one run (before, after, before, after, ...) so that
the machine's load hits both alike.

    python benches/bench_minmax.py BEFORE_DIR AFTER_DIR [--ranks 2] [--rounds 5]
                                   [--sizes 1,4Mi] [--launcher "mpiexec -n {n}"]

Each DIR holds an installed jaxmpi (`pip install --no-deps --target DIR jaxmpi-*.whl`)
that goes first on PYTHONPATH; the driver checks that the jaxmpi imported is that one.
Run it with the Python of the venv whose MPI the job uses (its mpiexec, next to it, is the
default launcher); the environment passes on to the jobs (an MPICH CVAR, say). A case's
time per call is rank 0's best of 7 timed loops in a job, the cases taking turns; printed:
each build's best over the rounds and after / before, then MAX / SUM within each job (the
load of a shared machine cancels out there): every job's, so that a bimodal case shows,
each build's median over the rounds, and after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

# float32 elements; labelled by count, as issue 58 gives them (4 Mi = 16 MiB, which
# jaxmpi's allreduce cuts into 4 MPI calls of 4 MiB: `chunks.rs`).
SIZES = {
    "1": 1,
    "1Ki": 1 << 10,
    "4Ki": 4 << 10,
    "16Ki": 16 << 10,
    "64Ki": 64 << 10,
    "256Ki": 256 << 10,
    "1Mi": 1 << 20,
    "4Mi": 4 << 20,
}
CALLS = {
    "1": 2000,
    "1Ki": 1000,
    "4Ki": 1000,
    "16Ki": 400,
    "64Ki": 200,
    "256Ki": 60,
    "1Mi": 20,
    "4Mi": 10,
}
OPS = ("MAX", "SUM")
REPEATS = 7


def worker(sizes: list[str]) -> None:
    import jax
    import jax.numpy as jnp

    import jaxmpi

    def loop(op, n: int, calls: int):
        run = jax.jit(
            lambda x: jax.lax.fori_loop(0, calls, lambda i, y: jaxmpi.allreduce(y, op), x),
            donate_argnums=0,
        )
        # Ones: a SUM carried from call to call reaches inf (never a denormal) and stays.
        state = [jax.block_until_ready(run(jnp.ones(n, jnp.float32)))]

        def timed() -> float:
            t0 = time.perf_counter()
            state[0] = jax.block_until_ready(run(state[0]))
            return (time.perf_counter() - t0) / calls

        return timed

    loops = {
        f"{name} {size}": loop(getattr(jaxmpi, name), n, CALLS[size])
        for size, n in SIZES.items()
        if size in sizes
        for name in OPS
    }
    # The cases take turns, so that a burst of load elsewhere hits MAX and SUM alike.
    times = dict.fromkeys(loops, float("inf"))
    for _ in range(REPEATS):
        for case, timed in loops.items():
            times[case] = min(times[case], timed() * 1e6)
    if jaxmpi.COMM_WORLD.Get_rank() == 0:
        print(json.dumps({"jaxmpi": jaxmpi.__file__, "us": times}))


def measure(launcher: list[str], folder: Path, sizes: list[str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(folder), JAX_PLATFORMS="cpu")
    command = [*launcher, sys.executable, __file__, "--worker", ",".join(sizes)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        sys.exit(f"failed: {shlex.join(command)}\n{done.stdout}\n{done.stderr}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(report["jaxmpi"]).resolve().is_relative_to(folder.resolve()):
        sys.exit(f"{folder}: the job imported {report['jaxmpi']}, not the build asked for")
    return report["us"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    default = str(Path(sys.executable).parent / "mpiexec") + " -n {n}"
    parser.add_argument("--launcher", default=default)
    parser.add_argument("--sizes", default=",".join(SIZES), help="of " + ", ".join(SIZES))
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    if unknown := set(sizes) - set(SIZES):
        parser.error(f"unknown sizes {sorted(unknown)}: pick of {', '.join(SIZES)}")
    launcher = shlex.split(args.launcher.format(n=args.ranks))
    rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for build in rounds:
            rounds[build].append(measure(launcher, getattr(args, build), sizes))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"allreduce float32, {args.ranks} ranks, µs per call, best of {args.rounds} rounds")
    print("| op | size | before | after | after / before |")
    print("|---|---|---:|---:|---:|")
    for case in rounds["before"][0]:
        before = min(t[case] for t in rounds["before"])
        after = min(t[case] for t in rounds["after"])
        op, size = case.split(" ", 1)
        print(f"| {op} | {size} | {before:,.2f} | {after:,.2f} | {after / before:.2f} |")
    # MAX against SUM in the same job, at the same moments: the load cancels out.
    # A bimodal case (issue 58: 1.0x or 2.0x by job) shows only job by job.
    ratios = {
        (build, size): [t[f"MAX {size}"] / t[f"SUM {size}"] for t in jobs]
        for build, jobs in rounds.items()
        for size in sizes
    }
    print("\nMAX / SUM within each job, in job order")
    print("| size | build | each job |")
    print("|---|---|---|")
    for size in sizes:
        for build in rounds:
            each = ", ".join(f"{r:.2f}" for r in ratios[build, size])
            print(f"| {size} | {build} | {each} |")
    print(f"\nMAX / SUM within each job, median of {args.rounds} rounds")
    print("| size | before | after | after / before |")
    print("|---|---:|---:|---:|")
    for size in sizes:
        before, after = (statistics.median(ratios[b, size]) for b in rounds)
        print(f"| {size} | {before:.2f} | {after:.2f} | {after / before:.2f} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2].split(","))
    else:
        main()
