#!/usr/bin/env bash
# ci/trixie.sh -- a Debian trixie chroot for the Python versions this machine lacks.
#
# JAX 0.11 and newer need Python >= 3.12; this machine (Debian 12) has 3.11. Debian 13
# (trixie) has Python 3.13, but its binaries need a newer glibc than bookworm's, so they
# run in a chroot. The same jaxmpi wheel (abi3, manylinux2014) installs there unchanged.
# ci/wheels.sh builds the aarch64 wheel in it (Debian's rustc with its arm64 std).
#
# usage: ci/trixie.sh ensure      create the chroot unless a complete one is there
#        ci/trixie.sh run CMD...  run CMD inside it as root, in the caller's folder
#        ci/trixie.sh dir         print the chroot's folder
#        ci/trixie.sh remove      delete the chroot (refused while anything is mounted in it)
#
# Where: /var/cache/jaxmpi/trixie-<hash of the pins> (another chroot:
# <suite>[-<arch>]-<hash>), outside the clone, so a later clone on the same machine
# reuses it (JAXMPI_TRIXIE_DIR overrides). The pins (suite,
# mirror, packages) are in ci/setup.sh; the folder's marker file holds them and is
# written last, so a chroot whose build was cut short is rebuilt from nothing.
#
# `run` bind-mounts /proc, /sys, /dev (MPICH needs /dev/shm) and the clone (at the same
# path, so every path under it means the same inside and out). Those mounts are made in
# a private mount namespace (unshare -m) that exists only as long as the command's
# processes do: when they end -- normally, with an error, or killed by `timeout` or
# SIGKILL -- the kernel drops the mounts; none is ever visible outside the command, so
# no exit trap is needed and none can be skipped. debootstrap's own mounts are made
# in such a namespace too.
#
# Other Debian chroots, through the same code (ci/wheels_proof.sh: bullseye for its old
# glibc, arm64 bookworm under qemu): JAXMPI_CHROOT_SUITE, JAXMPI_CHROOT_ARCH (debootstrap's
# --arch; a foreign one needs a qemu registered with binfmt_misc) and JAXMPI_CHROOT_PACKAGES
# (space-separated; python3 among them) replace the trixie pins, and name the folder.
#
# Needs root (debootstrap, chroot, mount), debootstrap (ci/setup.sh installs it) and
# network access to the mirror. Python venvs are made inside by ci/setup.sh, in the
# clone's .venvs/ like every other venv.
set -u -o pipefail
# chroot, debootstrap and (on some systems) mount live in sbin, which a non-login
# shell's PATH may lack.
PATH="$PATH:/usr/sbin:/sbin"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=setup.sh source-path=SCRIPTDIR
source "$ROOT/ci/setup.sh" # the pins only (sourcing does no work)

_trixie_log() { printf 'trixie: %s\n' "$*" >&2; }
_trixie_die() {
    _trixie_log "$*"
    exit 1
}

SUITE=${JAXMPI_CHROOT_SUITE:-$JAXMPI_TRIXIE_SUITE}
ARCH=${JAXMPI_CHROOT_ARCH:-}
read -r -a PACKAGES <<<"${JAXMPI_CHROOT_PACKAGES:-${JAXMPI_TRIXIE_PACKAGES[*]}}"
# What the chroot is made of; its hash names the folder, and the marker holds it.
TRIXIE_SPEC="suite=$SUITE mirror=$JAXMPI_TRIXIE_MIRROR variant=minbase packages=${PACKAGES[*]}${ARCH:+ arch=$ARCH}"
TRIXIE_DIR=${JAXMPI_TRIXIE_DIR:-/var/cache/jaxmpi/$SUITE${ARCH:+-$ARCH}-$(printf '%s' "$TRIXIE_SPEC" | sha256sum | cut -c1-12)}
TRIXIE_MARKER=.jaxmpi-trixie

# Files copied in from the host on every `ensure`: name resolution, pip's settings and
# the CA bundles they (or the environment) point at, so pip reaches the same indexes
# through the same proxies and certificates as on the host.
_trixie_host_files() {
    local f cert
    for f in /etc/resolv.conf /etc/hosts /etc/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
        [[ -f $f ]] && printf '%s\n' "$f"
    done
    for f in /etc/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
        [[ -f $f ]] || continue
        cert=$(sed -n 's/^[[:space:]]*cert[[:space:]]*=[[:space:]]*//p' "$f" | tail -n 1)
        [[ -n $cert && -f $cert ]] && printf '%s\n' "$cert"
    done
    for cert in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" "${REQUESTS_CA_BUNDLE:-}"; do
        [[ -n $cert && -f $cert ]] && printf '%s\n' "$cert"
    done
}

_trixie_copy_host_files() { # DIR
    local f
    while IFS= read -r f; do
        mkdir -p "$1$(dirname "$f")" && cp -L "$f" "$1$f" || return 1
    done < <(_trixie_host_files | sort -u)
}

# What still uses DIR, one "pid N: ..." line each: mount points under it in any mount
# namespace (each process's mountinfo), and processes chrooted into it (their mountinfo
# shows paths relative to the chroot, so they are found by their root instead).
_trixie_users() { # DIR
    local dir pid r
    dir=$(realpath -m "$1")
    awk -v d="$dir" '
        { if ($5 == d || index($5, d "/") == 1) { split(FILENAME, p, "/"); print "pid " p[3] ": mount " $5 } }
    ' /proc/[0-9]*/mountinfo 2>/dev/null | sort -u -k4
    for pid in /proc/[0-9]*; do
        r=$(readlink "$pid/root" 2>/dev/null) || continue
        [[ $r == "$dir" || $r == "$dir"/* ]] && printf 'pid %s: root %s\n' "${pid#/proc/}" "$r"
    done
}

# The only way this script deletes a chroot: refuses while anything is mounted under
# it or runs in it (a bind mount of /dev or /proc there would take the host's files
# with it; --one-file-system is the second guard).
_trixie_rm() { # DIR
    local dir=$1 users
    [[ -e $dir ]] || return 0
    users=$(_trixie_users "$dir")
    if [[ -n $users ]]; then
        _trixie_log "not removing $dir, it is in use:"
        sed 's/^/    /' <<<"$users" >&2
        return 1
    fi
    rm -rf --one-file-system "$dir"
}

_trixie_complete() {
    [[ -f $TRIXIE_DIR/$TRIXIE_MARKER && "$(cat "$TRIXIE_DIR/$TRIXIE_MARKER")" == "$TRIXIE_SPEC" &&
        -x $TRIXIE_DIR/usr/bin/python3 ]]
}

trixie_ensure() {
    [[ $(id -u) == 0 ]] || _trixie_die "needs root (debootstrap, chroot and mount)"
    mkdir -p "$(dirname "$TRIXIE_DIR")" || return 1
    # One builder at a time; a second CI run on this machine waits here.
    exec 9>"$TRIXIE_DIR.lock" || return 1
    flock 9 || return 1
    if ! _trixie_complete; then
        command -v debootstrap >/dev/null || _trixie_die "debootstrap not found (ci/setup.sh installs it)"
        local part="$TRIXIE_DIR.partial" t=$SECONDS
        # Leftovers of a build that was cut short, and an incomplete chroot.
        _trixie_rm "$part" || return 1
        _trixie_rm "$TRIXIE_DIR" || return 1
        _trixie_log "building $TRIXIE_DIR ($TRIXIE_SPEC)"
        local include
        include=$(IFS=,; printf '%s' "${PACKAGES[*]}")
        # debootstrap mounts /proc and /sys in the target itself; the private namespace
        # drops them even if it is killed before its own cleanup.
        if ! unshare --mount --propagation private -- \
            debootstrap --variant=minbase ${ARCH:+--arch="$ARCH"} --include="$include" \
            "$SUITE" "$part" "$JAXMPI_TRIXIE_MIRROR" >"$part.log" 2>&1; then
            tail -n 30 "$part.log" >&2
            _trixie_die "debootstrap failed (full log: $part.log)"
        fi
        printf '%s' "$TRIXIE_SPEC" >"$part/$TRIXIE_MARKER" || return 1
        mv "$part.log" "$part/var/log/jaxmpi-debootstrap.log"
        mv "$part" "$TRIXIE_DIR" || return 1
        _trixie_log "built in $((SECONDS - t))s"
    fi
    _trixie_copy_host_files "$TRIXIE_DIR" || return 1
    _trixie_log "$TRIXIE_DIR: $(chroot "$TRIXIE_DIR" python3 --version)"
}

# The mounting and the chroot, run as the body of `unshare` (so inside the new
# namespace): bash -c "$TRIXIE_BODY" _ DIR ROOT CWD CMD...
# shellcheck disable=SC2016  # expanded by the inner bash
TRIXIE_BODY='
set -e
dir=$1 root=$2 cwd=$3
shift 3
for m in proc sys dev; do
    mkdir -p "$dir/$m"
    mount --rbind "/$m" "$dir/$m"
done
mkdir -p "$dir$root"
mount --bind "$root" "$dir$root"
# Local wheel folders pip is pointed at (PIP_FIND_LINKS): the same ones inside.
for d in ${PIP_FIND_LINKS:-}; do
    [[ $d == /* && -d $d ]] || continue
    mkdir -p "$dir$d"
    mount --bind -o ro "$d" "$dir$d"
done
# Open MPI and mktemp use TMPDIR: make it exist inside too.
[[ -z ${TMPDIR:-} ]] || mkdir -p "$dir$TMPDIR"
exec chroot "$dir" /bin/sh -c '\''cd "$0" && exec "$@"'\'' "$cwd" "$@"
'

trixie_run() {
    (($#)) || _trixie_die "run: no command given"
    [[ $(id -u) == 0 ]] || _trixie_die "needs root (chroot and mount)"
    _trixie_complete || _trixie_die "no complete chroot at $TRIXIE_DIR: run ci/trixie.sh ensure (or ci/setup.sh)"
    # Inside, the caller's folder if it is in the clone (the only host folder there).
    local cwd=$PWD
    [[ $cwd == "$ROOT" || $cwd == "$ROOT"/* ]] || cwd=$ROOT
    exec unshare --mount --propagation private -- bash -c "$TRIXIE_BODY" _ "$TRIXIE_DIR" "$ROOT" "$cwd" "$@"
}

case ${1-} in
ensure) trixie_ensure ;;
run)
    shift
    trixie_run "$@"
    ;;
dir) printf '%s\n' "$TRIXIE_DIR" ;;
remove) _trixie_rm "$TRIXIE_DIR.partial" && _trixie_rm "$TRIXIE_DIR" &&
    rm -f "$TRIXIE_DIR.partial.log" "$TRIXIE_DIR.lock" ;;
*)
    sed -n '9,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
