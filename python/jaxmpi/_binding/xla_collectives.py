"""JAX's own collectives over jaxmpi's MPI: which implementation XLA's cross-process CPU
collectives (psum, all_gather, ppermute, and those XLA inserts into sharded programs) get
from `jaxmpi.distributed.initialize`, and why.

jaxlib's MPItrampoline loads jaxmpi's extension module as its MPI library at `import jax`
(MPITRAMPOLINE_LIB, set by jaxmpi's startup hook `_jaxmpi_startup`); with
`jax_cpu_collectives_implementation="mpi"` XLA then makes its MPI calls through jaxmpi's
library (backends/src/xla_collectives): one MPI, initialized once, debug lines and watchdog
included. "auto" picks MPI wherever that works, else gloo; "mpi" refuses, before anything
runs, where it cannot work.
"""

from __future__ import annotations

import os
import re
from typing import Any

import jax

from .. import _native
from .._runtime.gpu import cuda
from .._runtime.library import info
from . import jax_shim

CHOICES = ("auto", "mpi", "gloo")

# What `jaxmpi.distributed.initialize` chose in this process, and why (None: not called).
chosen: tuple[str, str] | None = None


def plugin_path() -> str:
    """jaxmpi's extension module: the library MPITRAMPOLINE_LIB must name."""
    return os.path.realpath(_native.__file__)


def _local_cpu_devices(local_device_ids: Any) -> int:
    """How many CPU devices this process will have, from what is set before JAX starts."""
    if local_device_ids is not None:
        return len(local_device_ids) if hasattr(local_device_ids, "__len__") else 1
    # JAX's config has an attribute per option, made at run time (unknown to mypy).
    configured = jax.config.jax_num_cpu_devices  # type: ignore[attr-defined]
    if configured and configured > 0:
        return int(configured)
    forced = re.search(
        r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    return int(forced.group(1)) if forced else 1


def _on_gpus() -> bool:
    """Whether JAX would run this process's arrays on GPUs (a CUDA plugin, not excluded)."""
    platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")  # type: ignore[attr-defined]
    return bool(cuda["plugin"]) and platforms.strip().lower() not in ("cpu",)


def _startup_hook():
    """jaxmpi's startup hook (`python/_jaxmpi_startup.py`, a top-level module)."""
    import _jaxmpi_startup

    return _jaxmpi_startup


def _plugin_not_loaded() -> str:
    """Why jaxlib did not load the plug-in, and what to do."""
    ours = plugin_path()
    named = os.environ.get("MPITRAMPOLINE_LIB")
    if named is None and not _startup_hook().checked_jaxlib():
        newest = ".".join(map(str, _startup_hook().CHECKED_JAXLIB[1]))
        return (
            f"jaxlib {jax.lib.__version__} is newer than the newest whose MPI interface "
            f"(MPItrampoline) jaxmpi's plug-in was checked against ({newest}), so jaxmpi's "
            "startup hook left MPITRAMPOLINE_LIB unset (a plug-in that lacks a name it asks "
            f"for ends `import jax`); to try it anyway, set MPITRAMPOLINE_LIB={ours}"
        )
    if named is None:
        return (
            "jaxlib did not load jaxmpi's MPI plug-in: MPITRAMPOLINE_LIB was not set when jax "
            "was imported (jaxmpi's wheel installs a startup hook that sets it; without it, "
            f"import jaxmpi before jax, or set MPITRAMPOLINE_LIB={ours})"
        )
    if os.path.realpath(named) != ours:
        return (
            f"MPITRAMPOLINE_LIB={named} gives jaxlib another MPI library than jaxmpi's "
            f"({ours}); unset it, or use that library with jax.distributed.initialize"
        )
    return (
        "jaxlib did not load jaxmpi's MPI plug-in although MPITRAMPOLINE_LIB names it: jax "
        "was imported before it was set (set it in the environment, or import jaxmpi first)"
    )


def obstacles(local_device_ids: Any = None) -> list[str]:
    """Why XLA's collectives cannot run over jaxmpi's MPI in this process (none: they can),
    each saying what to do."""
    found = []
    if not jax_shim.jaxlib_has_mpi_collectives():
        found.append(f"this jaxlib ({jax.lib.__version__}) cannot run XLA's collectives over MPI")
    elif not _native.xla_plugin_loaded():
        found.append(_plugin_not_loaded())
    if _on_gpus():
        found.append(
            "JAX runs this process on GPUs, whose collectives XLA runs over NCCL; MPI serves "
            "CPU devices only (set JAX_PLATFORMS=cpu for a CPU job)"
        )
    devices = _local_cpu_devices(local_device_ids)
    if devices > 1:
        found.append(
            f"XLA's MPI collectives take one CPU device per process (openxla/xla#16430), "
            f"and this process would have {devices}: launch one rank per device instead"
        )
    if info["thread_level"] != "MPI_THREAD_MULTIPLE":
        found.append(
            f"MPI was initialized with {info['thread_level']}, and XLA calls MPI from its "
            "worker threads: let jaxmpi or mpi4py initialize MPI (both ask for MULTIPLE)"
        )
    return found


def choose(requested: str, local_device_ids: Any = None) -> tuple[str, str]:
    """(implementation, why) for `collectives=requested`; raises where "mpi" cannot work."""
    if requested not in CHOICES:
        raise ValueError(
            f"collectives={requested!r}: expected 'auto' (MPI where it works, else gloo), "
            "'mpi' or 'gloo'"
        )
    if requested == "gloo":
        return "gloo", "collectives='gloo' was asked for"
    problems = obstacles(local_device_ids)
    if requested == "mpi" and problems:
        raise RuntimeError(
            "jaxmpi.distributed.initialize(collectives='mpi'): JAX's collectives cannot run "
            f"over MPI here: {'; '.join(problems)}. Or pass collectives='gloo'."
        )
    if problems:
        return "gloo", f"MPI cannot serve them here: {problems[0]}"
    why = "asked for" if requested == "mpi" else "the default where it works"
    return "mpi", f"{why}: jaxlib sends XLA's MPI calls to jaxmpi's MPI library"


def explain() -> tuple[str, str]:
    """What `python -m jaxmpi info` says: the choice `initialize` made, or would make."""
    if chosen is not None:
        return chosen
    implementation, why = choose("auto")
    return implementation, f"jaxmpi.distributed.initialize() would use it: {why}"
