"""What a jitted call holding an MPI op costs to dispatch, in both dispatch modes
(JAXMPI_DISPATCH=fast, the default on CPU, and ordered), against the same jitted function
without the op and against mpi4jax (if importable; its column is left out otherwise).

Tiny case: `jit(x + 1)` against `jit(allreduce(x) + 1)` on one float32, calls queued
back to back (blocked on at the end), best of `--rounds`. Shallow water
(examples/shallow_water.py, 360 x 180): one jitted call per time step, from Python,
against the same steps fused into one call (a fori_loop), per step.

    python benches/bench_dispatch.py OUT.json [--ranks 1 2] [--rounds 5]

Each (ranks, mode) is a fresh `mpiexec` (the mode is chosen at import) with the python
running this script; mpiexec is taken from the same venv.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = ("fast", "ordered")


def worker(rounds: int) -> None:
    import jax
    import jax.numpy as jnp

    import jaxmpi
    from jaxmpi._binding import dispatch as _dispatch

    sys.path.insert(0, str(ROOT / "examples"))
    from shallow_water import Model

    try:
        import mpi4jax
        from mpi4py import MPI
    except ImportError:
        mpi4jax = None

    def slowest(seconds: float) -> float:
        return float(jaxmpi.allreduce(jnp.float64(seconds), jaxmpi.MAX))

    def per_call(f, x, calls: int) -> float:
        jaxmpi.barrier()
        t0 = time.perf_counter()
        y = x
        for _ in range(calls):
            y = f(y)
        jax.block_until_ready(y)
        return slowest(time.perf_counter() - t0) / calls

    x = jnp.zeros((), jnp.float32)
    cases = {
        "plain jit": jax.jit(lambda v: v + 1),
        "jaxmpi": jax.jit(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM) + 1),
    }
    if mpi4jax is not None:
        cases["mpi4jax"] = jax.jit(lambda v: mpi4jax.allreduce(v, MPI.SUM) + 1)
    best = {name: float("inf") for name in cases}
    for f in cases.values():
        jax.block_until_ready(f(x))
    for r in range(rounds):
        names = list(cases)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            best[name] = min(best[name], per_call(cases[name], x, 2000))

    model = Model()
    steps = 50
    state = model.run(model.initial_state(), 3)  # compiles the stepping
    jax.block_until_ready(state)
    stepped = fused = float("inf")
    for _ in range(rounds):
        jaxmpi.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            state = model.run(state, 1)
        jax.block_until_ready(state)
        stepped = min(stepped, slowest(time.perf_counter() - t0) / steps)
        jaxmpi.barrier()
        t0 = time.perf_counter()
        state = model.run(state, steps)
        jax.block_until_ready(state)
        fused = min(fused, slowest(time.perf_counter() - t0) / steps)
    if jaxmpi.COMM_WORLD.Get_rank() == 0:
        mode, why = _dispatch.dispatch_mode()
        result = {"mode": mode, "why": why, "tiny_us": {k: v * 1e6 for k, v in best.items()}}
        result["shallow_water_us_per_step"] = {
            "python-stepped": stepped * 1e6,
            "fused": fused * 1e6,
        }
        print("RESULT " + json.dumps(result), flush=True)


def driver(out: str, ranks: list[int], rounds: int) -> None:
    mpiexec = str(pathlib.Path(sys.executable).parent / "mpiexec")
    results = []
    for n in ranks:
        for mode in MODES:
            env = dict(
                os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore", JAXMPI_DISPATCH=mode
            )
            command = [mpiexec, "-n", str(n), sys.executable, __file__, "--worker"]
            command += ["--rounds", str(rounds)]
            done = subprocess.run(
                command, check=False, capture_output=True, text=True, env=env, timeout=900
            )
            line = [s for s in done.stdout.splitlines() if s.startswith("RESULT ")]
            if done.returncode or not line:
                sys.exit(f"{mode} at {n} ranks failed:\n{done.stdout}\n{done.stderr}")
            results.append({"ranks": n, **json.loads(line[0][len("RESULT ") :])})
    pathlib.Path(out).write_text(json.dumps(results, indent=1))
    print(table(results))


def table(results: list[dict]) -> str:
    rows = [
        (
            "| ranks | mode | plain jit | jit + jaxmpi.allreduce | ratio | jit + mpi4jax.allreduce "
            "| shallow water, per step: Python-stepped | fused | ratio |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        tiny, sw = r["tiny_us"], r["shallow_water_us_per_step"]
        m4j = f"{tiny['mpi4jax']:.1f} µs" if "mpi4jax" in tiny else "not installed"
        rows.append(
            f"| {r['ranks']} | {r['mode']} | {tiny['plain jit']:.1f} µs | {tiny['jaxmpi']:.1f} µs "
            f"| {tiny['jaxmpi'] / tiny['plain jit']:.2f}x | {m4j} "
            f"| {sw['python-stepped']:.0f} µs | {sw['fused']:.0f} µs "
            f"| {sw['python-stepped'] / sw['fused']:.2f}x |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds)
    elif args.out:
        driver(args.out, args.ranks, args.rounds)
    else:
        parser.error("OUT.json is required")


if __name__ == "__main__":
    main()
