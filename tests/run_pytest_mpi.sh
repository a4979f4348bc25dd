#!/usr/bin/env bash
# tests/run_pytest_mpi.sh -- run the Python test suite on several MPI ranks.
#
# usage: tests/run_pytest_mpi.sh [LAUNCHER WORDS...] -- [PYTEST ARGS...]
#   e.g. tests/run_pytest_mpi.sh .venvs/mpich/bin/mpiexec -n 2 -- -q tests/python
#        tests/run_pytest_mpi.sh mpirun --oversubscribe -np 4 -- -x tests/python
#        tests/run_pytest_mpi.sh -- tests/python          (one rank, no launcher)
#
# Runs `LAUNCHER python -m pytest -p no:cacheprovider PYTEST ARGS` with `python` from
# PATH, on the CPU unless JAX_PLATFORMS says otherwise, one JAX device per rank. Every
# rank runs the whole suite (the tests keep the ranks in step; see tests/python/helpers.py).
#
# Output: rank 0's output as it comes; every other rank writes to a log file, which is
# printed (each line prefixed with "[rank N]") only if that rank failed.
#
# Exit status: 0 if every rank passed or collected no tests (pytest's 5), else 1.
# A rank that never reported back (killed, or the job timed out) counts as failed.
#
# Environment:
#   JAXMPI_TEST_TIMEOUT  seconds for the whole job (default 600; 0: no limit)
#   JAXMPI_TEST_LOGDIR   keep the per-rank logs there (default: a temporary folder,
#                        removed afterwards)
#   JAXMPI_TEST_JUNITDIR write each rank's pytest junit report there (rankN.xml)
#   JAX_PLATFORMS        kept if set (ci/gpu_run.sh sets cuda,cpu); default cpu
set -u -o pipefail

# --- Per-rank wrapper (the script runs itself under the launcher) ---------------------
if [[ ${1-} == --as-rank ]]; then
    logdir=$2
    shift 2
    rank=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}}
    : >"$logdir/rank$rank.started"
    # One report per rank: a test can pass on one rank and be skipped on another.
    if [[ -n ${JAXMPI_TEST_JUNITDIR-} ]]; then
        set -- "$@" "--junitxml=$JAXMPI_TEST_JUNITDIR/rank$rank.xml"
    fi
    if [[ $rank == 0 ]]; then
        "$@" 2>&1 | tee "$logdir/rank$rank.log"
        (exit "${PIPESTATUS[0]}")
    else
        "$@" >"$logdir/rank$rank.log" 2>&1
    fi
    echo $? >"$logdir/rank$rank.rc"
    # Always 0: some launchers kill the other ranks as soon as one exits non-zero, which
    # would cut their logs short. The real status is in the .rc file.
    exit 0
fi

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

launcher=()
while (($#)) && [[ $1 != -- ]]; do
    launcher+=("$1")
    shift
done
[[ ${1-} == -- ]] || usage
shift
pytest_args=("$@")

# How many ranks the launcher was asked for, if it says so the usual way (-n N, -np N).
expected_ranks=
for ((i = 0; i < ${#launcher[@]}; i++)); do
    case ${launcher[i]} in
    -n | -np | --np) expected_ranks=${launcher[i + 1]-} ;;
    -n=* | -np=* | --np=*) expected_ranks=${launcher[i]#*=} ;;
    esac
done

if [[ -n ${JAXMPI_TEST_LOGDIR-} ]]; then
    logdir=$JAXMPI_TEST_LOGDIR
    mkdir -p "$logdir" && rm -f "$logdir"/rank*.{started,rc,log}
else
    logdir=$(mktemp -d "${TMPDIR:-/tmp}/jaxmpi-pytest.XXXXXX") || exit 1
    trap 'rm -rf "$logdir"' EXIT
fi

# A caller may ask for the GPU, or for several CPU devices per rank; the default stays the
# CPU, one device per rank.
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
[[ ${XLA_FLAGS-} == *xla_force_host_platform_device_count* ]] ||
    export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=1"
export PYTHONDONTWRITEBYTECODE=1 # ranks would race writing the same .pyc files
export PYTHONUNBUFFERED=1

timeout_cmd=()
limit=${JAXMPI_TEST_TIMEOUT:-600}
if [[ $limit != 0 ]] && command -v timeout >/dev/null; then
    timeout_cmd=(timeout -k 10 "$limit")
fi

"${timeout_cmd[@]}" "${launcher[@]}" bash "$0" --as-rank "$logdir" \
    python -m pytest -p no:cacheprovider "${pytest_args[@]}"
launcher_rc=$?

# --- Collect every rank's status -------------------------------------------------------
failed=0
started=0
ranks=()
for f in "$logdir"/rank*.started; do
    [[ -e $f ]] || continue
    r=${f##*/rank}
    ranks+=("${r%.started}")
done
mapfile -t ranks < <(printf '%s\n' "${ranks[@]}" | sort -n)
summary=()
failed_tests() { # the ids of the tests a pytest log lists as FAILED, sorted
    awk '$1 == "FAILED" {print $2}' "$1" 2>/dev/null | sort -u
}
for r in "${ranks[@]}"; do
    [[ -n $r ]] || continue
    started=$((started + 1))
    rc=$(cat "$logdir/rank$r.rc" 2>/dev/null) || rc="none (killed?)"
    case $rc in
    0 | 5) continue ;;
    esac
    failed=1
    summary+=("rank $r: pytest exit status $rc")
    if [[ $r != 0 && -f $logdir/rank$r.log ]]; then
        if [[ -n $(comm -23 <(failed_tests "$logdir/rank$r.log") <(failed_tests "$logdir/rank0.log")) ]]; then
            # Tests failed here that did not fail on rank 0 (there they are only reported
            # as "failed on rank(s) ..."), so rank 0's output lacks the details: all of it.
            printf '\n===== output of rank %s (exit status %s) =====\n' "$r" "$rc"
            sed "s/^/[rank $r] /" "$logdir/rank$r.log"
        else
            # Rank 0 failed too and showed the details: the summary is enough.
            printf '\n===== summary of rank %s (exit status %s; full log: %s) =====\n' \
                "$r" "$rc" "${JAXMPI_TEST_LOGDIR:-set JAXMPI_TEST_LOGDIR to keep it}"
            sed -n '/short test summary info/,$p' "$logdir/rank$r.log" | sed "s/^/[rank $r] /"
            grep -q 'short test summary info' "$logdir/rank$r.log" ||
                tail -n 40 "$logdir/rank$r.log" | sed "s/^/[rank $r] /"
        fi
    fi
done

if ((started == 0)); then
    summary+=("no rank started (launcher exit status $launcher_rc)")
    failed=1
elif [[ -n $expected_ranks && $started != "$expected_ranks" ]]; then
    summary+=("$started of $expected_ranks ranks started")
    failed=1
fi
if ((launcher_rc != 0)); then
    ((launcher_rc == 124 || launcher_rc == 137)) && summary+=("timed out after ${limit}s")
    summary+=("launcher exit status $launcher_rc")
    failed=1
fi

echo
if ((failed)); then
    printf 'run_pytest_mpi: FAILED (%s rank(s) ran):\n' "$started"
    printf '  %s\n' "${summary[@]}"
    exit 1
fi
echo "run_pytest_mpi: passed on $started rank(s)"
exit 0
