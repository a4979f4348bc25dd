"""Process-wide setup: choose and initialize the MPI library (agreeing with mpi4py),
register the FFI handlers with XLA, and drain pending work before MPI is finalized."""

from __future__ import annotations

import atexit
import importlib.util
import os
import site
import sys
from typing import TYPE_CHECKING, Any

import jax

from . import _agree, _dispatch, _jax_shim, _native
from ._errors import MPIError, raise_kept_failure

if TYPE_CHECKING:
    from ._native import _LibraryInfo

_native.set_error_type(MPIError)


def _search_prefixes() -> list[str]:
    """mpi4py's search order for libmpi: this environment, the user base, the base prefix."""
    prefixes = [sys.prefix, getattr(site, "USER_BASE", None) or "", sys.base_prefix]
    return [p for p in dict.fromkeys(prefixes) if p]


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
    """JAXMPI_TIMEOUT, JAXMPI_DEBUG and JAXMPI_DISPATCH are read by the handlers, which cannot raise a
    clear error at import; a bad value is refused here."""
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
    progress = os.environ.get("JAXMPI_PROGRESS", "").strip().lower()
    if progress not in ("", "thread", "none"):
        raise ValueError(
            f"JAXMPI_PROGRESS={progress!r}: expected thread (a thread of jaxmpi's moves "
            "non-blocking transfers along while the program computes; the default under "
            "MPI_THREAD_MULTIPLE) or none (waits block in MPI_Wait)"
        )


def _rank_gpu(devices: int, node_rank: int) -> int | None:
    """The GPU this rank uses: JAXMPI_GPU if set (a number, or `jax` to leave it to JAX),
    else none when CUDA_VISIBLE_DEVICES is set (the user chose), else the rank's node-local
    rank (from MPI_COMM_TYPE_SHARED, whatever the launcher) modulo the GPU count."""
    chosen = os.environ.get("JAXMPI_GPU", "auto").strip()
    if chosen == "jax" or devices == 0:
        return None
    if chosen not in ("", "auto"):
        if not chosen.isdigit() or int(chosen) >= devices:
            raise ValueError(
                f"JAXMPI_GPU={chosen!r}: use a GPU number below {devices}, auto, or jax"
            )
        return int(chosen)
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return None
    return node_rank % devices


def _has_cuda_plugin() -> bool:
    """Whether this jaxlib can run on CUDA GPUs (a CUDA PJRT plugin is installed)."""
    names = (
        "jax_cuda12_plugin",
        "jax_cuda13_plugin",
        "jax_plugins.xla_cuda12",
        "jax_plugins.xla_cuda13",
    )
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except ModuleNotFoundError:
            continue
    return False


def _setup_cuda(mpi: _LibraryInfo, node: tuple[int, int]) -> dict[str, Any]:
    """Registers the CUDA handlers when this jaxlib has CUDA; reports what was found."""
    cuda: dict[str, Any] = {
        "plugin": _has_cuda_plugin(),
        "driver": False,
        "devices": 0,
        "rank_gpu": None,
        "mode": None,
        "driver_error": None,
        "node_rank": None,
        "node_size": None,
    }
    if not cuda["plugin"]:
        return cuda
    cuda["node_rank"], cuda["node_size"] = node
    for name, capsule in _native.handlers("CUDA"):
        _jax_shim.register_ffi_target(name, capsule, platform="CUDA")
    cuda.update(_native.cuda_info())
    cuda["mode"] = "direct (CUDA-aware MPI)" if mpi["cuda_aware"] else "staged (pinned host copies)"
    cuda["rank_gpu"] = _rank_gpu(cuda["devices"], cuda["node_rank"])
    if cuda["rank_gpu"] is not None:
        # Effective before JAX starts its GPU client, which no jaxmpi import does.
        jax.config.update("jax_cuda_visible_devices", str(cuda["rank_gpu"]))
        _native.set_rank_device(cuda["rank_gpu"])
    return cuda


def _cores_per_rank(ranks_on_node: int) -> float:
    """The CPU cores this rank may use: its own CPU set if the launcher pinned it to part
    of the node, else the node's share per rank."""
    mine = len(os.sched_getaffinity(0))
    if mine < (os.cpu_count() or mine):
        return float(mine)
    return mine / max(ranks_on_node, 1)


def _agree_across_ranks(mpi: _LibraryInfo) -> None:
    """Every rank compares its settings with the others' (_agree.py): one allgather of a
    digest, collective over COMM_WORLD, before anything else can make the ranks differ."""
    world = _native.world()
    if _native.comm_size(world) == 1:
        return
    version = (mpi["version_string"].splitlines() or [""])[0]
    _agree.check(
        _native.comm_rank(world),
        mpi["family"],
        f"{mpi['family']} ({' '.join(version.split())})",
        lambda data: _native.allgather_bytes(world, data),
    )


def _initialize() -> tuple[_LibraryInfo, dict[str, Any]]:
    _check_environment()
    _agree_with_mpi4py()
    _native.init(_search_prefixes())
    _agree_across_ranks(_native.info())
    # Collective over COMM_WORLD, on every rank alike: this rank's place among the ranks
    # of its node (for the GPU it uses, and whether a progress thread has a core to spare).
    node = _native.node_local_rank(_native.world())
    _native.set_cores_per_rank(_cores_per_rank(node[1]))
    mpi = _native.info()  # read again: its progress mode follows the cores per rank
    for name, capsule in _native.handlers("cpu"):
        _jax_shim.register_ffi_target(name, capsule, platform="cpu")
    _dispatch.configure(
        os.environ.get("JAXMPI_DISPATCH", "").strip(),
        on_fast=lambda: _native.keep_failures(True),
        on_barrier=raise_kept_failure,
    )
    return mpi, _setup_cuda(mpi, node)


info, cuda = _initialize()


@atexit.register
def _shutdown() -> None:
    # XLA may still be running MPI calls asynchronously; they must finish before
    # MPI_Finalize. mpi4py finalizes later (from Py_AtExit), and only what it initialized.
    # A failure kept since an op nobody read is raised from here (printed at exit).
    try:
        jax.effects_barrier()
    finally:
        _dispatch.stop_draining()
        # Requests started outside jit and never waited for: cancelled, and said.
        for request in _native.finalize():
            print(f"jaxmpi: at exit, {request}", file=sys.stderr)
