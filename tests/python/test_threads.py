"""Several Python threads, each with its own communicator, calling jitted ops at once.

With MPI_THREAD_MULTIPLE, MPI calls from different threads on different communicators
may run concurrently; jaxmpi must neither serialize them into a cross-rank deadlock (the
threads' calls interleave in a different order on every rank) nor mix up their messages.
Each thread runs allreduce + sendrecv (ring) + bcast (a root per thread) many times, on a
clone of the world made for it, with values that name the thread, the rank and the round,
so a message delivered to the wrong thread or round shows.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import MPI, RANK, SIZE
from jaxmpi._runtime.library import info

THREADS = 4
ROUNDS = 40
JOIN_TIMEOUT = 120  # seconds; a deadlock shows as threads still running after this

# Threads on their own communicators, at any number of ranks alike.
pytestmark = [
    pytest.mark.skipif(
        info["thread_level"] != "MPI_THREAD_MULTIPLE",
        reason=f"MPI provides {info['thread_level']}; concurrent calls need MPI_THREAD_MULTIPLE",
    ),
    pytest.mark.same_at_every_size,
]


def value(thread: int, rank: int, k: int) -> float:
    return 1000.0 * thread + 10.0 * rank + k


def thread_work(thread: int, comm, elements: int, problems: list) -> None:
    """The ops one thread runs, each round checked against what the other ranks sent."""
    right, left, root = (RANK + 1) % SIZE, (RANK - 1) % SIZE, thread % SIZE

    @jax.jit
    def rounds_step(x):
        total = jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm)
        from_left = jaxmpi.sendrecv(x, jnp.zeros_like(x), left, right, comm=comm)
        from_root = jaxmpi.bcast(x, root, comm=comm)
        return total, from_left, from_root

    try:
        for k in range(ROUNDS):
            x = jnp.full(elements, value(thread, RANK, k), jnp.float64)
            total, from_left, from_root = jax.device_get(rounds_step(x))
            expected = (
                sum(value(thread, r, k) for r in range(SIZE)),
                value(thread, left, k),
                value(thread, root, k),
            )
            for name, got, want in zip(
                ("allreduce", "sendrecv", "bcast"), (total, from_left, from_root), expected
            ):
                if not np.all(got == want):
                    problems.append(f"thread {thread} round {k} {name}: got {got[:3]}, want {want}")
    except Exception as err:
        problems.append(f"thread {thread}: {type(err).__name__}: {err}")


def clones(kind: str) -> list:
    """One communicator per thread, made in the same order on every rank (a collective)."""
    world = jaxmpi.COMM_WORLD if kind == "jaxmpi" else MPI.COMM_WORLD
    return [world.Clone() for _ in range(THREADS)]


COMM_KINDS = [
    "jaxmpi",
    pytest.param("mpi4py", marks=pytest.mark.skipif(MPI is None, reason="needs mpi4py")),
]


@pytest.mark.parametrize("elements", [8, 1 << 16], ids=["small", "512KiB"])
@pytest.mark.parametrize("kind", COMM_KINDS)
def test_threads_on_their_own_communicators(kind, elements):
    comms = clones(kind)
    problems: list = []
    threads = [
        threading.Thread(target=thread_work, args=(t, comms[t], elements, problems), daemon=True)
        for t in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    stuck = [t for t, thread in enumerate(threads) if thread.is_alive()]
    if not stuck:
        for comm in comms:
            comm.Free()
    assert not stuck, f"threads {stuck} still running after {JOIN_TIMEOUT}s (deadlock?)"
    assert not problems, "\n".join(problems)
