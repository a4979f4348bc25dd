"""JAX's collectives: which route the cross-process CPU collectives of a JAX program (psum,
all_gather, ppermute, and those XLA inserts into sharded programs) take from
`jaxmpi.distributed.initialize`, and why. Three routes:

- "jaxmpi": jaxmpi's HLO pass (`hlo_pass.py`, JAX >= 0.10.2) replaces every collective of
  a program by a call to jaxmpi's own handlers: any number of CPU devices per process,
  every dtype, ragged all-to-all, in one order with jaxmpi's ops.
- "mpi": XLA's own MPI backend, reaching jaxmpi's library through the MPItrampoline that
  jaxlib carries (MPITRAMPOLINE_LIB, set by jaxmpi's startup hook `_jaxmpi_startup`) and
  jaxmpi's plug-in (backends/src/xla_plugin): one CPU device per process only.
- "gloo": JAX's TCP default.

"auto" takes the first that works here, in that order; an explicit choice refuses, before
anything runs, where it cannot work.
"""

from __future__ import annotations

import os
import re
from typing import Any

import jax

from .. import _native
from .._runtime.gpu import cuda
from .._runtime.library import info
from . import hlo_pass, jax_shim

CHOICES = ("auto", "jaxmpi", "mpi", "gloo")

# What XLA's own collectives are set to under the "jaxmpi" route, where the pass leaves
# XLA none to run: the implementation that needs nothing of MPI.
UNDER_THE_PASS = "gloo"

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
    """Whether JAX runs this process's arrays on GPUs: jaxlib has CUDA, JAX_PLATFORMS lets
    it run, and the driver sees a GPU. Without one JAX falls back to the CPU, as on a login
    node where `pip install "jax[cuda12]"` put the CUDA plugin."""
    platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")  # type: ignore[attr-defined]
    has_gpu = bool(cuda["driver"]) and cuda["devices"] > 0
    return has_gpu and platforms.strip().lower() not in ("cpu",)


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


_GPUS = (
    "JAX runs this process on GPUs, whose collectives XLA runs over NCCL; MPI serves CPU "
    "devices only (set JAX_PLATFORMS=cpu for a CPU job)"
)


def pass_obstacles(local_device_ids: Any = None) -> list[str]:
    """Why jaxmpi's pass cannot take JAX's collectives in this process (none: it can)."""
    found = []
    if not hlo_pass.available():
        found.append(
            f"JAX {jax.__version__} has no hook for a pass over its programs "
            "(jax.extend.xla.register_hlo_module_transformation, JAX >= 0.10.2)"
        )
    if _on_gpus():
        found.append(_GPUS)
    devices = _local_cpu_devices(local_device_ids)
    if devices > 1 and info["thread_level"] != "MPI_THREAD_MULTIPLE":
        found.append(
            f"this process would have {devices} CPU devices calling MPI at once, and MPI "
            f"was initialized with {info['thread_level']}: let jaxmpi or mpi4py initialize "
            "MPI (both ask for MPI_THREAD_MULTIPLE)"
        )
    return found


def plugin_obstacles(local_device_ids: Any = None) -> list[str]:
    """Why XLA's collectives cannot run over jaxmpi's MPI in this process (none: they can),
    each saying what to do."""
    found = []
    if not jax_shim.jaxlib_has_mpi_collectives():
        found.append(f"this jaxlib ({jax.lib.__version__}) cannot run XLA's collectives over MPI")
    elif not _native.xla_plugin_loaded():
        found.append(_plugin_not_loaded())
    if _on_gpus():
        found.append(_GPUS)
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
    """(route, why) for `collectives=requested`; raises where the route asked for cannot
    work."""
    if requested not in CHOICES:
        raise ValueError(
            f"collectives={requested!r}: expected 'auto' (the fastest route that works: "
            "'jaxmpi', then 'mpi', then 'gloo'), 'jaxmpi', 'mpi' or 'gloo'"
        )
    if requested == "gloo":
        return "gloo", "collectives='gloo' was asked for"
    routes = {"jaxmpi": pass_obstacles(local_device_ids), "mpi": plugin_obstacles(local_device_ids)}
    if requested != "auto":
        problems = routes[requested]
        if problems:
            raise RuntimeError(
                f"jaxmpi.distributed.initialize(collectives={requested!r}): JAX's collectives "
                f"cannot take that route here: {'; '.join(problems)}. Or pass "
                "collectives='auto' (the fastest route that works) or 'gloo'."
            )
        return requested, f"asked for: {_WHAT[requested]}"
    for route, problems in routes.items():
        if not problems:
            return route, f"the fastest route that works here: {_WHAT[route]}"
    return "gloo", (
        f"neither jaxmpi's pass ({routes['jaxmpi'][0]}) nor XLA's MPI backend "
        f"({routes['mpi'][0]}) can serve them here"
    )


_WHAT = {
    "jaxmpi": "jaxmpi's pass hands every collective of a program to jaxmpi's own calls",
    "mpi": "jaxlib sends XLA's MPI calls to jaxmpi's MPI library",
}


def refuse_programs_over_some_processes() -> None:
    """Under "mpi", refuses a compiled program over the devices of more than one process
    but not all that holds a collective: XLA's MPI backend makes its communicators with
    MPI_Comm_split over every process, which the processes outside the program never
    call (a hang). Said when it is compiled, before anything runs."""
    everyone = jax.process_count()

    def compiled(original, backend, computation, devices, *rest, **kwargs):
        executable = original(backend, computation, devices, *rest, **kwargs)
        processes = sorted({d.process_index for d in devices.flat})
        if 1 < len(processes) < everyone:
            held = jax_shim.executable_collectives(executable)
            if held:
                raise RuntimeError(
                    f"jaxmpi: this program runs on the devices of processes {processes} of "
                    f"{everyone} and holds {', '.join(sorted(set(held)))}, whose "
                    "communicators XLA's MPI backend (collectives='mpi') makes over every "
                    "process, which the others never join: it would hang. Start "
                    "jaxmpi.distributed with collectives='jaxmpi' (JAX >= 0.10.2) or "
                    "'gloo' for programs over some processes only."
                )
        return executable

    jax_shim.install_compile_hook(compiled)


def explain() -> tuple[str, str]:
    """What `python -m jaxmpi info` says: the choice `initialize` made, or would make."""
    if chosen is not None:
        route, why = chosen
        if route == "jaxmpi":
            done = hlo_pass.rewritten
            why += f" ({done['collectives']} collectives in {done['modules']} programs so far)"
        return route, why
    route, why = choose("auto")
    return route, f"jaxmpi.distributed.initialize() would take it: {why}"
