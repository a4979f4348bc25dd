"""The job tests/rank_death.sh launches: every rank runs jitted allreduce + sendrecv
rounds in a loop; after `--die-after` seconds the last rank kills itself with SIGKILL
(no MPI_Finalize, no atexit: what the OOM killer or a node failure does). The others
are then blocked in, or about to enter, a call that can never complete; the launcher
must notice the death and end the job.

usage: python tests/rank_death_job.py [--die-after SECONDS] [--run-for SECONDS]

Every rank prints its pid (so the caller can look for survivors), and the victim the unix
time of its death (so the caller can time the teardown). Exit status 3: a rank ran for
--run-for seconds without being stopped, which never happens in a passing run.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp

import jaxmpi

parser = argparse.ArgumentParser()
parser.add_argument("--die-after", type=float, default=3.0)
parser.add_argument("--run-for", type=float, default=600.0)
args = parser.parse_args()

rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
victim = size - 1
right, left = (rank + 1) % size, (rank - 1) % size


@jax.jit
def rounds(x):
    def one(_, x):
        x = jaxmpi.allreduce(x, jaxmpi.SUM) / size
        return jaxmpi.sendrecv(x, jnp.zeros_like(x), left, right) + 1.0

    return jax.lax.fori_loop(0, 50, one, x)


x = jnp.full(1024, float(rank), jnp.float32)
jax.block_until_ready(rounds(x))  # compiled and run once everywhere before anyone dies
print(
    f"rank {rank}/{size}: pid {os.getpid()} running; rank {victim} dies in {args.die_after}s",
    flush=True,
)
start = time.monotonic()
calls = 0
while time.monotonic() - start < args.run_for:
    if rank == victim and time.monotonic() - start > args.die_after:
        print(
            f"rank {rank}: SIGKILL to myself after {calls} calls at {time.time():.3f}", flush=True
        )
        os.kill(os.getpid(), signal.SIGKILL)
    x = jax.block_until_ready(rounds(x))
    calls += 1
print(
    f"rank {rank}: still running after {args.run_for}s ({calls} calls); nobody stopped me",
    file=sys.stderr,
    flush=True,
)
sys.exit(3)
