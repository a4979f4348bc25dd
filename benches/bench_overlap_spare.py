"""Non-blocking receive with a core to spare: does the progress thread move a message
while the rank computes?

    mpiexec -n 2 python benches/bench_overlap_spare.py

Rank 1 sends 16 MiB and then sleeps (it takes no core); rank 0 has started the receive
(outside jit) and computes with numpy for about twice the transfer's time, then waits.
Without a progress thread nothing moves the message until the wait; with it, the
message arrives during the computation. Prints rank 0's times (best of 5) for: the
receive alone, the computation plus the wait, with JAXMPI_PROGRESS as set (run it with
JAXMPI_PROGRESS=thread and =none). A 2-core machine at 2 ranks has this spare core only
because rank 1 sleeps; bench_overlap.py measures the case where both ranks compute.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi

RANK = jaxmpi.COMM_WORLD.Get_rank()
MESSAGE = jnp.ones(4 << 20, jnp.float32)  # 16 MiB
WORK = np.ones(1 << 19, np.float32)


def compute() -> None:
    x = WORK
    for _ in range(20):
        x = np.sin(x)


def once(with_compute: bool) -> float:
    jaxmpi.barrier()
    if RANK == 1:
        request = jaxmpi.isend(MESSAGE, 0, tag=1)
        time.sleep(0.05)
        jaxmpi.wait(request)
        return 0.0
    start = time.perf_counter()
    request = jaxmpi.irecv(MESSAGE, 1, tag=1)
    if with_compute:
        compute()
    jax.block_until_ready(jaxmpi.wait(request))
    return time.perf_counter() - start


def best(with_compute: bool) -> float:
    return min(once(with_compute) for _ in range(5))


def main() -> None:
    alone = best(False)
    start = time.perf_counter()
    compute()
    work = time.perf_counter() - start
    both = best(True)
    if RANK == 0:
        mode = os.environ.get("JAXMPI_PROGRESS", "(default)")
        print(
            f"JAXMPI_PROGRESS={mode}: receive {alone * 1e3:.2f} ms, compute {work * 1e3:.2f} ms, "
            f"compute + wait {both * 1e3:.2f} ms ({(alone + work) / both:.2f}x the sum)"
        )


if __name__ == "__main__":
    main()
