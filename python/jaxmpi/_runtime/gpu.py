"""The GPU side of this process, where jaxlib has CUDA and JAX_PLATFORMS lets it run: whether
the driver loads, how many GPUs there are, which one this rank uses and whether MPI gets
device pointers or staged host copies. The GPU was chosen before MPI_Init where the
launcher said the rank's place on its node (`gpu_choice.py`); here, after MPI_Init, that
place is checked against MPI's own answer (MPI_COMM_TYPE_SHARED), and the choice made
where it had to wait for it. `cuda` says what was found."""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

from . import gpu_choice
from .library import early_gpu, info, node

if TYPE_CHECKING:
    from .._native import _LibraryInfo


def _mode(mpi: _LibraryInfo) -> str:
    if not mpi["cuda_aware"]:
        return "staged (pinned host copies)"
    if mpi["cuda_aware_checks_buffers"]:
        return "direct (CUDA-aware MPI; buffers legacy CUDA IPC cannot share are staged)"
    return "direct (CUDA-aware MPI, every buffer: JAXMPI_CUDA_AWARE=1)"


def _after_mpi_init(
    early: gpu_choice.Early, node: tuple[int, int]
) -> tuple[gpu_choice.Choice, str]:
    """The choice, made or checked now that MPI says the node-local rank: (choice, when)."""
    mpi_local = gpu_choice.LocalRank(node[0], node[1], "MPI_COMM_TYPE_SHARED")
    # The user's option: where jaxmpi set it before MPI_Init, the user had left it alone.
    applied = early.choice is not None and early.choice.jax_option is not None
    visible = "all" if applied else str(gpu_choice.jax_option("jax_cuda_visible_devices"))
    if early.choice is None or early.choice.needs_mpi:
        choice = gpu_choice.plan(os.environ, early.cuda["devices"], visible, mpi_local)
        gpu_choice.apply(choice)
        why = "no launcher variable gave the node-local rank"
        return choice, f"after MPI_Init ({why}: an MPI that set up CUDA there used GPU 0)"
    if early.mpi_was_up:
        return early.choice, "after MPI_Init (MPI was initialized before jaxmpi was imported)"
    if early.local is not None and early.local.rank != node[0]:
        choice = gpu_choice.plan(os.environ, early.cuda["devices"], visible, mpi_local)
        said = f"{early.local.source}={early.local.rank}"
        if choice.gpu != early.choice.gpu:
            warnings.warn(
                f"jaxmpi: the launcher said this rank is number {early.local.rank} on its node "
                f"({said}), MPI says {node[0]}: GPU {early.choice.gpu} was chosen before "
                f"MPI_Init, GPU {choice.gpu} is used now; an MPI that set up CUDA in MPI_Init "
                "is bound to the first. Set JAXMPI_GPU per rank to choose explicitly.",
                RuntimeWarning,
                stacklevel=2,
            )
            gpu_choice.apply(choice)
            return choice, f"after MPI_Init ({said}, but MPI says node-local rank {node[0]})"
    return early.choice, "before MPI_Init"


def _setup_cuda(
    mpi: _LibraryInfo, early: gpu_choice.Early, node: tuple[int, int]
) -> dict[str, Any]:
    """What was found of CUDA, and this rank's GPU. (The CUDA handlers are registered
    with XLA by the binding, `_binding/primitives.py`.)"""
    cuda: dict[str, Any] = {
        "plugin": early.unused != "this jaxlib has no CUDA plugin",
        "unused": early.unused,
        "driver": False,
        "devices": 0,
        "rank_gpu": None,
        "chosen": None,
        "when": None,
        "mode": None,
        "driver_error": None,
        "node_rank": node[0],
        "node_size": node[1],
        # What jaxmpi set jax_cuda_visible_devices to (None: left as it was).
        "jax_option": None,
    }
    if early.unused is not None:
        return cuda
    cuda.update(early.cuda)
    cuda["mode"] = _mode(mpi)
    if not cuda["driver"]:
        return cuda
    choice, when = _after_mpi_init(early, node)
    cuda["rank_gpu"], cuda["chosen"], cuda["when"] = choice.gpu, choice.why, when
    cuda["jax_option"] = choice.jax_option
    return cuda


cuda = _setup_cuda(info, early_gpu, node)
