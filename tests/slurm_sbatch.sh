#!/bin/bash
#SBATCH --job-name=jaxmpi-job
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=10
#SBATCH --output=%x-%j.out
# tests/slurm_sbatch.sh -- the job script of README's "Under Slurm", as tests/slurm_jobs.sh
# submits it: `sbatch [options] tests/slurm_sbatch.sh ARGS...` runs `python ARGS...` on
# every task. Options given to sbatch override the #SBATCH lines. The environment of
# sbatch reaches the script (sbatch's default, --export=ALL): the venv (VIRTUAL_ENV,
# PATH), JAXMPI_* and, for Open MPI's wheel, PMIX_MCA_psec=native. SRUN_MPI is the PMI of
# the venv's MPI: pmi2 (MPICH) or pmix (Open MPI).
set -u
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: $SLURM_NTASKS tasks, srun --mpi=$SRUN_MPI"
srun --mpi="$SRUN_MPI" python "$@"
