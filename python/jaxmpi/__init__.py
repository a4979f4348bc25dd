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
from . import (
    _comm,
    distributed,  # jaxmpi.distributed.initialize()
)
from ._binding import dispatch as _dispatch  # noqa: F401  (fast dispatch's hooks into JAX)
from ._binding import requests as _requests  # noqa: F401  (wait outside jit, never-waited check)
from ._binding import rules as _rules  # noqa: F401  (differentiation and batching rules)
from ._collectives import allgather, alltoall, barrier, bcast, gather, scatter
from ._comm import Comm, Op
from ._errors import raise_mpi_errors
from ._mesh_comm import MeshComm
from ._native import __version__ as __version__  # the crate's version: the wheel's
from ._nonblocking import (
    after,
    iallgather,
    iallgatherv,
    iallreduce,
    ialltoall,
    ialltoallv,
    ibcast,
    igather,
    igatherv,
    irecv,
    ireduce,
    ireduce_scatter,
    iscatter,
    iscatterv,
    isend,
    wait,
    waitall,
)
from ._p2p import recv, send, sendrecv
from ._profile import profile  # starts JAXMPI_PROFILE's recording
from ._ragged import ragged_all_to_all
from ._reductions import allreduce, exscan, reduce, reduce_scatter, scan
from ._requests import Request
from ._runtime.errors import MPIError
from ._varcount import allgatherv, alltoallv, gatherv, scatterv

# The constants are assigned here, each with its `#:` comment: the API reference shows
# these comments (autodata), and `help()` users find them in the source.

#: The world communicator, every rank of the job (MPI_COMM_WORLD). Ops given `comm=None`
#: use a clone of it, made at import, so their messages never match a program's own on it.
COMM_WORLD: Comm = _comm.COMM_WORLD
#: Any sending rank, for receives (MPI_ANY_SOURCE, this MPI's own value). The default
#: `source` of `recv` and `irecv`; `sendrecv` takes it too. With `status=`, the status
#: says who sent. A receive from it has no derivative: differentiate with a named source.
ANY_SOURCE: int = _comm.ANY_SOURCE
#: Any tag, for receives (MPI_ANY_TAG, this MPI's own value). The default receive tag of
#: `recv`, `irecv` and `sendrecv`. With `status=`, the status says which tag came.
ANY_TAG: int = _comm.ANY_TAG
#: The peer that is nobody (MPI_PROC_NULL), as `dest` or `source`. A send to it sends
#: nothing, a receive from it returns its template: for the edges of a non-periodic domain.
PROC_NULL: int = _comm.PROC_NULL

# The reductions, for the `op` of allreduce, reduce, scan, exscan and reduce_scatter
# (mpi4py's MPI.SUM etc. and MPI.Op.Create ops work too). An op that is not defined on the
# array's dtype is refused with a TypeError.

#: Sum, on integer, float and complex arrays. Differentiable in every reduction.
SUM: Op = _comm.OPS["SUM"]
#: Product, on integer, float and complex arrays. Differentiable in allreduce and reduce
#: (through the product of the other ranks' values, exact where some are zero).
PROD: Op = _comm.OPS["PROD"]
#: Minimum, on integer and float arrays. Differentiable in allreduce and reduce, through
#: the selected elements (ties share the derivative equally).
MIN: Op = _comm.OPS["MIN"]
#: Maximum, on integer and float arrays. Differentiable in allreduce and reduce, through
#: the selected elements (ties share the derivative equally).
MAX: Op = _comm.OPS["MAX"]
#: Logical and (nonzero is true), on bool and integer arrays.
LAND: Op = _comm.OPS["LAND"]
#: Logical or (nonzero is true), on bool and integer arrays.
LOR: Op = _comm.OPS["LOR"]
#: Logical exclusive or (nonzero is true), on bool and integer arrays.
LXOR: Op = _comm.OPS["LXOR"]
#: Bitwise and, on integer arrays.
BAND: Op = _comm.OPS["BAND"]
#: Bitwise or, on integer arrays.
BOR: Op = _comm.OPS["BOR"]
#: Bitwise exclusive or, on integer arrays.
BXOR: Op = _comm.OPS["BXOR"]


def has_cuda_support() -> bool:
    """Whether jaxmpi can run ops on CUDA arrays in this process.

    True when jaxlib has CUDA, `JAX_PLATFORMS` lets JAX use it and the CUDA driver loads,
    decided at import (mpi4jax's name and meaning). Whether the MPI library reads GPU memory itself is a separate
    question: `python -m jaxmpi info` answers both.

    Returns:
        True if ops accept arrays on CUDA devices, else False.

    Example:
        .. mpirun::

            import jaxmpi

            print(jaxmpi.has_cuda_support())  # on a machine without a GPU

        .. output::

            False
            False
    """
    return bool(_gpu.cuda["plugin"] and _gpu.cuda["driver"])


def has_sycl_support() -> bool:
    """Always False: jaxmpi does not run ops on Intel GPU (XPU) arrays.

    mpi4jax moves XPU arrays through SYCL; jaxmpi has handlers for the CPU and CUDA
    platforms only. Kept for programs written for mpi4jax, which may ask.

    Returns:
        False.

    Example:
        .. mpirun::

            import jaxmpi

            print(jaxmpi.has_sycl_support())

        .. output::

            False
            False
    """
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
    "MeshComm",
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
    "iallgather",
    "iallgatherv",
    "iallreduce",
    "ialltoall",
    "ialltoallv",
    "ibcast",
    "igather",
    "igatherv",
    "irecv",
    "ireduce",
    "ireduce_scatter",
    "iscatter",
    "iscatterv",
    "isend",
    "profile",
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
