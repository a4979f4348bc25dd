"""The job tests/dispatch_modes.sh launches: every rank dispatches jitted sends and
receives around a ring (2 MiB each, so a send needs its receiver) and exits without
waiting for any of them. Exit must still wait for every call already dispatched before
MPI_Finalize, on every rank: a clean run prints one "rank r/n: exiting" line per rank
and ends with status 0 (MPI_Finalize with a send in flight hangs or errors instead).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxmpi
from jaxmpi._binding import dispatch as _dispatch

ROUNDS = 8
rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size


def busy(x):
    """Work before the call, so that the process reaches exit with seconds of it queued."""
    for _ in range(20):  # unrolled: XLA counts no flops in a loop body
        x = jnp.sin(x)
    return x


@jax.jit
def send(x):
    jaxmpi.send(busy(x) + rank, right, tag=3)


@jax.jit
def recv(x):
    jaxmpi.recv(busy(x), left, tag=3)


x = jnp.ones(1 << 19, jnp.float32)
for _ in range(ROUNDS):
    # Even ranks send first, odd ones receive first: with a rendezvous-sized message,
    # the ring only moves if every rank's programs run in the order dispatched.
    if rank % 2 == 0:
        send(x)
        recv(x)
    else:
        recv(x)
        send(x)
mode, why = _dispatch.dispatch_mode()
print(
    f"rank {rank}/{size}: exiting with {2 * ROUNDS} calls dispatched ({mode}: {why})",
    flush=True,
)
