"""Jobs that Slurm's srun starts itself: srun hands each task its place in the job through
a PMI that the MPI library must speak (PMI-2 for MPICH, PMIx for Open MPI). With another
one, or none (`--mpi=none`, often the cluster's default), MPI starts every task as a job
of its own, of one rank: the program runs N times alone and exits 0, with wrong results.
Here that is refused at import, naming the option that works.

Self-contained (the environment, the world's size and the library's family in; an error
out), called once where the world's size is first known."""

from __future__ import annotations

import os
from collections.abc import Mapping

# The srun --mpi that each family of MPI library loaded by jaxmpi needs: MPICH and its
# family (the MPI-5 ABI build is MPICH's) take their rank from Slurm's PMI-2 server
# (MPICH's PMI-1 client talks to it), Open MPI 5 only speaks PMIx.
SRUN_MPI = {"mpich": "pmi2", "mpiabi": "pmi2", "openmpi": "pmix"}

# A launcher's own count of the ranks it started (mpirun's; hydra's and srun's PMI-2):
# "1" means a world of 1 is what the user asked for, whatever else the Slurm step holds.
_LAUNCHER_SIZES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# Set for the ranks that Open MPI's mpirun and MPICH's mpiexec (hydra) start, never for
# srun's own tasks. (Ranks of those launchers under salloc may carry SLURM_STEP_ID too:
# srun started the launchers' daemons.)
_LAUNCHER_ONLY = ("OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID")

EXPORT_ADVICE = (
    "srun passes its own environment to every task unless --export limits it: give every "
    "part of the job the same variables (--export=ALL, or the same list for each component "
    "of `srun ... : ...`), not a per-task wrapper or a node's shell start-up files."
)


def started_by_srun(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a task that srun started itself (not a rank of mpirun or
    mpiexec run inside an allocation)."""
    return "SLURM_STEP_ID" in env and not any(name in env for name in _LAUNCHER_ONLY)


def check_world(world_size: int, family: str, env: Mapping[str, str] = os.environ) -> None:
    """Raises RuntimeError if this process is a task of an srun step of several tasks
    that MPI started alone (world of size 1)."""
    tasks = env.get("SLURM_STEP_NUM_TASKS", "")
    if world_size != 1 or not tasks.isdigit() or int(tasks) < 2:
        return
    if any(env.get(name) == "1" for name in _LAUNCHER_SIZES):
        return
    wanted = SRUN_MPI.get(family)
    used = env.get("SLURM_MPI_TYPE")
    given = f"--mpi={used}" if used else "--mpi=none, or no --mpi where that is the default"
    option = f"srun --mpi={wanted}" if wanted else "the srun --mpi of your MPI library"
    extra = " and PMIX_MCA_psec=native in the environment" if family == "openmpi" else ""
    raise RuntimeError(
        f"jaxmpi: srun started {tasks} tasks, but MPI sees this one alone (a world of 1 "
        f"rank): srun handed them no PMI that {family} speaks ({given}), so every task "
        f"would run as a separate job. Start the job with `{option}`{extra} (`srun "
        "--mpi=list` shows what this Slurm offers), or with mpirun/mpiexec inside the "
        "allocation (salloc or sbatch)."
    )
