"""Which GPU this rank uses, chosen before MPI initializes: MPIs that set up CUDA in
`MPI_Init` (Cray MPICH's GTL, Intel MPI's offload, UCX's CUDA transports) bind to the
device current then, GPU 0 when none is, and two ranks of a node would then share it.

Before `MPI_Init` there is no communicator to ask for the rank's place on its node; the
launchers say it in their environment (`LAUNCHERS`). Where none does, the choice waits
for MPI (`gpu.py`), which this module's caller reports.

The rule (`plan`), first match wins:
1. `JAXMPI_GPU=<n>`: GPU n; `JAXMPI_GPU=jax`: no choice, JAX's own.
2. An explicit `jax_cuda_visible_devices` (set with `jax.config.update` before
   `import jaxmpi`; JAX reads no environment variable for it): the user's, never
   overwritten; one device is this rank's.
3. Node-local rank modulo the GPUs this process sees. `CUDA_VISIBLE_DEVICES` listing
   several GPUs is no choice of one: a job step that gives every task all of a node's GPUs
   (`srun` with `--gres=gpu:4` and no binding) lists them all for every rank, and each
   rank's JAX would then allocate on every one of them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import jax

from .. import _native

#: (variable holding the rank's place on its node, variable holding the ranks there), as
#: each launcher sets them. Slurm's comes last: `mpirun` inside a batch script inherits
#: the script's own SLURM_LOCALID (0 on every rank), which the launcher's variable corrects.
LAUNCHERS: tuple[tuple[str, str | None], ...] = (
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),  # Open MPI, PRRTE
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # MPICH's and Intel MPI's hydra
    ("PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),  # Cray PALS
    ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),  # MVAPICH
    ("SLURM_LOCALID", None),  # srun
)


@dataclass(frozen=True)
class LocalRank:
    rank: int
    size: int | None
    #: The variable it came from, or "MPI_COMM_TYPE_SHARED" once MPI says it.
    source: str


@dataclass(frozen=True)
class Choice:
    #: The ordinal (among the GPUs this process sees) of this rank's GPU; None: jaxmpi
    #: chose none (JAX's choice, or several GPUs the user gave JAX).
    gpu: int | None
    why: str
    #: What to set `jax_cuda_visible_devices` to; None: leave it (the user's, or no GPU).
    jax_option: str | None = None
    #: True when the node-local rank is not known yet: choose again after MPI_Init.
    needs_mpi: bool = False


def launcher_local_rank(environ: Mapping[str, str]) -> LocalRank | None:
    """This rank's place among the ranks of its node, as its launcher said it."""
    for rank_var, size_var in LAUNCHERS:
        rank = environ.get(rank_var, "").strip()
        if rank.isdigit():
            size = environ.get(size_var, "").strip() if size_var else ""
            return LocalRank(int(rank), int(size) if size.isdigit() else None, rank_var)
    return None


def plan(
    environ: Mapping[str, str], devices: int, jax_visible: str, local: LocalRank | None
) -> Choice:
    """The rule of the module's note, for a process that sees `devices` GPUs, whose
    `jax_cuda_visible_devices` is `jax_visible` ("all" unless the user set it)."""
    wanted = environ.get("JAXMPI_GPU", "auto").strip()
    users_jax = jax_visible.strip() not in ("", "all")
    if devices == 0:
        return Choice(None, "the driver sees no GPU")
    if wanted == "jax":
        return Choice(None, "JAXMPI_GPU=jax: JAX chooses")
    if wanted not in ("", "auto"):
        if not wanted.isdigit() or int(wanted) >= devices:
            raise ValueError(
                f"JAXMPI_GPU={wanted!r}: use a GPU number below {devices}, auto, or jax"
            )
        if users_jax and jax_visible.strip() != wanted:
            raise ValueError(
                f"JAXMPI_GPU={wanted} and jax_cuda_visible_devices={jax_visible!r} choose "
                "different GPUs: set one of them"
            )
        option = None if users_jax else wanted
        return Choice(int(wanted), f"JAXMPI_GPU={wanted}", option)
    if users_jax:
        ids = [i.strip() for i in jax_visible.split(",")]
        if len(ids) == 1 and ids[0].isdigit():
            return Choice(int(ids[0]), f"jax_cuda_visible_devices={jax_visible} (the user's)")
        return Choice(None, f"jax_cuda_visible_devices={jax_visible} (the user's): JAX uses those")
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"{devices} GPU(s)"
    if listed is not None:
        seen += f" (CUDA_VISIBLE_DEVICES={listed})"
    if local is None:
        return Choice(None, "no launcher variable gives the node-local rank", needs_mpi=True)
    gpu = local.rank % devices
    return Choice(gpu, f"node-local rank {local.rank} (from {local.source}) mod {seen}", str(gpu))


def cuda_plugin() -> bool:
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


def excluded_by_platforms(platforms: str | None) -> bool:
    """Whether `jax_platforms` (JAX_PLATFORMS) leaves CUDA out: then no GPU op can run,
    and the driver is not even loaded."""
    if not platforms:
        return False
    names = {p.strip().lower() for p in platforms.split(",")}
    return not names & {"cuda", "gpu"}


def jax_option(name: str):
    """JAX's option `name`, read as JAX allows: options with a context manager
    (`jax_platforms`) only as attributes, plain flags (`jax_cuda_visible_devices`) only
    through `read`; each refuses the other way on some JAX versions."""
    try:
        return getattr(jax.config, name)
    except AttributeError:
        return jax.config.read(name)


def apply(choice: Choice) -> None:
    """Makes the choice effective: JAX's option (before its GPU client starts, which no
    jaxmpi import does), the current device of this thread, and the check on arrays."""
    if choice.jax_option is not None:
        jax.config.update("jax_cuda_visible_devices", choice.jax_option)
    if choice.gpu is not None:
        _native.use_gpu(choice.gpu)
    _native.set_rank_gpu(choice.gpu)


@dataclass
class Early:
    """What was found of CUDA before MPI_Init, and the choice made then."""

    #: Why CUDA is not used at all, or None.
    unused: str | None
    cuda: dict
    local: LocalRank | None = None
    choice: Choice | None = None
    #: Whether MPI was initialized before jaxmpi could choose (mpi4py imported first).
    mpi_was_up: bool = False


def before_mpi_init() -> Early:
    """Chooses this rank's GPU, where CUDA is wanted, before MPI initializes."""
    if not cuda_plugin():
        return Early("this jaxlib has no CUDA plugin", {})
    platforms = jax_option("jax_platforms")
    if excluded_by_platforms(platforms):
        return Early(f"JAX_PLATFORMS={platforms} leaves CUDA out", {})
    found = _native.cuda_info()
    cuda = dict(found)
    early = Early(None, cuda, mpi_was_up="mpi4py.MPI" in sys.modules)
    if not cuda["driver"]:
        return early
    early.local = launcher_local_rank(os.environ)
    visible = jax_option("jax_cuda_visible_devices")
    early.choice = plan(os.environ, found["devices"], str(visible), early.local)
    if not early.choice.needs_mpi:
        apply(early.choice)
    return early
