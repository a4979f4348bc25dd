"""Shallow-water solve time: our example (examples/shallow_water.py) on jaxmpi, blocking
and with --overlap (isend/irecv/wait around the interior), against mpi4jax's own example
(examples/shallow_water.py of the mpi4jax sdist, run as it is), on mpi4jax and, as a
drop-in, on jaxmpi (`sys.modules["mpi4jax"] = jaxmpi`).

Both examples default to a 360 x 180 grid, 10 model days, 5 km cells and the same time
step (0.125 dx / sqrt(g H)), 100 steps per jitted call, float32. Each run is a fresh
`mpiexec`; rounds alternate the four so noise hits all alike; the best round counts.

    python bench_shallow_water.py MPI4JAX_EXAMPLE OUT.json [--ranks 2] [--rounds 3]

Run with the bench venv's python (ci/bench.sh); mpiexec is taken from the same venv.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OURS = ROOT / "examples" / "shallow_water.py"

# Runs mpi4jax's example unchanged, with `import mpi4jax` resolving to jaxmpi.
DROP_IN = (
    "import runpy, sys, jaxmpi; sys.modules['mpi4jax'] = jaxmpi; "
    "path = sys.argv[1]; sys.argv = [path] + sys.argv[2:]; "
    "runpy.run_path(path, run_name='__main__')"
)


def commands(mpi4jax_example: str) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "ours (jaxmpi)": [py, str(OURS), "--benchmark"],
        "ours (jaxmpi, --overlap)": [py, str(OURS), "--benchmark", "--overlap"],
        "mpi4jax example (mpi4jax)": [py, mpi4jax_example, "--benchmark"],
        "mpi4jax example (jaxmpi drop-in)": [py, "-c", DROP_IN, mpi4jax_example, "--benchmark"],
    }


def run(command: list[str], ranks: int, timeout: int) -> tuple[float | None, str]:
    mpiexec = str(pathlib.Path(sys.executable).parent / "mpiexec")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore")
    try:
        done = subprocess.run(
            [mpiexec, "-n", str(ranks), *command],
            capture_output=True,
            check=False,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    out = done.stdout + done.stderr
    found = re.search(r"Solution took ([\d.]+)\s*s", out)
    if done.returncode != 0 or not found:
        return None, out[-2000:]
    return float(found.group(1)), ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mpi4jax_example")
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    cases = commands(args.mpi4jax_example)
    results = []
    for ranks in args.ranks:
        best: dict[str, float] = {}
        errors: dict[str, str] = {}
        names = list(cases)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t0 = time.perf_counter()
                seconds, error = run(cases[name], ranks, args.timeout)
                wall = time.perf_counter() - t0
                if seconds is None:
                    errors[name] = error
                    print(f"  {ranks} ranks, {name}: FAILED\n{error}", flush=True)
                    continue
                best[name] = min(best.get(name, float("inf")), seconds)
                print(
                    f"  {ranks} ranks, round {r + 1}, {name}: solve {seconds:.2f} s "
                    f"(process {wall:.1f} s)",
                    flush=True,
                )
        results.append(
            {"ranks": ranks, "best_s": best, "errors": errors, "load_average": os.getloadavg()}
        )
    with open(args.out, "w") as f:
        json.dump(
            {"grid": "360 x 180", "days": 10, "rounds": args.rounds, "runs": results}, f, indent=1
        )
    print(f"bench_shallow_water: wrote {args.out}")


if __name__ == "__main__":
    main()
