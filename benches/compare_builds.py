"""Per-call cost of two builds of jaxmpi, measured alternately in one run (before, after,
before, after, ...), so that the machine's load hits both alike: what a change to a
per-call path (handlers, dispatch, the Python wrappers) costs.

    python3 benches/compare_builds.py BEFORE_ROOT AFTER_ROOT [--rounds 3] [--ranks 2]
        [--ops allreduce,bcast,...] [--out FILE.json] [--worker-only]

Each ROOT is a checkout whose ci/setup.sh made .venvs/mpich; each build runs its own
checkout's bench scripts (they may import private modules of their own layout). A round
runs, for each build: benches/bench_ops.py at `--ranks` ranks on one float32 element (the
jitted loop of every op in `--ops` against the same MPI call from a C loop, and its
dispatch: a jitted call and an eager one), benches/bench_dispatch.py at 1 and 2 ranks
(a tiny jitted call with the op against one without, in both dispatch modes), and this
script's own worker at 1 rank (public API only): eager calls of a few ops (the Python
wrappers' path; best of 9 samples of 300 calls), the Python functions one eager call runs
(counted, not timed), the rooted collectives in a jitted loop (best of 7 x 20,000), and
each op's compiled program (its text without source locations, hashed). Printed: the
median over the rounds of every number, for each build, and the ratio after / before;
then which ops compile to the same program in both builds. `--worker-only` runs the
worker alone (half a minute a round), so that many short rounds can alternate the builds
more finely than load on a shared machine changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
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


def measure(
    root: Path, raw: Path, folder: Path, ranks: int, ops: str, benches: bool
) -> tuple[dict, dict]:
    """One round of one build: every number by name (in µs), and each op's program."""
    venv = root / ".venvs/mpich/bin"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore")
    numbers = {} if not benches else bench_numbers(venv, root, raw, folder, ranks, ops, env)
    worker = [str(venv / "python"), __file__, "--worker"]
    done = subprocess.run(worker, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        sys.exit(f"failed: {' '.join(worker)}\n{done.stdout}\n{done.stderr}")
    found = json.loads(done.stdout.splitlines()[-1])
    numbers.update(found["numbers"])
    return numbers, found["programs"]


def bench_numbers(
    venv: Path, root: Path, raw: Path, folder: Path, ranks: int, ops: str, env: dict
) -> dict:
    """What benches/bench_ops.py and benches/bench_dispatch.py measure, by name."""
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


def worker() -> None:
    """At 1 rank, through the public API only: eager calls, what one runs, rooted loops."""
    import jax
    import jax.numpy as jnp

    import jaxmpi

    x, rows = jnp.zeros(1, jnp.float32), jnp.zeros((1, 1), jnp.float32)
    eager = {
        "allreduce": lambda: jaxmpi.allreduce(x, jaxmpi.SUM),
        "bcast": lambda: jaxmpi.bcast(x, 0),
        "gatherv": lambda: jaxmpi.gatherv(rows, (1,), 0),
        "scatterv": lambda: jaxmpi.scatterv(rows, (1,), 0),
        "sendrecv": lambda: jaxmpi.sendrecv(x, x, 0, 0),
    }
    numbers = {}
    for name, call in eager.items():
        jax.block_until_ready(call())
        calls = [0]

        def count(frame, event, arg, calls=calls):
            calls[0] += event == "call"

        sys.setprofile(count)
        y = call()
        sys.setprofile(None)
        jax.block_until_ready(y)
        numbers[f"eager {name}: Python functions run (a count)"] = calls[0]
        best = float("inf")
        for _ in range(9):
            t0 = time.perf_counter()
            for _ in range(300):
                y = call()
            jax.block_until_ready(y)
            best = min(best, (time.perf_counter() - t0) / 300)
        numbers[f"eager {name}, 1 rank, best"] = best * 1e6
    loops = {
        "gather": lambda i, s: (s[0], jaxmpi.gather(s[0][0], 0)),
        "scatter": lambda i, s: (s[0], jaxmpi.scatter(s[1], 0)[None]),
        "gatherv": lambda i, s: (s[0], jaxmpi.gatherv(s[0], (1,), 0)),
        "scatterv": lambda i, s: (s[0], jaxmpi.scatterv(s[1], (1,), 0)),
        "allgatherv": lambda i, s: (s[0], jaxmpi.allgatherv(s[0], (1,))),
        "alltoall": lambda i, s: (s[0], jaxmpi.alltoall(s[1])),
    }
    for name, body in loops.items():
        run = jax.jit(lambda s, body=body: jax.lax.fori_loop(0, 20_000, body, s))
        jax.block_until_ready(run((rows, rows)))
        best = float("inf")
        for _ in range(7):
            t0 = time.perf_counter()
            jax.block_until_ready(run((rows, rows)))
            best = min(best, (time.perf_counter() - t0) / 20_000)
        numbers[f"{name}: jitted loop, 1 rank, best"] = best * 1e6
    programs = {}
    for name, call in {**eager, "grad allreduce": None}.items():
        if call is None:
            f = jax.grad(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM).sum())
            text = jax.jit(f).lower(x).compile().as_text()
        else:
            text = jax.jit(lambda call=call: call()).lower().compile().as_text()
        # Where each instruction came from (file names, lines) differs between checkouts.
        text = re.sub(r", metadata=\{[^}]*\}", "", text)
        text = "\n".join(line for line in text.splitlines() if not re.match(r'\d+ ["{]', line))
        programs[name] = hashlib.sha256(text.encode()).hexdigest()
    print(json.dumps({"numbers": numbers, "programs": programs}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--ops", default=OPS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker-only", action="store_true")
    if sys.argv[1:] == ["--worker"]:
        return worker()
    args = parser.parse_args()
    builds = {"before": args.before.resolve(), "after": args.after.resolve()}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in builds}
    programs: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        benches = not args.worker_only
        raws = {n: raw_loop(root, folder, n) if benches else Path() for n, root in builds.items()}
        for r in range(args.rounds):
            order = list(builds) if r % 2 == 0 else list(builds)[::-1]
            for name in order:
                print(f"round {r + 1}: {name} ({builds[name]})", file=sys.stderr, flush=True)
                numbers, programs[name] = measure(
                    builds[name], raws[name], folder, args.ranks, args.ops, benches
                )
                for key, value in numbers.items():
                    samples[name].setdefault(key, []).append(value)
    print(f"| measure (µs, median of {args.rounds} rounds) | before | after | after / before |")
    print("|---|---:|---:|---:|")
    for key, values in samples["before"].items():
        before = statistics.median(values)
        after = statistics.median(samples["after"].get(key, [float("nan")]))
        print(f"| {key} | {before:.3f} | {after:.3f} | {after / before:.2f} |")
    same = [op for op, text in programs["before"].items() if programs["after"].get(op) == text]
    others = sorted(set(programs["before"]) - set(same))
    print(f"\nthe same compiled program in both builds: {', '.join(same) or 'none'}")
    print(f"a different one: {', '.join(others) or 'none'}")
    if args.out:
        args.out.write_text(json.dumps({"builds": {k: str(v) for k, v in builds.items()}, "samples": samples}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
