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


if __name__ == "__main__":
    {"never_sent": never_sent, "serialized_threads": serialized_threads,
     "debug_lines": debug_lines}[sys.argv[1]]()  # fmt: skip
