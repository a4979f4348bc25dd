#!/usr/bin/env bash
# tests/rank_death.sh -- one rank dies with SIGKILL mid-job: does the job end?
#
# usage: tests/rank_death.sh
#
# On every build of ci/matrix.sh (JAXMPI_MATRIX_ONLY selects) at 2 and 3 ranks (3: see
# SAME_AS_FIRST), runs
# tests/rank_death_job.py (jitted allreduce + sendrecv in a loop; the last rank kills
# itself after a few seconds) and checks that
#   * the launcher exits within JAXMPI_RANK_DEATH_LIMIT seconds (default 60) of the
#     launch, killed by `timeout` otherwise,
#   * with a non-zero status,
#   * having said why (the launcher's or the library's diagnostic naming the dead rank
#     or the signal),
#   * and no rank of the job is left running 5 s after the launcher has exited.
# Prints a table: build, ranks, seconds from the death to the launcher's exit / to the
# last rank gone, result.
# Exit status: 0 if every cell passed (or was skipped: optional build not installed).
#
# Environment: JAXMPI_RANK_DEATH_LIMIT, JAXMPI_RANK_DEATH_AFTER (seconds before the
# victim dies, default 3), JAXMPI_RANK_DEATH_RANKS (default "2 3"), JAXMPI_MATRIX_ONLY;
# PYTHONPATH, if set, is passed to the job (to test a build not installed in the venvs);
# JAXMPI_RANK_DEATH_LOGDIR keeps the logs there (default: a temporary folder).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh source-path=SCRIPTDIR
source "$ROOT/ci/matrix.sh"

limit=${JAXMPI_RANK_DEATH_LIMIT:-60}
die_after=${JAXMPI_RANK_DEATH_AFTER:-3}
ORPHAN_GRACE=5 # seconds
read -r -a rank_counts <<<"${JAXMPI_RANK_DEATH_RANKS:-2 3}"
matrix_logdir "${JAXMPI_RANK_DEATH_LOGDIR:-}" jaxmpi-rank-death
extra_env=()
[[ -n ${PYTHONPATH:-} ]] && extra_env+=("PYTHONPATH=$PYTHONPATH")

# What a launcher (or jaxmpi) prints when a rank died: MPICH hydra "BAD TERMINATION ...
# KILLED BY SIGNAL: 9", Open MPI "exited on signal 9 (Killed)", Intel MPI like MPICH.
DIAGNOSTIC='signal:? ?9|BAD TERMINATION|exited on signal|Killed|killed|process.*(died|failed|lost)|jaxmpi.*(timeout|waiting)'

# Not at 3 ranks: the builds over the first build's MPICH 5.0.2 wheel and its hydra (its
# ABI library, the other JAX releases); a death ends the job by the launcher's and
# library's doing, which pypi-mpich-5 runs at 3 (saves ~18 s).
SAME_AS_FIRST=(pypi-mpich-5-abi jax-0.6-mpich-5 jax-0.12-py3.13 jax-0.11-py3.13)
rows=()
failed=0
for build in "${JAXMPI_MATRIX_BUILDS[@]}"; do
    for n in "${rank_counts[@]}"; do
        [[ $n == 3 && " ${SAME_AS_FIRST[*]} " == *" $build "* ]] && continue
        log="$logdir/$build-n$n.log"
        if reason=$(matrix_skip_reason "$build"); then
            rows+=("$build|$n|-|skip|$reason")
            continue
        fi
        # The environment a user of this MPI sets for mpi4py (which jaxmpi imports if present).
        pyenv=()
        [[ ${JAXMPI_MATRIX_PYENV[$build]} != - ]] && read -r -a pyenv <<<"${JAXMPI_MATRIX_PYENV[$build]}"
        start=$(date +%s.%N)
        JAXMPI_CELL_TIMEOUT=$limit matrix_exec "$build" "$n" "${pyenv[@]}" "${extra_env[@]}" -- \
            python "$ROOT/tests/rank_death_job.py" --die-after "$die_after" >"$log" 2>&1
        rc=$?
        end=$(date +%s.%N)
        died=$(sed -n 's/.*SIGKILL to myself after .* calls at \([0-9.]*\).*/\1/p' "$log" | head -n 1)
        total=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')

        # Ranks of this job still alive after the launcher is gone. Some launchers exit as
        # soon as they have signalled the ranks, so give them a few seconds to go.
        pids=$(sed -n 's/^rank [0-9]*\/[0-9]*: pid \([0-9]*\) running.*/\1/p' "$log")
        survivors=()
        for ((tenths = 0; tenths <= 10 * ORPHAN_GRACE; tenths++)); do
            survivors=()
            for pid in $pids; do
                kill -0 "$pid" 2>/dev/null && survivors+=("$pid")
            done
            ((${#survivors[@]})) || break
            sleep 0.1
        done
        ((${#survivors[@]})) && kill -KILL "${survivors[@]}" 2>/dev/null
        gone=$(date +%s.%N)
        after=-
        [[ -n $died ]] && after=$(awk -v a="$died" -v b="$end" -v c="$gone" \
            'BEGIN {printf "%.1f / %.1f", b - a, c - a}')

        problems=()
        [[ -z $died ]] && problems+=("the victim never died (job failed before?)")
        # 137 alone is no timeout: Open MPI's launcher exits 128+9 for a rank killed by
        # signal 9.
        if ((rc == 124)) || ((rc == 137)) && awk -v t="$total" -v l="$limit" 'BEGIN {exit !(t >= l)}'; then
            problems+=("HUNG: killed by timeout after ${limit}s")
        elif ((rc == 0)); then
            problems+=("exit status 0")
        fi
        grep -a -q -E "$DIAGNOSTIC" <(grep -a -v -E '^\+ |SIGKILL to myself' "$log") ||
            problems+=("no diagnostic in the output")
        ((${#survivors[@]})) && problems+=("ranks left running ${ORPHAN_GRACE}s after the launcher exited: ${survivors[*]}")
        if ((${#problems[@]})); then
            failed=1
            rows+=("$build|$n|$after|FAIL|exit $rc, total ${total}s; $(
                IFS=';'
                echo "${problems[*]}"
            )")
            printf '\n===== %s n=%s: FAIL (%s) =====\n' "$build" "$n" "${problems[*]}"
            tail -n 30 "$log"
        else
            diagnostic=$(grep -a -v -E '^\+ |SIGKILL to myself' "$log" | grep -a -m 1 -E "$DIAGNOSTIC" |
                tr -s ' ' | cut -c 1-70)
            rows+=("$build|$n|$after|pass|exit $rc, total ${total}s: $diagnostic")
        fi
    done
done

printf '\nrank death: the last rank SIGKILLs itself %ss into the job (limit %ss)\n' \
    "$die_after" "$limit"
fmt='%-20s %-5s %-17s %-6s %s\n'
# shellcheck disable=SC2059  # the format is ours
printf "$fmt" build ranks "s to exit / gone" result notes
for row in "${rows[@]}"; do
    IFS='|' read -r b n after result note <<<"$row"
    # shellcheck disable=SC2059
    printf "$fmt" "$b" "$n" "$after" "$result" "$note"
done
exit "$failed"
