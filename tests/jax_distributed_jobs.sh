#!/usr/bin/env bash
# tests/jax_distributed_jobs.sh -- where plain `jax.distributed.initialize()` cannot start
# from an MPI job and `jaxmpi.distributed.initialize()` can (the sharding guide says both):
#   - Open MPI 5's mpirun, JAX 0.12, no mpi4py (.venvs/py3.13-jax-0.12-openmpi): JAX
#     (0.11.2 and later) raises "Open MPI 5 or newer requires mpi4py"; jaxmpi starts it;
#   - MPICH's mpiexec with a Slurm allocation's variables left in the environment (one task,
#     SLURM_PROCID=0 on every rank, as `salloc` then `mpiexec` gives): JAX takes them for its
#     Slurm cluster and waits for a coordinator that never comes; jaxmpi starts it.
# Both at 2 ranks, in the trixie chroot (Python 3.13). About 20 s. Prints "N passed, N failed".
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=expect.sh
source "$ROOT/tests/expect.sh"

# in_trixie VENV [VAR=VALUE...] -- LAUNCHER...: STARTER under LAUNCHER, with
# VENV's tools, in a clean environment inside the chroot.
in_trixie() {
    local venv=$1
    shift
    local -a env=()
    while [[ $1 != -- ]]; do env+=("$1") && shift; done
    shift
    bash "$ROOT/ci/trixie.sh" run env -i HOME="$HOME" LANG=C.UTF-8 JAX_PLATFORMS=cpu \
        PATH="$ROOT/.venvs/$venv/bin:/usr/bin:/bin" OMPI_ALLOW_RUN_AS_ROOT=1 \
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${env[@]}" timeout 90 "$@" python -c "$STARTER"
}

# JAXMPI_TEST_STARTER: jax (plain jax.distributed.initialize()) or jaxmpi.
STARTER='
import os
try:
    import mpi4py  # noqa: F401
    have = "with mpi4py"
except ImportError:
    have = "without mpi4py"
if os.environ["JAXMPI_TEST_STARTER"] == "jax":
    import jax
    jax.distributed.initialize()
else:
    import jaxmpi
    jaxmpi.distributed.initialize()
    import jax
print(f"started: process {jax.process_index()} of {jax.process_count()}, {have}")'

mpirun=(mpirun --oversubscribe -n 2)
expect "Open MPI 5, plain jax.distributed.initialize(): refused without mpi4py" \
    fail 'RuntimeError: Open MPI 5 or newer requires mpi4py' \
    in_trixie py3.13-jax-0.12-openmpi JAXMPI_TEST_STARTER=jax -- "${mpirun[@]}"
expect "Open MPI 5, jaxmpi.distributed.initialize(): started without mpi4py" \
    0 'process 0 of 2, without mpi4py;process 1 of 2, without mpi4py' \
    in_trixie py3.13-jax-0.12-openmpi JAXMPI_TEST_STARTER=jaxmpi -- "${mpirun[@]}"
slurm=(SLURM_JOB_ID=4242 SLURM_STEP_NODELIST=node001 SLURM_NTASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0)
expect "MPICH with a Slurm allocation's variables, jaxmpi.distributed.initialize(): started" \
    0 'started: process 0 of 2;started: process 1 of 2' \
    in_trixie py3.13-jax-0.12 JAXMPI_TEST_STARTER=jaxmpi "${slurm[@]}" -- mpiexec -n 2
expect_summary
