"""What jaxmpi's NaN-propagating MIN/MAX on float32 and float64 (its own `MPI_Op`, issue 50)
costs against the library's predefined MPI_MAX: `jaxmpi.allreduce` MAX and, as the control
no build changes, SUM on float32, at 1 element, 4 KiB and 4 MiB, in a jitted `fori_loop`,
two builds alternated in one run (before, after, before, after, ...) so that the machine's
load hits both alike.

    python benches/bench_minmax.py BEFORE_DIR AFTER_DIR [--ranks 2] [--rounds 5]
                                   [--launcher "mpiexec -n {n}"]

Each DIR holds an installed jaxmpi (`pip install --no-deps --target DIR jaxmpi-*.whl`)
that goes first on PYTHONPATH; the driver checks that the jaxmpi imported is that one.
Run it with the Python of the venv whose MPI the job uses (its mpiexec, next to it, is the
default launcher). A case's time per call is rank 0's best of 7 timed loops in a job, the
cases taking turns; printed: each build's best over the rounds and after / before, then
MAX / SUM within each job (the load of a shared machine cancels out there), each build's
median over the rounds, and after / before.
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

SIZES = {"1": 1, "4 KiB": 1024, "4 MiB": 1024 * 1024}  # float32 elements
CALLS = {"1": 2000, "4 KiB": 1000, "4 MiB": 20}
OPS = ("MAX", "SUM")
REPEATS = 7


def worker() -> None:
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
        for name in OPS
    }
    # The cases take turns, so that a burst of load elsewhere hits MAX and SUM alike.
    times = dict.fromkeys(loops, float("inf"))
    for _ in range(REPEATS):
        for case, timed in loops.items():
            times[case] = min(times[case], timed() * 1e6)
    if jaxmpi.COMM_WORLD.Get_rank() == 0:
        print(json.dumps({"jaxmpi": jaxmpi.__file__, "us": times}))


def measure(launcher: list[str], folder: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(folder), JAX_PLATFORMS="cpu")
    command = [*launcher, sys.executable, __file__, "--worker"]
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
    args = parser.parse_args()
    launcher = shlex.split(args.launcher.format(n=args.ranks))
    rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for build in rounds:
            rounds[build].append(measure(launcher, getattr(args, build)))
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
    print(f"\nMAX / SUM within each job, median of {args.rounds} rounds")
    print("| size | before | after | after / before |")
    print("|---|---:|---:|---:|")
    for size in SIZES:
        ratio = {
            build: statistics.median(t[f"MAX {size}"] / t[f"SUM {size}"] for t in jobs)
            for build, jobs in rounds.items()
        }
        change = ratio["after"] / ratio["before"]
        print(f"| {size} | {ratio['before']:.2f} | {ratio['after']:.2f} | {change:.2f} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        main()
