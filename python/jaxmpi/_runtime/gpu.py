"""The GPU side of this process, where jaxlib has CUDA: whether the driver loads, how many
GPUs there are, which one this rank uses (chosen before JAX starts its GPU client, which no
jaxmpi import does), and whether MPI gets device pointers or staged host copies. Importing
the module decides it, once, after the MPI library is initialized (`library.py`: the
node-local rank); `cuda` says what was found."""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any

import jax

from .. import _native
from .library import info, node

if TYPE_CHECKING:
    from .._native import _LibraryInfo


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
    """What was found of CUDA; where jaxlib has it, this rank's GPU chosen. (The CUDA
    handlers are registered with XLA by the binding, `_binding/primitives.py`.)"""
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
    cuda.update(_native.cuda_info())
    cuda["mode"] = "direct (CUDA-aware MPI)" if mpi["cuda_aware"] else "staged (pinned host copies)"
    cuda["rank_gpu"] = _rank_gpu(cuda["devices"], cuda["node_rank"])
    if cuda["rank_gpu"] is not None:
        # Effective before JAX starts its GPU client, which no jaxmpi import does.
        jax.config.update("jax_cuda_visible_devices", str(cuda["rank_gpu"]))
        _native.set_rank_device(cuda["rank_gpu"])
    return cuda


cuda = _setup_cuda(info, node)
