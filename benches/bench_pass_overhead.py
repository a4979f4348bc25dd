"""What JAX's collectives cost through jaxmpi's pass against the jaxmpi op doing the same
(`psum` against `jaxmpi.allreduce`, `all_to_all` against `jaxmpi.alltoall`), at 1, 4 Ki,
64 Ki and 4 Mi float32 per rank, one device per process.

bench_jax_collectives.py times every case once after the other, so a ratio there compares
moments seconds apart, and on a busy 2-core machine its best-of-rounds ratios moved by 0.1
from run to run. Here the two programs of a pair are timed alternately, call after call, in
the same processes: each ratio is of two calls a few milliseconds apart. Prints, per pair
and size, the best time of each, the ratio of the best times, and the median and quartiles
of the paired ratios.

    mpiexec -n 2 -bind-to core python benches/bench_pass_overhead.py [--pairs 40] [--steps N]

`--steps 1` makes each program one call, where the work a program does once per run (the
pass's prologue, which makes its communicators at the first run and finds them made
after) shows against the op's call alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import numpy as np
from bench_jax_collectives import SIZES, STEPS
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmpi
import jaxmpi.distributed


def _programs(size: int):
    """(name, elements per rank as a multiple of n, pass step, jaxmpi op step)."""
    return [
        (
            "psum / jaxmpi.allreduce",
            1,
            lambda x: jax.lax.psum(x, "x") * (1.0 / size),
            lambda x: jaxmpi.allreduce(x, jaxmpi.SUM) * (1.0 / size),
        ),
        (
            "all_to_all / jaxmpi.alltoall",
            size,
            lambda x: jax.lax.all_to_all(x, "x", 0, 0, tiled=True),
            lambda x: jaxmpi.alltoall(x.reshape(size, -1)).reshape(-1),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=40, help="timed calls of each program")
    parser.add_argument("--json", help="write the rows there too")
    parser.add_argument(
        "--steps", type=int, help="calls a program (default: per size, 400 down to 10)"
    )
    args = parser.parse_args()

    jaxmpi.distributed.initialize(collectives="jaxmpi")
    rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
    if jax.local_device_count() != 1:
        raise SystemExit("one device per process: jaxmpi's ops take no more")
    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: d.process_index)), ("x",))
    blocks = NamedSharding(mesh, P("x"))

    def looped(step, steps):
        body = lambda v: jax.lax.fori_loop(0, steps, lambda _, y: step(y), v)  # noqa: E731
        mapped = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
        return jax.jit(mapped)

    def seconds(program, x) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(program(x))
        return time.perf_counter() - t0

    rows = []
    for name, times, through_pass, through_op in _programs(size):
        for label, n in SIZES.items():
            steps = args.steps or STEPS[label]
            x = jax.make_array_from_process_local_data(blocks, np.ones(n * times, np.float32))
            a, b = looped(through_pass, steps), looped(through_op, steps)
            jax.block_until_ready((a(x), b(x)))  # compiled, warm
            pass_s, op_s = [], []
            for _ in range(args.pairs):
                pass_s.append(seconds(a, x))
                op_s.append(seconds(b, x))
            ratios = sorted(p / o for p, o in zip(pass_s, op_s))
            q1, median, q3 = statistics.quantiles(ratios, n=4)
            rows.append(
                {
                    "pair": name,
                    "size": label,
                    "pass_us": 1e6 * min(pass_s) / steps,
                    "op_us": 1e6 * min(op_s) / steps,
                    "ratio_of_best": min(pass_s) / min(op_s),
                    "median_ratio": median,
                    "quartiles": (q1, q3),
                }
            )
    if rank != 0:
        return
    calls = f"{args.steps} calls" if args.steps else "400 to 10 calls"
    print(
        f"\n{size} ranks x 1 device, {args.pairs} alternated runs of each program ({calls} a run)\n"
    )
    print("| pair | size | pass, us | op, us | best / best | paired: median (quartiles) |")
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        q1, q3 = r["quartiles"]
        print(
            f"| {r['pair']} | {r['size']} | {r['pass_us']:.1f} | {r['op_us']:.1f} "
            f"| {r['ratio_of_best']:.2f}x | {r['median_ratio']:.2f}x ({q1:.2f}-{q3:.2f}) |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
