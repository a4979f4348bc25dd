#!/usr/bin/env bash
# ci/slurm.sh -- a Slurm cluster of 2 nodes on the simulated hosts of ci/hosts.sh, for
# running jobs the way clusters start them (srun, salloc, sbatch) in CI. Needs root.
#
# usage: ci/slurm.sh up               install Slurm's Debian packages if missing, make hosts
#                                     jxh1 and jxh2 (ci/hosts.sh up 2: a cluster left from
#                                     an earlier run is removed first) and start munge and
#                                     slurmd on both, slurmctld on jxh1; returns once both
#                                     nodes are idle
#        ci/slurm.sh down             stop everything, remove all it made (idempotent)
#        ci/slurm.sh run HOST CMD...  run CMD on HOST with the cluster's configuration
#                                     (SLURM_CONF): srun, sbatch, salloc, squeue, ...
#        ci/slurm.sh conf             print the path of slurm.conf (for SLURM_CONF)
#
# Slurm 22.05 (Debian 12), facts from shared/facts/slurm.md, rechecked here:
#  * One slurmd per host, each in its host's namespaces: it takes its node name from the
#    host name (jxh1, jxh2), and step daemons reach each other at the hosts' addresses.
#  * One munged per host (a socket in the host's own /tmp, one key for the cluster), as on
#    a real cluster: a node lost takes its munged with it. The daemons also see it at
#    munge's default path, /run/munge (bound in their own mount namespace; `up` makes the
#    empty folder if missing, `down` removes it if still empty): Slurm's PMIx server then
#    asks its clients for munge security as on a real cluster, which Open MPI's wheel
#    cannot give (PMIX_MCA_psec=native is needed, as users need it).
#  * `ip netns exec` (how ci/hosts.sh enters a host) mounts a fresh /sys, without
#    /sys/fs/cgroup; slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc and
#    task/none, and exits ("No filesystem mounted on /sys/fs/cgroup") unless one is there:
#    each host's daemons get a cgroup2 mount in their own mount namespace.
#  * CPUs per node: what `slurmd -C` sees in the host (the machine's cores: every host
#    shares them); TmpFS is /tmp, which is each host's own (PMIx puts its per-job
#    directories there; a /tmp shared by two slurmd makes the second pmix step fail).
#  * Time limits, node failures and kills are noticed within seconds, not Slurm's
#    minutes-long defaults (see the timers in write_conf): the fault tests measure them.
#
# Everything lives under the hosts' state folder (ci/hosts.sh's JXH_STATE, a tmpfs that
# `down` unmounts): configuration, state, spool, logs, the munge key. Nothing is started in
# the root namespace and nothing is written outside that folder (but for the packages).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/ci/slurm.sh"
JXH="$ROOT/ci/hosts.sh"
STATE=${JXH_STATE:-/run/jxh}
DIR=$STATE/slurm
CONF=$DIR/slurm.conf
NODES=(jxh1 jxh2)
CONTROLLER=jxh1
# munged's socket: a path in each host's own /tmp, so each host talks to its own munged.
MUNGE_DIR=/tmp/munge

die() {
    echo "slurm.sh: $*" >&2
    exit 2
}

# Debian's packages (daemons, clients, the mpi plugins pmi2 and pmix, munge):
# JAXMPI_SLURM_PACKAGES in ci/setup.sh, which installs them ahead of this step.
install_packages() {
    # shellcheck source=setup.sh source-path=SCRIPTDIR
    source "$ROOT/ci/setup.sh" # defines _setup_apt, does nothing else when sourced
    _setup_apt "${JAXMPI_SLURM_PACKAGES[@]}" >/dev/null || die "could not install ${JAXMPI_SLURM_PACKAGES[*]}"
}

write_conf() {
    local node line
    cat >"$CONF" <<EOF
ClusterName=jx
SlurmctldHost=$CONTROLLER(10.251.7.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_DIR/munge.socket.2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Backfill schedules heterogeneous jobs (srun ... : ...); every second, not every 30 s.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
TmpFS=/tmp
ReturnToService=2
# A node whose slurmd stops answering is DOWN after this many seconds (default 300).
SlurmdTimeout=10
# SIGTERM, then SIGKILL this many seconds later, on scancel and at the time limit (30).
KillWait=5
# Finished jobs stay known to slurmctld this long (300). Also paces sbatch --wait: it polls
# after 2 s, then 4 times longer each time while that is below MinJobAge / 2, at most
# 32 s (a job of 11 s was seen back 42 s after it was submitted): here every 8 s.
MinJobAge=10
EOF
    for node in "${NODES[@]}"; do
        # What the host's slurmd sees: CPUs, sockets, cores, memory.
        line=$("$JXH" run "$node" slurmd -C | head -n 1) || die "slurmd -C failed on $node"
        echo "$line NodeAddr=10.251.7.${node#jxh} State=UNKNOWN" >>"$CONF"
    done
    # Two jobs may share a core: a long job (the time-limit case) leaves room for others.
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2" >>"$CONF"
}

# __daemons HOST (run inside HOST by `up`): cgroup2 for slurmd, munged, the daemons.
daemons() {
    local host=$1
    if ! mountpoint -q /sys/fs/cgroup; then
        mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd &&
            mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd || exit 1
    fi
    mkdir -p "$MUNGE_DIR" && chown munge:munge "$MUNGE_DIR" && chmod 0755 "$MUNGE_DIR" || exit 1
    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_DIR/munge.socket.2" \
        --key-file="$DIR/munge.key" --pid-file="$MUNGE_DIR/munged.pid" \
        --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" || exit 1
    mount --bind "$MUNGE_DIR" /run/munge || exit 1 # only in this mount namespace
    if [[ $host == "$CONTROLLER" ]]; then
        slurmctld -f "$CONF" -i || exit 1
    fi
    slurmd -f "$CONF" || exit 1
}

wait_idle() {
    local i state
    for ((i = 0; i < 150; i++)); do
        state=$(run_on "$CONTROLLER" sinfo -h -N -o '%N %t' 2>/dev/null | sort | tr '\n' ' ')
        [[ $state == "jxh1 idle jxh2 idle " ]] && return 0
        sleep 0.2
    done
    echo "slurm.sh: nodes not idle after 30 s: ${state:-no answer from slurmctld}" >&2
    tail -n 5 "$DIR"/log/*.log >&2
    return 1
}

up() {
    install_packages
    # A checkout under /tmp must be seen by every node (each host has its own /tmp).
    [[ $ROOT == /tmp/* ]] && export JXH_SHARE="$ROOT ${JXH_SHARE:-}"
    "$JXH" up "${#NODES[@]}" >/dev/null || die "ci/hosts.sh up failed"
    mkdir -p "$DIR"/{state,run,log} "${NODES[@]/#/$DIR/spool/}"
    # One key for every node's munged, readable by munge alone (munged checks).
    head -c 1024 /dev/urandom >"$DIR/munge.key"
    chown munge:munge "$DIR/munge.key" && chmod 0400 "$DIR/munge.key"
    write_conf
    mkdir -p /run/munge || die "cannot make /run/munge"
    local node
    for node in "${NODES[@]}"; do
        "$JXH" run "$node" "$SELF" __daemons "$node" || die "could not start the daemons on $node (logs: $DIR/log)"
    done
    wait_idle || exit 1
    echo "slurm.sh: up: nodes ${NODES[*]}, controller $CONTROLLER, SLURM_CONF=$CONF"
}

run_on() {
    local host=$1
    shift
    [[ -f $CONF ]] || die "run: no cluster (slurm.sh up first?)"
    SLURM_CONF=$CONF "$JXH" run "$host" "$@"
}

cmd=${1:-}
shift || true
case $cmd in
up) up ;;
down)
    "$JXH" down >/dev/null || exit 1
    rmdir /run/munge 2>/dev/null # up's, unless a munged of this machine's uses it
    echo "slurm.sh: down: clean"
    ;;
run) run_on "$@" ;;
conf) echo "$CONF" ;;
__daemons) daemons "$@" ;;
*) sed -n '2,13p' "$SELF" | sed 's/^# \{0,1\}//' >&2 && exit 2 ;;
esac
