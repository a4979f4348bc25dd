"""Soak: many ops in jitted loops, resident memory sampled; does it stay flat?

Run on 2 ranks (any number works):
    mpiexec -n 2 python benches/soak.py            # 10^6 small ops, 10^3 large ones
    mpiexec -n 2 python benches/soak.py --lite     # the CI size, about a minute

Phases, each after a warm-up call (compilation and first buffers are not counted):
  small  allreduce + sendrecv + bcast of float32[16], many per jitted fori_loop call
  large  allreduce + sendrecv of float32[4 Mi] (16 MiB), a few per jitted call
  eager  allreduce + sendrecv called eagerly (the Python dispatch path), one op per call
RSS is read from /proc/self/statm after every call. A phase's growth is the highest RSS of
its second half of calls minus the highest of its first half: a leak raises the second
half's peak by what the second half leaked, while an allocator that keeps or returns freed
blocks moves single samples up and down (the end alone, against a point early in the
phase, once read 5 large buffers of such noise as growth in CI). Rank 0 prints one table for all ranks; the exit status is 1 if any rank's
growth in any phase exceeds its bound, else 0. The bound is --bound-mib (default 16 MiB),
plus, in the large phase, 4 large buffers: the allocator keeps a few freed 16 MiB blocks
mapped or not from call to call (measured: RSS moves by +-1..3 of them between calls, and
stays flat over 1000 ops), while a leak of one buffer per op would be 100s of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def mib(n: float) -> str:
    return f"{n / MIB:.1f}M"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--small-ops", type=int, default=10**6)
    p.add_argument("--large-ops", type=int, default=10**3)
    p.add_argument("--eager-ops", type=int, default=10**4)
    p.add_argument("--large-elements", type=int, default=4 * MIB, help="float32 per large op")
    p.add_argument("--bound-mib", type=float, default=16.0, help="allowed growth per phase")
    p.add_argument(
        "--lite", action="store_true", help="CI size: 3x10^5 small, 300 large, 4000 eager ops"
    )
    args = p.parse_args()
    if args.lite:
        args.small_ops, args.large_ops, args.eager_ops = 3 * 10**5, 300, 4000
    return args


RANK, SIZE = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
RIGHT, LEFT = (RANK + 1) % SIZE, (RANK - 1) % SIZE


def looped(ops, iterations: int):
    """A jitted call running `ops` (a list of x -> x functions) `iterations` times."""

    def body(_, x):
        for op in ops:
            x = op(x)
        return x

    return jax.jit(lambda x: jax.lax.fori_loop(0, iterations, body, x))


def allreduce(x):
    return jaxmpi.allreduce(x, jaxmpi.MAX)


def sendrecv(x):
    return jaxmpi.sendrecv(x, jnp.zeros_like(x), LEFT, RIGHT)


def bcast(x):
    return jaxmpi.bcast(x, 0)


def run_phase(name, call, x, ops_per_call: int, ops: int, bound: float):
    """Runs `call` until `ops` ops are done; returns the phase's row of the report."""
    calls = max(1, -(-ops // ops_per_call))
    x = jax.block_until_ready(call(x))  # warm-up: compile, first buffers
    start = rss()
    halves = [start, start]  # the highest RSS seen in the first and in the second half
    t0 = time.perf_counter()
    for i in range(calls):
        x = jax.block_until_ready(call(x))
        half = 2 * i // calls
        halves[half] = max(halves[half], rss())
    seconds = time.perf_counter() - t0
    end, peak = rss(), max(halves)
    return name, calls * ops_per_call, seconds, start, end, peak, halves[1] - halves[0], bound


def main() -> int:
    args = parse_args()
    small, large = jnp.zeros(16, jnp.float32), jnp.zeros(args.large_elements, jnp.float32)
    small_iterations, large_iterations = 1000, 5

    def eager(x):  # two eager dispatches per call
        return sendrecv(allreduce(x))

    bound = args.bound_mib * MIB

    rows = [
        run_phase(
            "small",
            looped([allreduce, sendrecv, bcast], small_iterations),
            small,
            3 * small_iterations,
            args.small_ops,
            bound,
        ),
        run_phase(
            "large",
            looped([allreduce, sendrecv], large_iterations),
            large,
            2 * large_iterations,
            args.large_ops,
            bound + 4 * large.nbytes,
        ),
        run_phase("eager", eager, small, 2, args.eager_ops, bound),
    ]
    numbers = np.array([row[1:] for row in rows], np.float64)
    everyone = np.asarray(jaxmpi.allgather(numbers))  # (SIZE, phases, fields)
    too_much = bool((everyone[:, :, -2] > everyone[:, :, -1]).any())
    if RANK == 0:
        print(
            f"soak on {SIZE} ranks; large op = {args.large_elements * 4 / MIB:g} MiB; "
            f"growth allowed: {args.bound_mib:g} MiB (large phase: + 4 large buffers)"
        )
        header = (
            f"{'phase':<6} {'rank':>4} {'ops':>9} {'s':>7} {'ops/s':>9} "
            f"{'RSS start':>10} {'end':>8} {'max':>8} {'growth':>8} {'bound':>7} {'B/op':>7}  result"
        )
        print(header)
        for p, (name, *_) in enumerate(rows):
            for r in range(SIZE):
                n, s, start, end, peak, growth, allowed = everyone[r, p]
                print(
                    f"{name:<6} {r:>4} {int(n):>9} {s:>7.1f} {n / s:>9.0f} {mib(start):>10} "
                    f"{mib(end):>8} {mib(peak):>8} {mib(growth):>8} {mib(allowed):>7} {growth / n:>7.1f}  "
                    f"{'OVER BOUND' if growth > allowed else 'ok'}"
                )
        print("soak: FAILED, memory grew beyond the bound" if too_much else "soak: passed")
    return 1 if too_much else 0


if __name__ == "__main__":
    sys.exit(main())
