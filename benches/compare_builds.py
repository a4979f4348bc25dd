"""Per-call cost of two builds of jaxmpi, measured alternately in one run (before, after,
before, after, ...), so that the machine's load hits both alike: what a change to a
per-call path (handlers, dispatch, the Python wrappers) costs.

    python3 benches/compare_builds.py BEFORE_ROOT AFTER_ROOT [--rounds 3] [--ranks 2]
        [--ops allreduce,bcast,...] [--out FILE.json]

Each ROOT is a checkout whose ci/setup.sh made .venvs/mpich; each build runs its own
checkout's bench scripts (they may import private modules of their own layout). A round
runs, for each build: benches/bench_ops.py at `--ranks` ranks on one float32 element (the
jitted loop of every op in `--ops` against the same MPI call from a C loop, and its
dispatch: a jitted call and an eager one), then benches/bench_dispatch.py at 1 and 2 ranks
(a tiny jitted call with the op against one without, in both dispatch modes). Printed: the
median over the rounds of every number, for each build, and the ratio after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OPS = "allreduce,reduce,bcast,gather,allgather,scatter,alltoall,sendrecv"


def run(command: list[str], env: dict) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        sys.exit(f"failed: {' '.join(command)}\n{done.stdout}\n{done.stderr}")


def raw_loop(root: Path, folder: Path, name: str) -> Path:
    """benches/raw_loop.c built with the build's own MPI compiler wrapper."""
    library = folder / f"raw_loop_{name}.so"
    mpicc = root / ".venvs/mpich/bin/mpicc"
    run([str(mpicc), "-O2", "-shared", "-fPIC", str(root / "benches/raw_loop.c"), "-o", str(library)], dict(os.environ))  # fmt: skip
    return library


def measure(root: Path, raw: Path, folder: Path, ranks: int, ops: str) -> dict[str, float]:
    """One round of one build: every number by name, in µs."""
    venv = root / ".venvs/mpich/bin"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore")
    out = folder / "ops.json"
    command = [str(venv / "mpiexec"), "-n", str(ranks), str(venv / "python")]
    command += [str(root / "benches/bench_ops.py"), str(raw), str(out)]
    run([*command, "--rounds", "3", "--sizes", "1", "--ops", ops], env)
    report = json.loads(out.read_text())
    numbers = {}
    for row in report["ops"]:
        numbers[f"{row['op']}: jitted loop, per call"] = row["jaxmpi_us"]
        numbers[f"{row['op']}: the C loop, per call"] = row["raw_us"]
    for row in report["dispatch"]:
        numbers[f"dispatch: {row['case']}"] = row["us"]
    for row in report["overhead"]:
        numbers[f"in a loop: {row['case']}"] = row["ns"] / 1000
    out = folder / "dispatch.json"
    bench = [str(venv / "python"), str(root / "benches/bench_dispatch.py"), str(out)]
    run([*bench, "--ranks", "1", "2", "--rounds", "3"], env)
    for row in json.loads(out.read_text()):
        where = f"{row['ranks']} rank(s), {row['mode']}"
        tiny = row["tiny_us"]
        numbers[f"bench_dispatch {where}: jit + allreduce"] = tiny["jaxmpi"]
        numbers[f"bench_dispatch {where}: plain jit"] = tiny["plain jit"]
    return numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--ops", default=OPS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    builds = {"before": args.before.resolve(), "after": args.after.resolve()}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in builds}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        raws = {name: raw_loop(root, folder, name) for name, root in builds.items()}
        for r in range(args.rounds):
            order = list(builds) if r % 2 == 0 else list(builds)[::-1]
            for name in order:
                print(f"round {r + 1}: {name} ({builds[name]})", file=sys.stderr, flush=True)
                numbers = measure(builds[name], raws[name], folder, args.ranks, args.ops)
                for key, value in numbers.items():
                    samples[name].setdefault(key, []).append(value)
    print(f"| measure (µs, median of {args.rounds} rounds) | before | after | after / before |")
    print("|---|---:|---:|---:|")
    for key, values in samples["before"].items():
        before = statistics.median(values)
        after = statistics.median(samples["after"].get(key, [float("nan")]))
        print(f"| {key} | {before:.3f} | {after:.3f} | {after / before:.2f} |")
    if args.out:
        args.out.write_text(json.dumps({"builds": {k: str(v) for k, v in builds.items()}, "samples": samples}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
