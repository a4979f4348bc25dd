"""The MPI library of this process: chosen (agreeing with mpi4py), initialized, its
settings compared with the other ranks' (`agree.py`), and finalized at exit. Importing the
module does it, once; `info` says what was chosen and how.

Nothing here knows JAX's internals: what the JAX binding must do at exit before MPI is
finalized (stop draining, `_binding/dispatch.py`) it adds to `before_finalize`."""

from __future__ import annotations

import atexit
import os
import site
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

import jax

from .. import _native
from . import agree, gpu_choice, slurm
from .errors import MPIError

if TYPE_CHECKING:
    from .._native import _LibraryInfo

_native.set_error_type(MPIError)


def _search_prefixes() -> list[str]:
    """mpi4py's search order for libmpi: this environment, the user base, the base prefix."""
    prefixes = [sys.prefix, getattr(site, "USER_BASE", None) or "", sys.base_prefix]
    return [p for p in dict.fromkeys(prefixes) if p]


def loaded_mpi4py() -> ModuleType | None:
    """mpi4py's MPI module if it is loaded (jaxmpi never needs it)."""
    return sys.modules.get("mpi4py.MPI")


def _agree_with_mpi4py() -> None:
    """Lets mpi4py load its MPI first, so jaxmpi follows it instead of loading a second
    one. An explicit JAXMPI_MPI is passed on to mpi4py so both make the same choice."""
    if "mpi4py.MPI" in sys.modules:
        return
    requested = os.environ.get("JAXMPI_MPI", "auto").strip()
    if requested in ("mpich", "openmpi", "mpiabi"):
        os.environ.setdefault("MPI4PY_MPIABI", requested)
    elif "/" in requested or ".so" in requested:
        os.environ.setdefault("MPI4PY_LIBMPI", requested)
    try:
        from mpi4py import MPI  # noqa: F401  (importing initializes MPI)
    except ImportError:
        pass  # mpi4py is optional
    except RuntimeError as err:  # mpi4py cannot load this MPI (e.g. no mpiabi module)
        import warnings

        warnings.warn(
            f"jaxmpi: mpi4py could not be imported ({err}); continuing without it",
            stacklevel=3,  # the user's `import jaxmpi`
        )


def _check_environment() -> None:
    """JAXMPI_TIMEOUT, JAXMPI_DEBUG, JAXMPI_DISPATCH, JAXMPI_MESH_REDUCTIONS and
    JAXMPI_MAX_COMMUNICATORS are read by the handlers, which cannot raise a clear error at
    import; a bad value is refused here."""
    timeout = os.environ.get("JAXMPI_TIMEOUT", "").strip()
    try:
        seconds = float(timeout) if timeout else 0.0
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds < float("inf"):
        raise ValueError(
            f"JAXMPI_TIMEOUT={timeout!r}: expected a number of seconds (e.g. 300), or 0 for no timeout"
        )
    debug = os.environ.get("JAXMPI_DEBUG", "").strip()
    if debug not in ("", "0", "1"):
        raise ValueError(f"JAXMPI_DEBUG={debug!r}: expected 1 (log every MPI call) or 0")
    check = os.environ.get("JAXMPI_CHECK", "").strip()
    if check not in ("", "0", "1"):
        raise ValueError(
            f"JAXMPI_CHECK={check!r}: expected 1 (ranks check that they make the same calls "
            "before each one) or 0"
        )
    dispatch = os.environ.get("JAXMPI_DISPATCH", "").strip()
    if dispatch not in ("", "fast", "ordered"):
        raise ValueError(
            f"JAXMPI_DISPATCH={dispatch!r}: expected fast (no runtime token between jitted "
            "calls; the default on CPU) or ordered (JAX's ordered effect)"
        )
    reductions = os.environ.get("JAXMPI_MESH_REDUCTIONS", "")
    if reductions not in ("", "fast", "ordered"):
        raise ValueError(
            f"JAXMPI_MESH_REDUCTIONS={reductions!r}: expected fast (MPI's own reductions "
            "between processes; the default) or ordered (every element combined in rank "
            "order: the same bits in every layout of devices)"
        )
    most = os.environ.get("JAXMPI_MAX_COMMUNICATORS", "1024").strip()
    if not (most.isdigit() and int(most) > 0):
        raise ValueError(
            f"JAXMPI_MAX_COMMUNICATORS={most!r}: expected a whole number above 0, the most "
            "communicators among processes jaxmpi's device ranks make in a process (1024 "
            "by default)"
        )
    progress = os.environ.get("JAXMPI_PROGRESS", "").strip().lower()
    if progress not in ("", "thread", "none", "at-start"):
        raise ValueError(
            f"JAXMPI_PROGRESS={progress!r}: expected thread (a thread of jaxmpi's moves "
            "started ops along while the program computes), none (only MPI calls do: "
            "starts, waits, other ops) or at-start (as none, but a started collective "
            "completes at its start, as its blocking op)"
        )


def _cores_per_rank(ranks_on_node: int) -> float:
    """The CPU cores this rank may use: its own CPU set if the launcher pinned it to part
    of the node, else the node's share per rank."""
    mine = len(os.sched_getaffinity(0))
    if mine < (os.cpu_count() or mine):
        return float(mine)
    return mine / max(ranks_on_node, 1)


def _agree_across_ranks(mpi: _LibraryInfo) -> None:
    """Every rank compares its settings with the others' (agree.py): one allreduce of a
    digest, collective over COMM_WORLD, before anything else can make the ranks differ."""
    world = _native.world()
    if _native.comm_size(world) == 1:
        return
    version = (mpi["version_string"].splitlines() or [""])[0]
    agree.check(
        _native.comm_rank(world),
        mpi["family"],
        f"{mpi['family']} ({' '.join(version.split())})",
        lambda values: _native.allreduce_max(world, values),
        lambda data: _native.allgather_bytes(world, data),
    )


def _agree_on_start_verdicts(early: gpu_choice.Early) -> None:
    """On a GPU a call can fail on one rank before its MPI call (its stream, its GPU): in a
    job where any rank may run ops on GPUs, every blocking collective first agrees that
    every rank can start it (core: start_verdict.rs), so that none is left waiting. One
    allreduce (MAX) of an int decides it, on every rank alike, CPU ranks too: a rank
    without the switch would skip the agreement the others wait in."""
    cuda = early.cuda
    mine = int(early.unused is None and bool(cuda.get("driver")) and cuda.get("devices", 0) > 0)
    world = _native.world()
    any_rank = _native.allreduce_max(world, [mine])[0] if _native.comm_size(world) > 1 else mine
    _native.set_start_verdicts(any_rank > 0)


def _initialize() -> tuple[_LibraryInfo, tuple[int, int], gpu_choice.Early]:
    _check_environment()
    # Before MPI_Init (which mpi4py's import runs): MPIs that set up CUDA there bind to
    # the device current then.
    early = gpu_choice.before_mpi_init()
    _agree_with_mpi4py()
    _native.init(_search_prefixes())
    loaded = _native.info()
    slurm.check_world(_native.comm_size(_native.world()), loaded["family"])
    _agree_across_ranks(loaded)
    # The handlers take the mode the ranks just compared, not what os.environ says later.
    _native.mesh_reductions()
    _agree_on_start_verdicts(early)
    # Collective over COMM_WORLD, on every rank alike: this rank's place among the ranks
    # of its node (for the GPU it uses, and whether a progress thread has a core to spare).
    node = _native.node_local_rank(_native.world())
    one_host = node[1] == _native.comm_size(_native.world())
    _native.set_cores_per_rank(_cores_per_rank(node[1]), one_host)
    mpi = _native.info()  # read again: its progress mode follows the cores per rank
    return mpi, node, early


#: What was chosen and how (`python -m jaxmpi info` shows it); `node`: this rank's
#: (node-local rank, ranks on its node); `early_gpu`: CUDA as found before MPI_Init, and
#: the GPU chosen then (`gpu.py` completes it).
info, node, early_gpu = _initialize()

#: Called at exit after `jax.effects_barrier()` (also when it raised), before MPI_Finalize.
before_finalize: list[Callable[[], None]] = []


@atexit.register
def _shutdown() -> None:
    # XLA may still be running MPI calls asynchronously; they must finish before
    # MPI_Finalize. mpi4py finalizes later (from Py_AtExit), and only what it initialized.
    # A failure kept since an op nobody read is raised from here (printed at exit).
    try:
        jax.effects_barrier()
    finally:
        for callback in before_finalize:
            callback()
        # Requests started outside jit and never waited for: cancelled, and said.
        for request in _native.finalize():
            print(f"jaxmpi: at exit, {request}", file=sys.stderr)
