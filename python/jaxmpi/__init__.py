"""jaxmpi: zero-copy MPI communication for JAX arrays, callable inside jax.jit, with
whatever MPI library the machine has. A drop-in for mpi4jax: `import jaxmpi as mpi4jax`.
"""

from ._runtime import MPIError, info as _info
from ._comm import ANY_SOURCE, ANY_TAG, COMM_WORLD, OPS as _OPS, PROC_NULL, Comm, Op
from ._ops import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    bcast,
    exscan,
    gather,
    recv,
    reduce,
    scan,
    scatter,
    send,
    sendrecv,
)

SUM, PROD, MIN, MAX = _OPS["SUM"], _OPS["PROD"], _OPS["MIN"], _OPS["MAX"]
LAND, LOR, LXOR = _OPS["LAND"], _OPS["LOR"], _OPS["LXOR"]
BAND, BOR, BXOR = _OPS["BAND"], _OPS["BOR"], _OPS["BXOR"]


def has_cuda_support() -> bool:
    """Whether jaxmpi can run ops on CUDA device arrays in this process."""
    return False


__all__ = [
    "ANY_SOURCE", "ANY_TAG", "BAND", "BOR", "BXOR", "COMM_WORLD", "Comm", "LAND", "LOR",
    "LXOR", "MAX", "MIN", "MPIError", "Op", "PROC_NULL", "PROD", "SUM", "allgather",
    "allreduce", "alltoall", "barrier", "bcast", "exscan", "gather", "has_cuda_support",
    "recv", "reduce", "scan", "scatter", "send", "sendrecv",
]
