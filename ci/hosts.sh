#!/usr/bin/env bash
# ci/hosts.sh -- a simulated cluster of 2-3 hosts on this one Linux machine, for running
# MPI jobs "across hosts" in CI (see ci/multihost.sh). Needs root (netns, veth, mounts).
#
# usage: ci/hosts.sh up [N]            make hosts jxh1..jxhN (default 2; at most 9); a
#                                      cluster left from an earlier run is removed first
#        ci/hosts.sh down              kill what runs on the hosts, remove all it made
#                                      (idempotent: safe to call twice or with none up)
#        ci/hosts.sh run HOST CMD...   run CMD on HOST (its namespaces and mounts)
#        ci/hosts.sh cut HOST          unplug HOST's cable (no FIN/RST: the peers see
#                                      silence, as with a dead switch port or power loss)
#        ci/hosts.sh heal HOST         plug it back
#        ci/hosts.sh crash HOST        SIGKILL every process on HOST (the kernel stays up,
#                                      so peers get RST at once: an OOM kill, a killed job)
#        ci/hosts.sh pids HOST         the pids of the processes on HOST, one a line
#
# A host jxhN is: network namespace jxhN whose only link is `jxnet0` (10.251.7.N/24, no
# default route), a veth to port vjxhN of bridge jxbr0 in namespace jxsw (the "switch");
# its own hostname (UTS namespace) and SysV IPC (IPC namespace), both held open by bind
# mounts; its own /dev/shm and /tmp; and /etc/hosts naming every host, shared by all.
# Nothing is added to the root namespace: no address, no route, no link, so traffic can
# reach only the simulated hosts (and each host's loopback).
#
# Why each piece (found by building a prototype; see shared/facts/multihost.md):
#  * hostname: MPI places ranks and finds node-local peers by it.
#  * /dev/shm, /tmp, IPC: shared memory and the launchers' session dirs and unix sockets
#    must not cross "hosts", else MPI would use them instead of TCP between hosts.
#  * /etc/hosts: each host's own name must resolve to its jxnet0 address (Debian's
#    127.0.1.1 line would make the launchers advertise loopback to the others).
#  * Every entry makes a fresh mount namespace (`ip netns exec` does) and bind-mounts the
#    host's dirs there: persistent per-host mount namespaces cannot be entered from
#    inside another one, which a launcher on jxh1 starting work on jxh2 must do.
#
# State (namespace handles, per-host dirs) lives in JXH_STATE (default /run/jxh, a tmpfs
# mounted there): not under /tmp, which every host replaces with its own. Directories
# under /tmp that all hosts must see (a checkout, TMPDIR) go in JXH_SHARE (space
# separated) at `up`; anything outside /tmp (/work, /root, the venvs) is seen by all.
set -u -o pipefail

STATE=${JXH_STATE:-/run/jxh}
SUBNET=10.251.7
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"

die() {
    echo "hosts.sh: $*" >&2
    exit 2
}

hosts() { # the hosts that exist now, by name
    ip netns list 2>/dev/null | awk '$1 ~ /^jxh[0-9]+$/ {print $1}' | sort
}

known() { [[ $1 =~ ^jxh[0-9]$ && -e $STATE/$1/uts ]]; }

pids_of() { ip netns pids "$1" 2>/dev/null; }

# kill_all HOST: SIGKILL every process in HOST's network namespace, again until none is
# left (a process may fork while we kill); gives up after 5 s and says which remain.
kill_all() {
    local host=$1 i pids
    for ((i = 0; i < 50; i++)); do
        pids=$(pids_of "$host")
        [[ -z $pids ]] && return 0
        # shellcheck disable=SC2086  # one pid a word
        kill -KILL $pids 2>/dev/null
        sleep 0.1
    done
    echo "hosts.sh: still running on $host after 5 s: $(pids_of "$host" | tr '\n' ' ')" >&2
    return 1
}

down() {
    local host h ok=0
    for host in $(hosts); do kill_all "$host" || ok=1; done
    for host in $(hosts); do ip netns del "$host" 2>/dev/null; done
    ip netns del jxsw 2>/dev/null
    if mountpoint -q "$STATE"; then
        for h in "$STATE"/jxh*/; do
            [[ -d $h ]] || continue
            umount "$h/uts" "$h/ipc" 2>/dev/null
        done
        umount -R "$STATE" || ok=1
    fi
    # Refuse to delete while anything is still mounted below (rm would cross into it).
    if [[ -d $STATE ]] && ! grep -q " $STATE/" /proc/self/mounts && ! mountpoint -q "$STATE"; then
        rmdir "$STATE" 2>/dev/null || rm -rf --one-file-system "$STATE"
    fi
    return "$ok"
}

up() {
    local n=${1:-2} i host share
    [[ $n =~ ^[1-9]$ ]] || die "up: host count must be 1-9, got '$n'"
    down
    mkdir -p "$STATE"
    # Our own tmpfs: `down` ends it with one umount, and nothing here outlives a reboot.
    mount -t tmpfs -o mode=0755,size=2g jxh "$STATE" || die "cannot mount a tmpfs on $STATE"
    mount --make-private "$STATE"
    {
        echo "127.0.0.1 localhost"
        for ((i = 1; i <= n; i++)); do echo "$SUBNET.$i jxh$i"; done
    } >"$STATE/hosts"
    printf '%s\n' ${JXH_SHARE:-} >"$STATE/share"
    ip netns add jxsw || die "ip netns add failed (root with CAP_SYS_ADMIN and CAP_NET_ADMIN needed)"
    ip -n jxsw link add jxbr0 type bridge
    ip -n jxsw link set jxbr0 up
    for ((i = 1; i <= n; i++)); do
        host=jxh$i
        ip netns add "$host"
        # Both ends are created where they belong: no link ever exists in the root ns.
        ip -n jxsw link add "v$host" type veth peer name jxnet0 netns "$host"
        ip -n jxsw link set "v$host" master jxbr0 up
        ip -n "$host" link set lo up
        ip -n "$host" addr add "$SUBNET.$i/24" dev jxnet0
        ip -n "$host" link set jxnet0 up
        # IPv4 only: no link-local v6 addresses for MPI to try.
        ip netns exec "$host" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
        mkdir -p "$STATE/$host/shm" "$STATE/$host/tmp"
        chmod 1777 "$STATE/$host/shm" "$STATE/$host/tmp"
        touch "$STATE/$host/uts" "$STATE/$host/ipc"
        unshare --uts="$STATE/$host/uts" --ipc="$STATE/$host/ipc" hostname "$host" ||
            die "cannot make the UTS/IPC namespaces of $host"
    done
    for share in ${JXH_SHARE:-}; do
        [[ $share == /tmp/* && -d $share ]] || die "JXH_SHARE: $share is not a directory under /tmp"
    done
    echo "hosts.sh: up: $(hosts | tr '\n' ' ')(bridge jxbr0 in jxsw, $SUBNET.0/24)"
}

# enter HOST CMD...: runs inside HOST's network namespace and a fresh mount namespace
# (made by `ip netns exec`); puts the host's own /dev/shm, /tmp and the shared /etc/hosts
# in place, then becomes CMD.
enter() {
    local host=$1 dir=$STATE/$1 share rel
    shift
    mount --bind "$dir/shm" /dev/shm || exit 126
    # Shared dirs first, onto the host's /tmp dir as seen from here; rbind carries them.
    while IFS= read -r share; do
        [[ -n $share ]] || continue
        rel=${share#/tmp/}
        mkdir -p "$dir/tmp/$rel" && mount --bind "$share" "$dir/tmp/$rel" || exit 126
    done <"$STATE/share"
    mount --rbind "$dir/tmp" /tmp || exit 126
    mount --bind "$STATE/hosts" /etc/hosts || exit 126
    exec "$@"
}

run() {
    local host=$1
    shift
    known "$host" || die "run: no host '$host' (hosts.sh up first?)"
    (($#)) || die "run: no command given"
    exec nsenter --uts="$STATE/$host/uts" --ipc="$STATE/$host/ipc" -- \
        ip netns exec "$host" "$SELF" __enter "$host" "$@"
}

cmd=${1:-}
shift || true
case $cmd in
up) up "$@" ;;
down) down && echo "hosts.sh: down: clean" ;;
run) run "$@" ;;
__enter) enter "$@" ;;
cut | heal)
    known "${1:-}" || die "$cmd: no host '${1:-}'"
    ip -n jxsw link set "v$1" "$([[ $cmd == cut ]] && echo down || echo up)"
    ;;
crash)
    known "${1:-}" || die "crash: no host '${1:-}'"
    kill_all "$1"
    ;;
pids)
    known "${1:-}" || die "pids: no host '${1:-}'"
    pids_of "$1"
    ;;
*) sed -n '2,16p' "$SELF" | sed 's/^# \{0,1\}//' >&2 && exit 2 ;;
esac
