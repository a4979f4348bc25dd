"""What checked mode (JAXMPI_CHECK=1) costs per op and size, and what the short-message
check of every receive costs: µs per call inside a jitted fori_loop, checked mode off and
on in the same process (rounds alternate), at 1, 4 Ki and 4 Mi float32 elements.

    mpiexec -n 2 python benches/bench_check.py [--rounds 5] [--calls N] [--ops ...] [--sizes ...]

The short-message check has no switch: run this script under two builds (PYTHONPATH) and
compare the "off" columns of sendrecv/recv at 1 element (benches/RESULTS.md did so).
Prints a Markdown table on rank 0.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi
from jaxmpi import _native

RANK, SIZE = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
LEFT, RIGHT = (RANK - 1) % SIZE, (RANK + 1) % SIZE
PARTNER = RANK ^ 1 if (RANK ^ 1) < SIZE else RANK


def _ping_pong(y):
    """Within a pair of ranks: the even one sends first, the odd one sends back."""
    if RANK % 2 == 0:
        jaxmpi.send(y, PARTNER)
        return jaxmpi.recv(y, PARTNER)
    got = jaxmpi.recv(y, PARTNER)
    jaxmpi.send(got, PARTNER)
    return got


# Each op as one loop step y -> y' of the same shape.
OPS = {
    "allreduce": lambda y: jaxmpi.allreduce(y, jaxmpi.SUM) * 0.5,
    "bcast": lambda y: jaxmpi.bcast(y, 0),
    "allgather": lambda y: jaxmpi.allgather(y)[RANK],
    "alltoallv": lambda y: jaxmpi.alltoallv(y.reshape(SIZE, -1), [1] * SIZE, [1] * SIZE).ravel(),
    "sendrecv": lambda y: jaxmpi.sendrecv(y, y, LEFT, RIGHT),
    "send + recv": lambda y: _ping_pong(y),
}
SIZES = {"1": 1, "4 Ki": 4096, "4 Mi": 4 << 20}


def per_call(step, n: int, calls: int) -> float:
    loop = jax.jit(lambda y: jax.lax.fori_loop(0, calls, lambda i, y: step(y), y))
    y = jnp.ones(max(n, SIZE) // SIZE * SIZE, jnp.float32)
    jax.block_until_ready(loop(y))  # compile and warm up
    jaxmpi.barrier()
    t0 = time.perf_counter()
    jax.block_until_ready(loop(y))
    seconds = time.perf_counter() - t0
    return float(jaxmpi.allreduce(np.float64(seconds), jaxmpi.MAX)) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="calls per loop at 1 element")
    parser.add_argument("--ops", nargs="+", choices=list(OPS), default=list(OPS))
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    args = parser.parse_args()
    can_check = hasattr(_native, "set_checked_mode")  # builds before checked mode: off only
    modes = [False, True] if can_check else [False]
    rows = []
    for op in args.ops:
        step = OPS[op]
        for label in args.sizes:
            n = SIZES[label]
            calls = max(4, args.calls * 16 // max(16, n // 256))
            best = dict.fromkeys(modes, float("inf"))
            for r in range(args.rounds):
                for on in modes if r % 2 == 0 else modes[::-1]:
                    if can_check:
                        _native.set_checked_mode(on)
                    best[on] = min(best[on], per_call(step, n, calls))
            rows.append((op, label, best))
    if can_check:
        _native.set_checked_mode(False)
    if RANK == 0:
        print(f"{SIZE} ranks, best of {args.rounds} rounds, µs per call")
        print("| op | float32 elements | off | JAXMPI_CHECK=1 | ratio |")
        print("|---|---:|---:|---:|---:|")
        for op, label, best in rows:
            on = best.get(True)
            extra = f"{on:.2f} | {on / best[False]:.2f}" if on is not None else "- | -"
            print(f"| {op} | {label} | {best[False]:.2f} | {extra} |")


if __name__ == "__main__":
    main()
