"""`jaxmpi.profile`: jaxmpi's own profile of a part of a program (the whole job:
JAXMPI_PROFILE). The recording and the files are the runtime's (`_runtime/profile.py`)."""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import sys
from collections.abc import Iterator

import jax

from ._runtime import library
from ._runtime import profile as _recording


@contextlib.contextmanager
def profile(
    directory: str | os.PathLike[str], *, capacity: int | None = None
) -> Iterator[pathlib.Path]:
    """Records every call jaxmpi makes inside the block, on every rank, into `directory`.

    Each rank writes one file, ``rank<N>.trace.json``, when the block ends: a Chrome trace
    (Perfetto and chrome://tracing open it) of every call: op, route (a jaxmpi op on an
    MPI communicator, on a MeshComm, JAX's collectives through jaxmpi's pass or XLA's MPI
    backend), communicator or device, bytes, start and end on rank 0's clock, and for a
    started op (``iallreduce``...) its start, its wait and its time in flight, with how
    long its wait waited. ``python -m jaxmpi profile DIR`` merges the ranks' files, prints
    the time per op and call site (`jax.named_scope` names one), the slowest rank and the
    imbalance, and draws them. To record a whole job, set ``JAXMPI_PROFILE=DIR`` instead.

    Collective: every rank enters and leaves the block together (each measures its clock
    against rank 0's at both ends). Calls queued before the block are finished first and
    left out; calls queued inside it are finished when it ends and counted. A call site is
    passed by programs compiled while a profile records: a function jitted before the
    block is recorded by op and route. Costs: none while no profile records; inside the
    block, about 0.1-0.3 us a call, and 64 bytes a call of memory set aside at the start.

    Args:
        directory: where every rank writes its file, created if missing (the same path on
            every rank; on several hosts, a shared file system, or gather the files).
        capacity: calls each rank records on its timeline (default: JAXMPI_PROFILE_CAPACITY,
            else 1,048,576). Past it, calls are counted in the totals only, and the rank
            says so when it writes its file.

    Returns:
        A context manager; ``with jaxmpi.profile(d) as path`` gives the file this rank
        writes when the block ends.

    Raises:
        OSError: on every rank, if any rank cannot write into `directory` (named with the
            reason); when the block ends, if this rank cannot write its file.
        RuntimeError: if a profile records already (JAXMPI_PROFILE, or an enclosing block):
            profiles do not nest.
        ValueError: if `capacity` is not above 0.

    Example:
        .. mpirun::

            import json, os, tempfile
            import jax, jax.numpy as jnp
            import jaxmpi

            directory = os.path.join(tempfile.gettempdir(), "jaxmpi-profile-example")

            @jax.jit
            def step(x):
                with jax.named_scope("sum"):
                    return jaxmpi.allreduce(x, jaxmpi.SUM)

            with jaxmpi.profile(directory) as path:
                x = jnp.ones(1024)
                for _ in range(3):
                    x = step(x)
            events = json.loads(path.read_text())["traceEvents"]
            calls = [e for e in events if e["ph"] == "X"]
            print(path.name, len(calls), calls[0]["name"], calls[0]["args"]["bytes"],
                  calls[0]["args"]["site"])

        .. output::

            rank0.trace.json 3 allreduce 4096 jit(step)/sum
            rank1.trace.json 3 allreduce 4096 jit(step)/sum
    """
    if capacity is None:
        capacity = _recording.capacity_from_env()
    # What was queued before the block is not the block's.
    jax.effects_barrier()
    recording = _recording.start(directory, capacity, "jaxmpi.profile")
    try:
        yield recording.path
    finally:
        try:
            jax.effects_barrier()
        finally:
            _recording.stop(recording)


def _start_from_env() -> None:
    """JAXMPI_PROFILE=DIR: the whole job, from here to exit. Not for jaxmpi's own
    commands (`python -m jaxmpi info`, `... profile DIR`), which would write over the
    job's files."""
    argv = getattr(sys, "orig_argv", [])
    own_command = any(a == "-m" and b == "jaxmpi" for a, b in itertools.pairwise(argv))
    if not own_command:
        _recording.start_from_env()


_start_from_env()
# After jax.effects_barrier() at exit, before MPI_Finalize: the calls of the job's last
# programs are in.
library.before_finalize.append(_recording.stop_at_exit)
