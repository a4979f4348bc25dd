"""JAX's collectives through jaxmpi's pass (`collectives="jaxmpi"`) and over MPI
through jaxmpi's plug-in (XLA's MPI backend, "mpi"), against gloo (JAX's default on the CPU)
and, given one, the stock MPIwrapper plug-in, in one run at 2 ranks of one device each, or
of `--devices` CPU devices each (where XLA's MPI backend does not run):

- `psum`, `all_gather`, `psum_scatter`, `all_to_all` and `ppermute` inside shard_map at 1,
  4 Ki, 64 Ki and 4 Mi float32 per device (`psum_scatter` and `all_to_all` take that much per
  member of the group), each a jitted `fori_loop`, next to the jaxmpi op doing the same
  (`allreduce`, `allgather`, `reduce_scatter`, `alltoall`, `sendrecv`) in the same processes
  (one device per process: jaxmpi's ops take no more);
- one step of a data-parallel training loop written with shardings only (a 3-layer MLP,
  parameters replicated, the batch split over the processes): XLA all-reduces the gradients
  itself, no jaxmpi op anywhere;
- what loading the plug-in costs: `import jax` with and without it (alternated, medians),
  the startup hook's import and the module's dlopen alone.

    python benches/bench_jax_collectives.py [--rounds 3] [--mpiwrapper LIB] [--launcher CMD]
                                            [--devices 1] [--imports 20]
                                            [--part all|collectives|import]
                                            [--routes gloo,mpi,jaxmpi]
                                            [--json OUT.json] [--plot OUT.png]

(`benches/setup_mpiwrapper.sh` builds the stock MPIwrapper, for --mpiwrapper.)

The driver starts one job per implementation and round (each implementation is fixed per
process), alternating them; a case's time is the best of its rounds, rank 0's (the loops
synchronize the ranks). Prints Markdown tables; --json also writes the collectives' best
times, --plot draws them against size (benches/plots.py). `--worker IMPL` is what each job
runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import socket
import statistics
import subprocess
import sys
import time

SIZES = {"1": 1, "4 Ki": 4096, "64 Ki": 65536, "4 Mi": 4 * 1024 * 1024}
STEPS = {"1": 400, "4 Ki": 200, "64 Ki": 60, "4 Mi": 10}
IMPLEMENTATIONS = {
    "gloo": "gloo",
    "mpi": "MPI via jaxmpi",
    "jaxmpi": "jaxmpi's pass",
    "mpiwrapper": "MPI via stock MPIwrapper",
    "mpiwrapper-multiple": "stock MPIwrapper, MPI at MULTIPLE",
}


# --------------------------------------------------------------------------- the worker


def _start(implementation: str):
    """jax.distributed over the job, JAX's collectives on the route asked for; jaxmpi (None for
    the stock plug-in, whose MPI jaxmpi must not share) and this rank, size."""
    import jax

    if implementation.startswith("mpiwrapper"):
        if implementation == "mpiwrapper-multiple":
            # XLA asks for MPI_THREAD_FUNNELED; initialized first at MULTIPLE (what jaxmpi's
            # plug-in runs at, for XLA's worker threads and jaxmpi's), the same library
            # takes MPICH's locks on every call: that difference, measured on its own.
            from mpi4py import MPI  # noqa: F401
        rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
        size = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
        jax.config.update("jax_cpu_collectives_implementation", "mpi")
        jax.distributed.initialize(f"127.0.0.1:{os.environ['PORT']}", size, rank)
        return None, rank, size
    import jaxmpi
    import jaxmpi.distributed

    jaxmpi.distributed.initialize(collectives=implementation)
    return jaxmpi, jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()


def _worker(implementation: str) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    jaxmpi, rank, size = _start(implementation)
    try:
        from jax import shard_map

        unchecked = {"check_vma": False}
    except ImportError:
        from jax.experimental.shard_map import shard_map

        unchecked = {"check_rep": False}
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(devices), ("x",))
    blocks = NamedSharding(mesh, P("x"))
    members, local = len(devices), jax.local_device_count()
    ring = [(r, (r + 1) % members) for r in range(members)]
    up, down = (rank - 1) % size, (rank + 1) % size

    def scattered(x):  # the sum of this member's part, written back where it came from
        part = jax.lax.psum_scatter(x, "x", tiled=True) * (1.0 / members)
        return jax.lax.dynamic_update_slice(x, part, (0,))

    # (case, elements per device as a multiple of the size, step)
    steps_of = {
        "psum": (1, lambda x: jax.lax.psum(x, "x") * (1.0 / members)),
        # Row 0 of the gathered blocks: XLA:CPU's sum over the gathered axis would cost more
        # than the gather at 4 Mi (148 ms against 22, measured).
        "all_gather": (1, lambda x: jax.lax.all_gather(x, "x")[0]),
        "psum_scatter": (members, scattered),
        "all_to_all": (members, lambda x: jax.lax.all_to_all(x, "x", 0, 0, tiled=True)),
        "ppermute": (1, lambda x: jax.lax.ppermute(x, "x", ring)),
    }
    if jaxmpi is not None and local == 1:

        def reduce_scattered(x):
            part = jaxmpi.reduce_scatter(x.reshape(size, -1), jaxmpi.SUM) * (1.0 / size)
            return jax.lax.dynamic_update_slice(x, part, (0,))

        steps_of |= {
            "jaxmpi.allreduce": (1, lambda x: jaxmpi.allreduce(x, jaxmpi.SUM) * (1.0 / size)),
            "jaxmpi.allgather": (1, lambda x: jaxmpi.allgather(x)[0]),
            "jaxmpi.reduce_scatter": (size, reduce_scattered),
            "jaxmpi.alltoall": (size, lambda x: jaxmpi.alltoall(x.reshape(size, -1)).reshape(-1)),
            "jaxmpi.sendrecv": (1, lambda x: jaxmpi.sendrecv(x, x, source=up, dest=down)),
        }

    def report(case: str, label: str, seconds: float, per: int) -> None:
        if rank == 0:
            row = {"impl": implementation, "case": case, "size": label, "us": 1e6 * seconds / per}
            print("ROW " + json.dumps(row), flush=True)

    def best_of(program, x, repeat=3) -> float:
        jax.block_until_ready(program(x))  # compiled, warm
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            jax.block_until_ready(program(x))
            times.append(time.perf_counter() - t0)
        return min(times)

    def looped(step, steps):
        def body(v):
            return jax.lax.fori_loop(0, steps, lambda _, y: step(y), v)

        return jax.jit(shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), **unchecked))

    for label, n in SIZES.items():
        for case, (times, step) in steps_of.items():
            x = jax.make_array_from_process_local_data(
                blocks, np.ones(local * n * times, np.float32)
            )
            # A case taking seconds a call (gloo's all_gather of 4 Mi) is timed once, one
            # call: its loop would take minutes.
            once = looped(step, 1)
            jax.block_until_ready(once(x))
            t0 = time.perf_counter()
            jax.block_until_ready(once(x))
            single = time.perf_counter() - t0
            if single > 1.0:
                report(case, label, single, 1)
                continue
            steps = STEPS[label]
            report(case, label, best_of(looped(step, steps), x), steps)

    # Data parallel with shardings only: XLA inserts the gradients' all-reduce.
    widths = [256, 512, 512, 64]
    batch = 128
    keys = jax.random.split(jax.random.PRNGKey(0), len(widths))
    replicated = NamedSharding(mesh, P())
    params = [
        jax.device_put(jax.random.normal(k, (a, b)) / np.sqrt(a), replicated)
        for k, a, b in zip(keys, widths[:-1], widths[1:])
    ]
    data = np.random.default_rng(rank).standard_normal((batch, widths[0])).astype(np.float32)
    inputs = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x", None)), data)
    targets = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("x", None)), np.tanh(data[:, : widths[-1]])
    )

    def loss(params, x, y):
        for w in params[:-1]:
            x = jnp.tanh(x @ w)
        return jnp.mean((x @ params[-1] - y) ** 2)

    @jax.jit
    def train_step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return [w - 0.01 * g for w, g in zip(params, grads)]

    steps = 20

    def train(params):
        for _ in range(steps):
            params = train_step(params, inputs, targets)
        return params

    hlo = train_step.lower(params, inputs, targets).compile().as_text()
    assert "all-reduce" in hlo, "XLA inserted no all-reduce"
    report(
        "train step (MLP 256-512-512-64, batch 128 per rank)",
        "~1.7 MB of gradients",
        best_of(train, params),
        steps,
    )
    final = float(jnp.sum(jnp.asarray([jnp.sum(w) for w in train(params)])))
    if rank == 0:
        print(f"CHECK {implementation} {final:.6f}", flush=True)


# --------------------------------------------------------------------------- the driver


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _job(
    launcher: list[str], implementation: str, mpiwrapper: str | None, devices: int = 1
) -> list[dict]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PORT=str(_free_port()))
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    command = [
        *launcher,
        sys.executable,
        "-u",
        os.path.abspath(__file__),
        "--worker",
        implementation,
    ]
    if implementation.startswith("mpiwrapper"):
        # Set: jaxmpi's startup hook leaves it as it is.
        env["MPITRAMPOLINE_LIB"] = mpiwrapper
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    rows = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ROW ")]
    checks = [line for line in done.stdout.splitlines() if line.startswith("CHECK ")]
    if not rows:
        sys.exit(
            f"{implementation}: no results (exit {done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}"
        )
    print(
        f"  {implementation}: {len(rows)} cases, exit {done.returncode}, {' '.join(checks)}",
        file=sys.stderr,
    )
    return rows


def _collectives(args) -> None:
    stock = ["mpiwrapper", "mpiwrapper-multiple"] if args.mpiwrapper else []
    # XLA's MPI backend takes one CPU device per process.
    implementations = ["gloo", "mpi", "jaxmpi", *stock] if args.devices == 1 else ["gloo", "jaxmpi"]
    if args.routes:
        implementations = [i for i in implementations if i in args.routes.split(",")]
    best: dict[tuple[str, str, str], float] = {}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1} of {args.rounds}", file=sys.stderr)
        for implementation in implementations:
            launcher = shlex.split(args.launcher)
            for row in _job(launcher, implementation, args.mpiwrapper, args.devices):
                key = (row["impl"], row["case"], row["size"])
                best[key] = min(best.get(key, float("inf")), row["us"])
    cases = sorted(
        {(case, size) for _, case, size in best},
        key=lambda cs: (
            cs[0].startswith("jaxmpi"),
            cs[0].startswith("train"),
            list(SIZES).index(cs[1]) if cs[1] in SIZES else 9,
            cs[0],
        ),
    )
    # The pass against each other route, and against the jaxmpi op doing the same (measured
    # in the pass's own jobs).
    others = [i for i in implementations if i != "jaxmpi"]
    header = ["case", "size"] + [IMPLEMENTATIONS[i] for i in implementations]
    header += [f"{IMPLEMENTATIONS[i]} / pass" for i in others] + ["pass / jaxmpi op"]
    print(
        f"\n{args.devices} CPU device(s) per process, {args.launcher}; us per call, best of {args.rounds} rounds\n"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * 2 + "---:|" * (len(header) - 2))
    equivalent = {
        "psum": "jaxmpi.allreduce",
        "all_gather": "jaxmpi.allgather",
        "psum_scatter": "jaxmpi.reduce_scatter",
        "all_to_all": "jaxmpi.alltoall",
        "ppermute": "jaxmpi.sendrecv",
    }
    for case, size in cases:
        if case.startswith("jaxmpi."):
            continue
        times = {impl: best.get((impl, case, size)) for impl in implementations}
        cells = [f"{t:.1f}" if t is not None else "-" for t in times.values()]
        ours = times["jaxmpi"]
        ratios = [
            f"{times[i] / ours:.2f}x" if times[i] is not None and ours else "-" for i in others
        ]
        op = best.get(("jaxmpi", equivalent.get(case, ""), size))
        ratios.append(f"{ours / op:.2f}x ({op:.1f})" if op and ours else "-")
        print(f"| `{case}` | {size} | " + " | ".join(cells + ratios) + " |")
    rows = [
        {"impl": impl, "case": case, "size": size, "elements": SIZES[size], "us": us}
        for (impl, case, size), us in best.items()
        if size in SIZES
    ]
    data = {
        "launcher": args.launcher,
        "rounds": args.rounds,
        "devices": args.devices,
        "implementations": implementations,
    }
    data["rows"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    if args.plot:
        import plots  # benches/plots.py, beside this file

        plots.latency(None, data, pathlib.Path(args.plot))


def _import_cost(args) -> None:
    """`import jax` with jaxlib loading the plug-in and without, alternated, in processes
    alike but for MPITRAMPOLINE_LIB (both -S: the startup hook would set it, and site's own
    imports would differ); what loading it the way MPItrampoline does costs alone (dlopen and
    a dlsym of each of its 641 names); the startup hook's import (`-X importtime`)."""
    import site

    import _jaxmpi_startup as hook

    plugin = hook.plugin()
    packages = site.getsitepackages()[0]
    prelude = f"import sys, time; sys.path.append({packages!r}); t = time.perf_counter(); "
    timed = prelude + "import jax; print(time.perf_counter() - t)"
    names = [
        line.split()[-1]
        for line in subprocess.run(
            ["nm", "-D", "--defined-only", plugin], capture_output=True, text=True
        ).stdout.splitlines()
        if line.split()[-1].startswith(("MPIABI_", "MPIXABI_", "mpiabi_", "mpiwrapper_"))
    ]
    # As MPItrampoline does it, through ctypes (whose ~1 us per call counts in too).
    loaded = (
        "import ctypes, os, time; dlsym = ctypes.CDLL(None).dlsym; "
        "dlsym.restype, dlsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]; "
        f"names = [n.encode() for n in {names!r}]; t = time.perf_counter(); "
        f"lib = ctypes.CDLL({plugin!r}, os.RTLD_LAZY | os.RTLD_LOCAL | os.RTLD_DEEPBIND)._handle; "
        "found = [dlsym(lib, n) for n in names]; assert all(found); "
        "print(time.perf_counter() - t)"
    )
    env = {k: v for k, v in os.environ.items() if k != "MPITRAMPOLINE_LIB"}

    def seconds(code: str, **extra: str) -> float:
        command = [sys.executable, "-S", "-c", code]
        done = subprocess.run(command, env=env | extra, capture_output=True, text=True, check=True)
        return float(done.stdout)

    with_plugin, without_plugin, alone = [], [], []
    for _ in range(args.imports):
        with_plugin.append(seconds(timed, MPITRAMPOLINE_LIB=plugin))
        without_plugin.append(seconds(timed))
        alone.append(seconds(loaded))
    startup = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], env=env, capture_output=True, text=True
    )
    hook_us = [
        line.split("|")[1].strip()
        for line in startup.stderr.splitlines()
        if "_jaxmpi_startup" in line
    ]
    a, b = statistics.median(with_plugin), statistics.median(without_plugin)
    ms = lambda ts, digits=0: " ".join(f"{1e3 * t:.{digits}f}" for t in ts)  # noqa: E731
    print()
    print(f"| what ({args.imports} runs each, alternated) | median ms | runs, ms |")
    print("|---|---:|---|")
    print(f"| `import jax`, jaxlib loads the plug-in | {1e3 * a:.1f} | {ms(with_plugin)} |")
    print(f"| `import jax`, no MPITRAMPOLINE_LIB | {1e3 * b:.1f} | {ms(without_plugin)} |")
    print(
        f"| the plug-in loaded alone (dlopen + {len(names)} dlsym) | {1e3 * statistics.median(alone):.2f} | {ms(alone, 2)} |"
    )
    print(
        f"| the startup hook's import (`-X importtime`, self) | {'/'.join(hook_us) or '?'} us | |"
    )
    print(f"\n`import jax` with / without the plug-in: {a / b:.3f}x (medians)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=list(IMPLEMENTATIONS), help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--imports", type=int, default=20, help="runs of `import jax` each way")
    parser.add_argument("--devices", type=int, default=1, help="CPU devices per process")
    parser.add_argument("--part", choices=["all", "collectives", "import"], default="all")
    parser.add_argument("--mpiwrapper", help="a stock libmpiwrapper.so to compare with")
    parser.add_argument(
        "--routes", help="only these routes, comma-separated (say jaxmpi: the pass and the ops)"
    )
    parser.add_argument("--json", help="write the collectives' best times there")
    parser.add_argument("--plot", help="draw them against size there (PNG)")
    parser.add_argument(
        "--launcher",
        default=f"{os.path.join(sys.prefix, 'bin', 'mpiexec')} -n 2",
        help="the command that starts the 2 ranks (default: this environment's mpiexec)",
    )
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    if args.part in ("all", "collectives"):
        _collectives(args)
    if args.part in ("all", "import"):
        _import_cost(args)


if __name__ == "__main__":
    main()
