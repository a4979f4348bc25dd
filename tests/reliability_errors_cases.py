"""Programs for tests/reliability_errors.sh, one per case (argv[1]); each runs under
mpiexec and prints what the script checks. They are programs, not pytest tests, because
what they check is how a whole job behaves: that it ends, and what it prints."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np


def never_sent() -> None:
    """Rank 0 receives a message rank 1 never sends; rank 1 waits outside jaxmpi. Only
    JAXMPI_TIMEOUT can end this job."""
    import jax

    import jaxmpi

    rank = jaxmpi.COMM_WORLD.Get_rank()
    jaxmpi.allreduce(np.float32(1), jaxmpi.SUM)  # a call for JAXMPI_DEBUG's history
    if rank == 0:
        jax.jit(lambda x: jaxmpi.recv(x, 1, tag=42))(np.zeros(5, np.float32))
        print("UNEXPECTED: the receive completed", flush=True)
    else:
        jaxmpi.COMM_WORLD.Barrier()  # never matched: rank 0 is stuck in its receive


def serialized_threads() -> None:
    """MPI initialized with MPI_THREAD_SERIALIZED: a call while another thread is inside
    one must be refused clearly; both calls' ranks go on afterwards."""
    import mpi4py

    mpi4py.rc.thread_level = "serialized"
    import jax
    from mpi4py import MPI

    import jaxmpi

    rank = MPI.COMM_WORLD.Get_rank()
    if rank == 0:
        got = {}
        receiver = threading.Thread(
            target=lambda: got.setdefault("y", jax.device_get(jaxmpi.recv(np.zeros(3), 1, tag=5)))
        )
        receiver.start()
        time.sleep(1.0)  # the receiver is now blocked: rank 1 sends after 3 s
        try:
            jax.block_until_ready(jaxmpi.allreduce(np.ones(2), jaxmpi.SUM, comm=MPI.COMM_SELF))
            print("UNEXPECTED: the concurrent call went through", flush=True)
        except jaxmpi.MPIError as err:
            print(f"REFUSED {err}", flush=True)
        receiver.join()
        print(f"RECEIVED {got['y'].tolist()}", flush=True)
    else:
        time.sleep(3.0)
        jaxmpi.send(np.arange(3.0), 0, tag=5)
    print(f"STILL USABLE {float(jaxmpi.allreduce(np.float32(1), jaxmpi.SUM))}", flush=True)


def debug_lines() -> None:
    """One line per call from inside jit under JAXMPI_DEBUG=1."""
    import jax

    import jaxmpi

    rank = jaxmpi.COMM_WORLD.Get_rank()

    @jax.jit
    def exchange(x):
        y = jaxmpi.sendrecv(x, x, source=1 - rank, dest=1 - rank, sendtag=7, recvtag=7)
        return jaxmpi.bcast(y, 0)

    jax.block_until_ready(exchange(np.zeros(4, np.float64)))
    print("DONE", flush=True)


def never_sent_nonblocking() -> None:
    """As never_sent, with irecv and wait: the progress agent's wait ends the job."""
    import jax

    import jaxmpi

    rank = jaxmpi.COMM_WORLD.Get_rank()
    jaxmpi.allreduce(np.float32(1), jaxmpi.SUM)
    if rank == 0:
        jax.jit(lambda x: jaxmpi.wait(jaxmpi.irecv(x, 1, tag=42)))(np.zeros(5, np.float32))
        print("UNEXPECTED: the receive completed", flush=True)
    else:
        jaxmpi.COMM_WORLD.Barrier()


def nonblocking_lines_and_exit() -> None:
    """JAXMPI_DEBUG shows each request's start and completion; requests started outside
    jit and never waited for are reported at exit, and the job still ends cleanly."""
    import jax

    import jaxmpi

    other = 1 - jaxmpi.COMM_WORLD.Get_rank()

    @jax.jit
    def exchange(x):
        sent = jaxmpi.isend(x, other, tag=7)
        got = jaxmpi.wait(jaxmpi.irecv(x, other, tag=7))
        jaxmpi.wait(sent)
        return got

    jax.block_until_ready(exchange(np.zeros(4, np.float64)))
    jaxmpi.irecv(np.zeros(2), other, tag=99)  # never sent, never waited
    jaxmpi.barrier()
    print("DONE", flush=True)


def serialized_nonblocking() -> None:
    """Under MPI_THREAD_SERIALIZED there is no progress thread: waits block, same values."""
    import mpi4py

    mpi4py.rc.thread_level = "serialized"
    import jax

    import jaxmpi

    other = 1 - jaxmpi.COMM_WORLD.Get_rank()
    x = np.full(1 << 18, float(jaxmpi.COMM_WORLD.Get_rank()), np.float32)

    @jax.jit
    def exchange(x):
        sent = jaxmpi.isend(x, other, tag=1)
        received = jaxmpi.irecv(x, other, tag=1)
        interior = jaxmpi.after([sent, received], x) * 2
        got, _ = jaxmpi.waitall([received, sent], after=interior)
        return got + interior

    y = jax.device_get(exchange(x))
    from jaxmpi._runtime.library import info

    print(f"PROGRESS {info['progress']}: {info['progress_reason']}", flush=True)
    print(f"VALUES {'right' if np.all(y == other + 2.0 * x) else 'WRONG'}", flush=True)


if __name__ == "__main__":
    {"never_sent": never_sent, "serialized_threads": serialized_threads,
     "debug_lines": debug_lines, "never_sent_nonblocking": never_sent_nonblocking,
     "nonblocking_lines_and_exit": nonblocking_lines_and_exit,
     "serialized_nonblocking": serialized_nonblocking}[sys.argv[1]]()  # fmt: skip
