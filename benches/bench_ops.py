"""Time per call of jaxmpi ops inside a jitted fori_loop against the same MPI calls from a
C loop (benches/raw_loop.c) over the same library, in one process, on every rank.

Run through ci/bench.sh (2 ranks). Rounds alternate the two implementations so machine
noise hits both alike; each row keeps the best round. Prints a Markdown table on rank 0.
"""

from __future__ import annotations

import ctypes
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi

ROUNDS = 5
SIZES = {1: 20000, 4096: 4000, 4 * 1024 * 1024: 40}  # elements -> calls per round


def jaxmpi_loop(op: str, count: int, iters: int):
    comm = jaxmpi.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    left, right = (rank - 1) % size, (rank + 1) % size

    if op == "allreduce":

        def body(_, x):
            return jaxmpi.allreduce(x, jaxmpi.SUM)

        state = jnp.zeros(count, jnp.float32)
    else:

        def body(_, carry):
            send, recv = carry
            return send, jaxmpi.sendrecv(send, recv, source=left, dest=right)

        state = (jnp.ones(count, jnp.float32), jnp.zeros(count, jnp.float32))

    run = jax.jit(lambda s: jax.lax.fori_loop(0, iters, body, s))
    jax.block_until_ready(run(state))  # compile and warm up

    def timed() -> float:
        jaxmpi.barrier()
        jax.effects_barrier()
        t0 = time.perf_counter()
        jax.block_until_ready(run(state))
        return (time.perf_counter() - t0) / iters

    return timed


def raw_loop(lib, op: str, count: int, iters: int):
    send = np.ones(count, np.float32)
    recv = np.zeros(count, np.float32)
    ptr = ctypes.POINTER(ctypes.c_float)
    if op == "allreduce":
        return lambda: lib.raw_allreduce(recv.ctypes.data_as(ptr), count, iters)
    return lambda: lib.raw_sendrecv(send.ctypes.data_as(ptr), recv.ctypes.data_as(ptr), count, iters)


def main(raw_library: str) -> None:
    lib = ctypes.CDLL(raw_library)
    lib.raw_allreduce.restype = lib.raw_sendrecv.restype = ctypes.c_double
    rank = jaxmpi.COMM_WORLD.Get_rank()
    rows = []
    for op in ("allreduce", "sendrecv"):
        for count, iters in SIZES.items():
            ours, raw = jaxmpi_loop(op, count, iters), raw_loop(lib, op, count, iters)
            best_ours = best_raw = float("inf")
            for _ in range(ROUNDS):
                best_raw = min(best_raw, raw())
                best_ours = min(best_ours, ours())
            rows.append((op, count, best_raw * 1e6, best_ours * 1e6))
    if rank == 0:
        info = jaxmpi._runtime.info
        print(f"MPI: {' '.join(info['version_string'].split()[:3])} ({info['path']}), "
              f"{jaxmpi.COMM_WORLD.Get_size()} ranks, jax {jax.__version__}\n")
        print("| op | float32 elements | raw C loop µs/call | jaxmpi µs/call | jaxmpi / raw |")
        print("|---|---:|---:|---:|---:|")
        for op, count, raw_us, ours_us in rows:
            print(f"| {op} | {count} | {raw_us:.2f} | {ours_us:.2f} | {ours_us / raw_us:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
