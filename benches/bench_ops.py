"""Time per call of every op inside a jitted fori_loop, for jaxmpi and mpi4jax, against the
same MPI calls from a C loop (benches/raw_loop.c), all in one process over one libmpi;
then the cost of calling a tiny jitted function holding one op from Python.

Run under mpiexec from ci/bench.sh:  bench_ops.py RAW_LIBRARY OUT.json [--rounds N]

Each (op, size) is timed in rounds; every round runs each implementation once, in an
order that rotates from round to round, so machine noise hits all alike; the best round
counts. One measurement: a barrier, then `iters` calls, timed on every rank; the slowest
rank's time / iters is the time per call. `iters` is chosen from a first raw run so one
measurement takes about TARGET seconds, and is the same for every implementation.
Rank 0 writes the results as JSON (benches/report.py turns them into tables and a plot).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import platform
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI  # first: it initializes MPI (MPI_THREAD_MULTIPLE) for everyone

import jaxmpi

try:
    import mpi4jax
except ImportError:  # measured where it is installed (ci/bench.sh's venv)
    mpi4jax = None

OPS = ["allreduce", "reduce", "scan", "bcast", "gather", "allgather", "scatter",
       "alltoall", "sendrecv", "send/recv", "sendrecv_replace", "barrier"]  # fmt: skip
RAW_CODES = {op: i for i, op in enumerate(OPS)}  # raw_loop.c's enum, in the same order
SIZES = [1, 4 * 1024, 4 * 1024 * 1024]  # float32 elements per rank
TARGET = 0.1  # seconds per measurement
MIN_ITERS, MAX_ITERS = 5, 200_000
DUMP = __import__("os").environ.get("BENCH_DUMP_HLO")  # a folder: write each loop's HLO there

RANK, NRANKS = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
MINIMAL = {}  # benches/ffi_minimal.cc's handlers as jax functions, once loaded


def load_minimal(path: str) -> None:
    """Registers benches/ffi_minimal.cc's handlers (a no-op, and the leanest allreduce)."""
    lib = ctypes.CDLL(path)
    lib.bench_ffi_init()
    for name in ("bench_noop", "bench_allreduce"):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
        MINIMAL[name] = lambda x, name=name: jax.ffi.ffi_call(
            name,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            has_side_effect=True,
            input_output_aliases={0: 0},
        )(x)


def block(op: str, n: int) -> int:
    """Elements per destination: alltoall splits the rank's n elements over the ranks."""
    return max(1, n // NRANKS) if op == "alltoall" else n


# ---------------------------------------------------------------------------------------
# The jitted loops: the same body for both libraries
# ---------------------------------------------------------------------------------------


def buffers(op: str, n: int):
    """(x, y) for one rank: the op's input and the array its result goes to."""
    b = block(op, n)
    if op in ("scatter", "alltoall") and (op == "alltoall" or RANK == 0):
        x = np.ones((NRANKS, b), np.float32)
    else:
        x = (
            np.ones(b, np.float32)
            if op not in ("allreduce", "reduce", "scan")
            else np.zeros(b, np.float32)
        )
    if op in ("allgather", "alltoall") or (op == "gather" and RANK == 0):
        y = np.zeros((NRANKS, b), np.float32)
    else:
        y = np.zeros(b, np.float32)
    return x, y


def loop_body(lib, op: str):
    """body(i, (x, y)) -> (x, y): one call of `op`, written as a program carrying its
    state would: x = op(x) where the result replaces the input (the reductions, bcast,
    gather away from the root, whose result is x), else y = op(x, ...) with y the result
    (or the receive template it replaces). So the loop needs no copy of its own: a copy
    XLA inserts is one the library's op asks for."""
    total = {"jaxmpi": jaxmpi.SUM, "mpi4jax": MPI.SUM}[lib.__name__]
    left, right = (RANK - 1) % NRANKS, (RANK + 1) % NRANKS
    partner = RANK ^ 1

    def body(_, carry):
        x, y = carry
        if op == "allreduce":
            return lib.allreduce(x, total), y
        if op == "reduce":
            return lib.reduce(x, total, 0), y
        if op == "scan":
            return lib.scan(x, total), y
        if op == "bcast":
            return lib.bcast(x, 0), y
        if op == "gather":
            return (x, lib.gather(x, 0)) if RANK == 0 else (lib.gather(x, 0), y)
        if op == "allgather":
            return x, lib.allgather(x)
        if op == "scatter":  # away from the root the template is the last result
            return x, lib.scatter(x if RANK == 0 else y, 0)
        if op == "alltoall":
            return x, lib.alltoall(x)
        if op == "sendrecv":
            return x, lib.sendrecv(x, y, source=left, dest=right)
        if op == "sendrecv_replace":  # one array sent and received: a = sendrecv(a, a)
            return lib.sendrecv(x, x, source=left, dest=right), y
        if op == "send/recv":
            if partner >= NRANKS:
                return x, y
            if RANK % 2 == 0:
                lib.send(x, partner)
                return x, lib.recv(y, partner)
            y = lib.recv(y, partner)
            lib.send(x, partner)
            return x, y
        if op == "barrier":
            lib.barrier()
            return x, y
        raise ValueError(op)

    return body


class Raw:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.lib.raw_run.restype = ctypes.c_double
        self.lib.raw_run.argtypes = [
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
        ]
        self.lib.raw_max.restype = ctypes.c_double
        self.lib.raw_max.argtypes = [ctypes.c_double]

    def barrier(self):
        self.lib.raw_barrier()

    def slowest(self, seconds: float) -> float:
        return self.lib.raw_max(seconds)

    def loop(self, op: str, n: int, iters: int):
        x, y = buffers(op, n)
        count = block(op, n)

        def run() -> float:
            seconds = self.lib.raw_run(RAW_CODES[op], x.ctypes.data, y.ctypes.data, count, iters)
            if seconds < 0:
                raise RuntimeError(f"raw {op}: MPI error")
            return seconds

        return run


def jitted_loop(raw: Raw, lib, op: str, n: int, iters: int):
    """A timer for `iters` calls of `op` in one jitted fori_loop, and the loop's HLO.
    The state is donated and carried from run to run, as a simulation carries its state:
    XLA then loops on the same buffers every time (no copy of the inputs into fresh
    output buffers, whose first touch alone costs milliseconds at 4 Mi elements)."""
    body = loop_body(lib, op)
    x, y = buffers(op, n)
    state = [(jnp.asarray(x), jnp.asarray(y))]
    run = jax.jit(lambda s: jax.lax.fori_loop(0, iters, body, s), donate_argnums=0)
    # The optimized HLO, to count copies (for the larger sizes only: it compiles again).
    hlo = run.lower(state[0]).compile().as_text() if n >= 4096 else ""
    state[0] = jax.block_until_ready(run(state[0]))  # compile and warm up

    def timed() -> float:
        raw.barrier()
        t0 = time.perf_counter()
        state[0] = jax.block_until_ready(run(state[0]))
        return time.perf_counter() - t0

    return timed, hlo


def minimal_loop(raw: Raw, n: int, iters: int):
    """Like jitted_loop, for benches/ffi_minimal.cc's allreduce (no checks, no ordering)."""
    state = [jnp.zeros(n, jnp.float32)]
    run = jax.jit(
        lambda s: jax.lax.fori_loop(0, iters, lambda i, x: MINIMAL["bench_allreduce"](x), s),
        donate_argnums=0,
    )
    state[0] = jax.block_until_ready(run(state[0]))

    def timed() -> float:
        raw.barrier()
        t0 = time.perf_counter()
        state[0] = jax.block_until_ready(run(state[0]))
        return time.perf_counter() - t0

    return timed


def loop_body_copies(hlo: str, n: int) -> int:
    """Copies of at least n elements that run on every iteration: `copy` instructions,
    and fusions that are copies, in the while loop's body computation."""
    found = re.search(r" while\(.*?body=(%[\w.\-]+)", hlo)
    if n <= 1 or not found:
        return 0
    body = re.search(re.escape(found.group(1)) + r" \(.*?\n}", hlo, re.DOTALL)
    count = 0
    for line in body.group(0).splitlines() if body else []:
        m = re.match(r"\s*(?:ROOT )?(%\S+) = f32\[([\d,]*)\]\S* (copy|fusion)\(", line)
        if m and (m.group(3) == "copy" or "copy" in m.group(1)):
            elements = int(np.prod([int(d) for d in m.group(2).split(",") if d] or [1]))
            count += elements >= n
    return count


# ---------------------------------------------------------------------------------------
# Per-call times
# ---------------------------------------------------------------------------------------


def measure_ops(raw: Raw, rounds: int, ops, sizes) -> list[dict]:
    """Per-call times, one size class at a time: every (op, implementation) loop of the
    class is compiled first, then the rounds go over all of them, so the samples of one
    case are spread over a minute or so and a burst of load from elsewhere cannot spoil
    all of them."""
    libs = [jaxmpi] + ([mpi4jax] if mpi4jax is not None else [])
    rows = []
    cases = [(op, n) for n in sizes for op in ops if op != "barrier"]
    if "barrier" in ops:
        cases.append(("barrier", 0))
    for size_class in dict.fromkeys(n for _, n in cases):
        group = []
        for op, n in [c for c in cases if c[1] == size_class]:
            # Calibrate on the raw loop: how many calls make about TARGET seconds.
            probe = raw.loop(op, max(n, 1), 20)
            probe()
            per_call = raw.slowest(probe()) / 20
            iters = int(min(MAX_ITERS, max(MIN_ITERS, TARGET / max(per_call, 1e-9))))
            iters = int(raw.slowest(float(iters)))  # every rank the same
            timers = {"raw": raw.loop(op, max(n, 1), iters)}
            if op == "sendrecv_replace":  # the same shift from C with two buffers
                timers["raw_two_buffers"] = raw.loop("sendrecv", max(n, 1), iters)
            copies = {}
            if op == "allreduce" and MINIMAL:
                timers["minimal"] = minimal_loop(raw, max(n, 1), iters)
            for lib in libs:
                timers[lib.__name__], hlo = jitted_loop(raw, lib, op, max(n, 1), iters)
                # The most on any rank (rooted ops compile differently at the root).
                copies[lib.__name__] = int(raw.slowest(loop_body_copies(hlo, max(n, 1))))
                if DUMP and hlo:
                    name = f"{DUMP}/{lib.__name__}_{op.replace('/', '-')}_{n}_r{RANK}.hlo"
                    with open(name, "w") as f:
                        f.write(hlo)
            group.append((op, n, iters, timers, copies))
        best = [{name: float("inf") for name in timers} for _, _, _, timers, _ in group]
        for r in range(rounds):
            for (_, _, iters, timers, _), b in zip(group, best):
                names = list(timers)
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    b[name] = min(b[name], raw.slowest(timers[name]()) / iters)
        for (op, n, iters, timers, copies), b in zip(group, best):
            rows.append(
                {
                    "op": op,
                    "elements": n,
                    "iters": iters,
                    "copies": copies,
                    **{f"{name}_us": b[name] * 1e6 for name in timers},
                }
            )
            if RANK == 0:
                print(
                    f"  {op:>9} {n:>8}: "
                    + "  ".join(f"{name} {b[name] * 1e6:10.2f} us" for name in timers),
                    flush=True,
                )
        del group
    order = {op: i for i, op in enumerate(OPS)}
    return sorted(rows, key=lambda row: (order[row["op"]], row["elements"]))


# ---------------------------------------------------------------------------------------
# Dispatch: a tiny jitted function called from Python
# ---------------------------------------------------------------------------------------


def measure_dispatch(raw: Raw, rounds: int, seconds: float = 0.3) -> list[dict]:
    """Time per Python call of a jitted function holding one 1-element allreduce, against
    a plain jitted x + 1 and the op called eagerly; `async`: calls queued back to back
    (block at the end), `sync`: each result waited for. Calls per measurement: enough for
    about `seconds` (from a first timing of 5 calls; the same on every rank)."""
    x = jnp.zeros(1, jnp.float32)
    cases = {
        "jit(x + 1)": jax.jit(lambda v: v + 1),
        "jit(jaxmpi.allreduce)": jax.jit(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM)),
        "jaxmpi.allreduce (eager)": lambda v: jaxmpi.allreduce(v, jaxmpi.SUM),
    }
    if mpi4jax is not None:
        cases["jit(mpi4jax.allreduce)"] = jax.jit(lambda v: mpi4jax.allreduce(v, MPI.SUM))
        cases["mpi4jax.allreduce (eager)"] = lambda v: mpi4jax.allreduce(v, MPI.SUM)

    def timed(f, calls: int, mode: str) -> float:
        raw.barrier()
        t0 = time.perf_counter()
        y = x
        for _ in range(calls):
            y = f(y)
            if mode == "sync":
                jax.block_until_ready(y)
        jax.block_until_ready(y)
        return raw.slowest(time.perf_counter() - t0) / calls

    counts = {}
    for name, f in cases.items():
        jax.block_until_ready(f(x))
        counts[name] = int(raw.slowest(min(5000, max(5, seconds / timed(f, 5, "sync")))))
    raw_calls = 20000
    raw_loop = raw.loop("allreduce", 1, raw_calls)
    best = {}
    for r in range(rounds):
        key = "raw MPI_Allreduce (C loop)"
        best[key] = min(best.get(key, float("inf")), raw.slowest(raw_loop()) / raw_calls)
        names = list(cases)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for mode in ("async", "sync"):
                key = f"{name} [{mode}]"
                best[key] = min(best.get(key, float("inf")), timed(cases[name], counts[name], mode))
    if RANK == 0:
        for key, value in best.items():
            print(f"  {key:45} {value * 1e6:10.2f} us/call", flush=True)
    return [{"case": key, "us": value * 1e6} for key, value in best.items()]


def measure_overhead(raw: Raw, rounds: int, iters=200_000) -> list[dict]:
    """What one op costs inside a jitted loop besides MPI, per iteration, on every rank
    at once but each on a communicator of its own (no waiting for a partner): the loop
    alone (x + 1), a custom call to a do-nothing C++ FFI handler (benches/ffi_minimal.cc,
    XLA's floor for any custom call), and jaxmpi's barrier and 1-element allreduce."""
    alone = jaxmpi.COMM_WORLD.Split(color=RANK)
    cases = {
        "x + 1 (the loop alone)": lambda i, x: x + 1,
        "jaxmpi.barrier, 1-rank comm": lambda i, x: (jaxmpi.barrier(comm=alone), x)[1],
        "jaxmpi.allreduce, 1-rank comm": lambda i, x: jaxmpi.allreduce(x, jaxmpi.SUM, comm=alone),
    }
    if MINIMAL:
        cases["no-op FFI custom call"] = lambda i, x: MINIMAL["bench_noop"](x)
    runs = {}
    for name, body in cases.items():
        run = jax.jit(lambda x, body=body: jax.lax.fori_loop(0, iters, body, x), donate_argnums=0)
        runs[name] = [run, jax.block_until_ready(run(jnp.zeros(1, jnp.float32)))]
    best = {}
    for _ in range(rounds):
        for name, entry in runs.items():
            raw.barrier()
            t0 = time.perf_counter()
            entry[1] = jax.block_until_ready(entry[0](entry[1]))
            per = raw.slowest(time.perf_counter() - t0) / iters
            best[name] = min(best.get(name, float("inf")), per)
    jax.effects_barrier()
    alone.Free()
    if RANK == 0:
        for name, value in best.items():
            print(f"  {name:45} {value * 1e9:8.0f} ns/iteration", flush=True)
    return [{"case": name, "ns": value * 1e9} for name, value in best.items()]


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import os

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mpi": MPI.Get_library_version().strip().splitlines()[0],
        "mpi_library": jaxmpi._runtime.library.info["path"],
        "thread_level": None,
        "ranks": NRANKS,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxmpi": getattr(jaxmpi, "__version__", None) or _dist_version("jaxmpi"),
        "mpi4jax": _dist_version("mpi4jax") if mpi4jax is not None else None,
        "mpi4py": _dist_version("mpi4py"),
        "load_average": os.getloadavg(),
    }


def _dist_version(name: str):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("raw_library")
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--no-dispatch", action="store_true")
    parser.add_argument("--minimal", help="benches/ffi_minimal.cc built as a shared library")
    parser.add_argument("--plot", help="also draw time per call against size there (PNG)")
    args = parser.parse_args()
    raw = Raw(args.raw_library)
    if args.minimal:
        load_minimal(args.minimal)
    info = machine()
    info["thread_level"] = ["single", "funneled", "serialized", "multiple"][
        raw.lib.raw_thread_level()
    ]
    if RANK == 0:
        print(
            f"bench_ops: {NRANKS} ranks, {info['mpi']}, thread level {info['thread_level']}, "
            f"jax {info['jax']}, mpi4jax {info['mpi4jax']}",
            flush=True,
        )
    ops = args.ops.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = measure_ops(raw, args.rounds, ops, sizes)
    dispatch = [] if args.no_dispatch else measure_dispatch(raw, args.rounds)
    overhead = [] if args.no_dispatch else measure_overhead(raw, args.rounds)
    info["load_average_after"] = __import__("os").getloadavg()
    if RANK == 0:
        data = {"machine": info, "ops": rows, "dispatch": dispatch, "overhead": overhead}
        with open(args.out, "w") as f:
            json.dump(data, f, indent=1)
        print(f"bench_ops: wrote {args.out}", flush=True)
        if args.plot:
            import plots  # benches/plots.py, beside this file

            plots.latency(data, None, pathlib.Path(args.plot))


if __name__ == "__main__":
    sys.exit(main())
