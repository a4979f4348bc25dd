"""What jaxmpi's own profile costs a call: a jitted fori_loop of 4 KiB allreduces (1,024
float32) at 2 ranks, in short blocks, four modes alternating block by block in one
process:

- "off": no profile recording;
- "on": the same compiled loop while a profile records (every call recorded);
- "on, sites": a loop compiled while a profile recorded, so that each call also names
  its call site (a `jax.named_scope`), while a profile records;
- "off, sites": that loop with no profile recording (what the call site's attribute
  alone costs).

Recording is switched on and off around each block by the extension itself (what
`jaxmpi.profile` does on every rank, less the clock measurements and the file, which
happen once per profile, not per call). A block's time per call is the slowest rank's.
Prints, per mode, the median block and the median of each repetition's ratio to the "off"
block next to it: on a shared machine the load moves every block, the ratio of
neighbours much less. The issue's bound: "on" at most 1.05.

    mpiexec -n 2 python benches/bench_profile.py [--repeats 150] [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi
from jaxmpi import _native

RANK = jaxmpi.COMM_WORLD.Get_rank()


def loop(calls: int):
    def step(_, y):
        with jax.named_scope("gradients"):
            return jaxmpi.allreduce(y, jaxmpi.SUM) * 0.5

    return jax.jit(lambda y: jax.lax.fori_loop(0, calls, step, y))


def per_call(run, y, calls: int, recording: bool) -> float:
    jaxmpi.barrier()
    if recording:
        _native.profile_start(calls + 16)
    t0 = time.perf_counter()
    jax.block_until_ready(run(y))
    seconds = time.perf_counter() - t0
    if recording:
        _native.profile_stop()
    return float(jaxmpi.allreduce(np.float64(seconds), jaxmpi.MAX)) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=150)
    parser.add_argument("--calls", type=int, default=2000, help="allreduces per block")
    args = parser.parse_args()
    y = jnp.ones(1024, jnp.float32)
    plain = loop(args.calls)
    jax.block_until_ready(plain(y))  # compiled outside any profile: no call sites
    # A profile of its own, only to compile the loop with call sites (each rank writes
    # its file into a folder of its own).
    with jaxmpi.profile(tempfile.mkdtemp(prefix=f"jaxmpi-bench-profile-{RANK}-")):
        sited = loop(args.calls)
        jax.block_until_ready(sited(y))
    modes = {
        "off": (plain, False),
        "on": (plain, True),
        "on, sites": (sited, True),
        "off, sites": (sited, False),
    }
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    names = list(modes)
    for r in range(args.repeats):
        for mode in names[r % len(names) :] + names[: r % len(names)]:
            run, recording = modes[mode]
            times[mode].append(per_call(run, y, args.calls, recording))
    if RANK == 0:
        off = times["off"]
        print(
            f"allreduce of 4 KiB, {jaxmpi.COMM_WORLD.Get_size()} ranks, blocks of "
            f"{args.calls} calls, {args.repeats} repetitions (µs per call, slowest rank):"
        )
        print("| mode | median block | best block | median of ratios to off's neighbour |")
        print("|---|---:|---:|---:|")
        for mode, values in times.items():
            ratios = [v / o for v, o in zip(values, off, strict=True)]
            print(
                f"| {mode} | {statistics.median(values):.3f} | {min(values):.3f} | "
                f"{statistics.median(ratios):.3f} |"
            )


if __name__ == "__main__":
    main()
