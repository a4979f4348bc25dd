"""jaxmpi: zero-copy MPI communication for JAX arrays, callable inside jax.jit, with
whatever MPI library the machine has. A drop-in for mpi4jax: `import jaxmpi as mpi4jax`.
"""

# First of all, while jax may not be imported yet: MPITRAMPOLINE_LIB for jaxlib, where
# jaxmpi's startup hook did not set it (a source tree); see the module.
try:
    import _jaxmpi_startup  # noqa: F401  # isort: skip
except ImportError:  # installed without the hook: JAX's collectives stay on gloo
    pass
from ._runtime import support as _support  # noqa: F401  # isort: skip  (first: refuses an unsupported JAX)
from ._runtime import gpu as _gpu  # isort: skip  (MPI initialized, this rank's GPU chosen before JAX uses one)
from . import distributed  # jaxmpi.distributed.initialize()
from ._binding import dispatch as _dispatch  # noqa: F401  (fast dispatch's hooks into JAX)
from ._binding import requests as _requests  # noqa: F401  (wait outside jit, never-waited check)
from ._binding import rules as _rules  # noqa: F401  (differentiation and batching rules)
from ._comm import ANY_SOURCE, ANY_TAG, COMM_WORLD, PROC_NULL, Comm, Op
from ._comm import OPS as _OPS
from ._errors import raise_mpi_errors
from ._native import __version__ as __version__  # the crate's version: the wheel's
from ._nonblocking import Request, after, irecv, isend, wait, waitall
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
    reduce_scatter,
    scan,
    scatter,
    send,
    sendrecv,
)
from ._ragged import ragged_all_to_all
from ._runtime.errors import MPIError
from ._varcount import allgatherv, alltoallv, gatherv, scatterv

SUM, PROD, MIN, MAX = _OPS["SUM"], _OPS["PROD"], _OPS["MIN"], _OPS["MAX"]
LAND, LOR, LXOR = _OPS["LAND"], _OPS["LOR"], _OPS["LXOR"]
BAND, BOR, BXOR = _OPS["BAND"], _OPS["BOR"], _OPS["BXOR"]


def has_cuda_support() -> bool:
    """Whether jaxmpi can run ops on CUDA device arrays in this process: jaxlib has CUDA
    and the CUDA driver loads (`python -m jaxmpi info` says more)."""
    return bool(_gpu.cuda["plugin"] and _gpu.cuda["driver"])


def has_sycl_support() -> bool:
    """Always False: mpi4jax runs ops on Intel GPU (XPU) arrays through SYCL; jaxmpi has
    FFI handlers for the CPU and CUDA platforms only, so XPU arrays are not supported."""
    return False


__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "BAND",
    "BOR",
    "BXOR",
    "COMM_WORLD",
    "LAND",
    "LOR",
    "LXOR",
    "MAX",
    "MIN",
    "PROC_NULL",
    "PROD",
    "SUM",
    "Comm",
    "MPIError",
    "Op",
    "Request",
    "after",
    "allgather",
    "allgatherv",
    "allreduce",
    "alltoall",
    "alltoallv",
    "barrier",
    "bcast",
    "distributed",
    "exscan",
    "gather",
    "gatherv",
    "has_cuda_support",
    "has_sycl_support",
    "irecv",
    "isend",
    "ragged_all_to_all",
    "raise_mpi_errors",
    "recv",
    "reduce",
    "reduce_scatter",
    "scan",
    "scatter",
    "scatterv",
    "send",
    "sendrecv",
    "wait",
    "waitall",
]  # fmt: skip
