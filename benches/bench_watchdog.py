"""What JAXMPI_TIMEOUT (the watchdog's call tracking) costs: a 1-element allreduce in a
jitted fori_loop, per call, with the variable unset and set.

    python benches/bench_watchdog.py [--mpiexec PATH] [--ranks 2] [--calls N] [--repeats R]

starts jobs per setting (the setting is read once per process) and prints a
table of microseconds per call (best over rounds of jobs, each the best of R loops
of N calls) and the ratio to "off".
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

SETTINGS = {"off": {}, "JAXMPI_TIMEOUT=600": {"JAXMPI_TIMEOUT": "600"}}


# CPU time of the process is less disturbed than wall time by other jobs on a shared
# machine; with 2 ranks the MPI library's busy polling makes them nearly equal anyway.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def measure(calls: int, repeats: int, clock: str) -> None:
    import jax
    import numpy as np

    import jaxmpi

    @jax.jit
    def loop(x):
        return jax.lax.fori_loop(0, calls, lambda i, y: jaxmpi.allreduce(y, jaxmpi.SUM) / 2, x)

    x = np.ones(1, np.float32)
    jax.block_until_ready(loop(x))  # compile and warm up
    best = float("inf")
    for _ in range(repeats):
        jaxmpi.COMM_WORLD.Barrier()
        start = CLOCKS[clock]()
        jax.block_until_ready(loop(x))
        best = min(best, CLOCKS[clock]() - start)
    if jaxmpi.COMM_WORLD.Get_rank() == 0:
        print(f"US_PER_CALL {best / calls * 1e6:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    parser.add_argument("--ranks", type=int, default=2, help="1 isolates jaxmpi's own cost")
    parser.add_argument("--clock", choices=list(CLOCKS), default="cpu")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="jobs per setting, interleaved")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        return measure(args.calls, args.repeats, args.clock)
    results = {}
    for name, extra in [item for _ in range(args.rounds) for item in SETTINGS.items()]:
        env = {k: v for k, v in os.environ.items() if k not in ("JAXMPI_TIMEOUT", "JAXMPI_DEBUG")}
        command = [args.mpiexec, "-n", str(args.ranks), sys.executable, __file__, "--measure",
                   "--calls", str(args.calls), "--repeats", str(args.repeats), "--clock", args.clock]  # fmt: skip
        out = subprocess.run(
            command, env={**env, **extra}, capture_output=True, text=True, check=False
        )
        line = next((x for x in out.stdout.splitlines() if x.startswith("US_PER_CALL")), None)
        if line is None:
            sys.exit(f"{name}: no measurement\n{out.stdout}\n{out.stderr}")
        results[name] = min(results.get(name, float("inf")), float(line.split()[1]))
    print(f"allreduce of 1 float32 in a jitted fori_loop, {args.ranks} rank(s), best of {args.rounds} jobs x "
          f"{args.repeats} x {args.calls} calls")  # fmt: skip
    print(f"{'setting':<22}{'us/call (' + args.clock + ')':>16}{'ratio':>8}")
    for name, us in results.items():
        print(f"{name:<22}{us:>16.3f}{us / results['off']:>8.3f}")


if __name__ == "__main__":
    main()
