#!/usr/bin/env bash
# ci/soak.sh -- the lite soak (benches/soak.py --lite) on 2 ranks of the default MPI
# (the first build of ci/matrix.sh, PyPI MPICH 5): 3x10^5 small ops, 300 ops of 16 MiB and
# 4000 eager ops, resident memory sampled after every call. Fails if memory grows beyond
# the bound benches/soak.py states, or if the job does not finish in
# JAXMPI_SOAK_TIMEOUT seconds (default 300; it takes about a minute).
#
# usage: ci/soak.sh [extra benches/soak.py flags, e.g. --bound-mib 8]
# PYTHONPATH, if set, is passed to the job (to soak a build not installed in the venvs).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=matrix.sh source-path=SCRIPTDIR
source "$ROOT/ci/matrix.sh"

build=${JAXMPI_MATRIX_BUILDS[0]}
env=(JAX_PLATFORMS=cpu)
[[ -n ${PYTHONPATH:-} ]] && env+=("PYTHONPATH=$PYTHONPATH")
JAXMPI_CELL_TIMEOUT=${JAXMPI_SOAK_TIMEOUT:-300} \
    matrix_exec "$build" 2 "${env[@]}" -- python "$ROOT/benches/soak.py" --lite "$@"
