#!/usr/bin/env bash
# ci/wheels_proof.sh -- the release wheels of dist/ (ci/wheels.sh) running where their
# tags say they can. Minutes each (a CPython build once, then emulation), so not part of
# ci/test.sh: run it when the wheel build changes, and before a release.
#
# usage: ci/wheels_proof.sh old-glibc   the x86_64 wheel on Debian 11 (glibc 2.31)
#        ci/wheels_proof.sh aarch64     the aarch64 wheel in an arm64 Debian 12, under qemu
#
# old-glibc: Debian 11 (bullseye) is the oldest release the mirror still serves (10 has
# left it; the archive that keeps it is not reachable here). Its Python is 3.9, older
# than the wheel (abi3, 3.10+) and JAX 0.6.2 accept, so CPython 3.11 is built in it, once,
# from the upstream tarball in Debian 12's python3.11 source package. Its venv
# (.venvs/proof-old-glibc) gets PyPI's JAX 0.6.2 (the oldest we support), MPICH and
# mpi4py, and pip installs the wheel (pip checks its tag against this glibc); then, at 2
# ranks: ci/wheels_proof.py (the README example, results checked) and a short run of the
# shallow-water example (halo exchange with sendrecv inside a jitted loop).
# aarch64: Debian's qemu-user-static, registered with binfmt_misc for the run (and
# unregistered after it, if this run registered it), runs an arm64 Debian 12 chroot. Its
# venv (.venvs/proof-aarch64) gets PyPI's aarch64 JAX (the newest we pin for Python
# 3.11), MPICH and mpi4py, and the wheel; then `python -m jaxmpi info` and, at 2 ranks,
# ci/wheels_proof.py.
#
# The chroots come from ci/trixie.sh (JAXMPI_CHROOT_*: its private mount namespaces leave
# no mount behind), the venvs from ci/setup.sh's helpers; a second run reuses both.
# Needs root and the wheels in dist/ (ci/wheels.sh).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=setup.sh source-path=SCRIPTDIR
source "$ROOT/ci/setup.sh" # the pins and the _setup_* helpers (sourcing does no work)
JAXMPI_SETUP_ROOT=$ROOT
CHROOT=(bash "$ROOT/ci/trixie.sh")
BINFMT=/proc/sys/fs/binfmt_misc

_proof_log() { printf 'proof: %s\n' "$*"; }

# _proof_venv NAME PYTHON GLOB PIN...: the venv NAME in the chroot, made with PYTHON (a
# path in the chroot) and holding PIN..., and the wheel dist/GLOB installed in it.
_proof_venv() {
    local name=$1 python=$2 glob=$3
    shift 3
    local -a found
    mapfile -t found < <(compgen -G "$ROOT/dist/$glob")
    if ((${#found[@]} != 1)); then
        _proof_log "expected one dist/$glob, found ${#found[@]}: run ci/wheels.sh" >&2
        return 1
    fi
    (
        _SETUP_IN=("${CHROOT[@]}" run)
        PYTHON=$python
        _setup_venv "$name" bin/mpiexec "$@" &&
            _setup_install_wheel "$name" "${found[0]}" "${_SETUP_IN[@]}" "$ROOT/.venvs/$name/bin/python"
    )
}

# _proof_run NAME CMD...: CMD in the chroot, the venv NAME first on PATH, JAX on the CPU.
_proof_run() {
    local venv="$ROOT/.venvs/$1"
    shift
    "${CHROOT[@]}" run env PATH="$venv/bin:/usr/local/bin:/usr/bin:/bin" VIRTUAL_ENV="$venv" \
        JAX_PLATFORMS=cpu "$@"
}

# Builds CPython 3.11 into /opt/python3.11 (run in the chroot: bash -c ... _ MIRROR). The
# marker file, written last, says the install is complete.
# shellcheck disable=SC2016  # expanded by the inner bash
CPYTHON_BUILD='
set -e
echo "deb-src $1 bookworm main" >/etc/apt/sources.list.d/bookworm-src.list
apt-get update -qq
rm -rf /opt/python3.11 /opt/src && mkdir -p /opt/src && cd /opt/src
apt-get source --download-only -qq -o APT::Sandbox::User=root python3.11
tar -xf python3.11_*.orig.tar.*
cd Python-3.11*/
echo "building $(basename "$PWD") (log: /opt/src/build.log in the chroot)"
if ! { ./configure --prefix=/opt/python3.11 && make -j"$(nproc)" && make install; } >/opt/src/build.log 2>&1; then
    tail -n 30 /opt/src/build.log
    exit 1
fi
touch /opt/python3.11/.complete
'

proof_old_glibc() {
    local t=$SECONDS py=/opt/python3.11/bin/python3.11
    export JAXMPI_CHROOT_SUITE=bullseye
    export JAXMPI_CHROOT_PACKAGES="python3 build-essential libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev xz-utils ca-certificates"
    "${CHROOT[@]}" ensure || return 1
    _proof_log "chroot ready ($((SECONDS - t))s)"
    if ! "${CHROOT[@]}" run test -f /opt/python3.11/.complete; then
        t=$SECONDS
        "${CHROOT[@]}" run bash -c "$CPYTHON_BUILD" _ "$JAXMPI_TRIXIE_MIRROR" || return 1
        _proof_log "CPython built ($((SECONDS - t))s)"
    fi
    t=$SECONDS
    _proof_venv proof-old-glibc "$py" 'jaxmpi-*_x86_64.whl' "$JAXMPI_PIN_MPICH" \
        "${JAXMPI_PIN_JAX_OLDEST[@]}" "${JAXMPI_PY_TEST[@]}" || return 1
    _proof_log "venv ready ($((SECONDS - t))s)"
    _proof_run proof-old-glibc sh -c 'ldd --version | head -n 1; python --version' || return 1
    t=$SECONDS
    _proof_run proof-old-glibc python -m jaxmpi info || return 1
    _proof_run proof-old-glibc mpiexec -n 2 python ci/wheels_proof.py || return 1
    _proof_run proof-old-glibc mpiexec -n 2 python examples/shallow_water.py --benchmark \
        --days 0.5 --nx 90 --ny 45 || return 1
    _proof_log "old-glibc: pass ($((SECONDS - t))s for the runs)"
}

# binfmt_misc's aarch64 entry, made in the private mount namespace this subcommand runs
# in (see the end of this file), which mounts binfmt_misc: on recent kernels the entry
# lives as long as that mount and so vanishes with the namespace; older ones keep it
# after, hence the explicit removal on exit. Debian's entry has the F flag: qemu is
# opened now, so it runs inside any chroot.
_proof_binfmt() {
    mountpoint -q "$BINFMT" || mount -t binfmt_misc binfmt_misc "$BINFMT" || return 1
    [[ -e $BINFMT/qemu-aarch64 ]] && return 0
    cat /usr/lib/binfmt.d/qemu-aarch64.conf >"$BINFMT/register" || return 1
    trap 'echo -1 >"$BINFMT/qemu-aarch64"' EXIT
}

proof_aarch64() {
    local t=$SECONDS
    export JAXMPI_CHROOT_SUITE=bookworm JAXMPI_CHROOT_ARCH=arm64
    export JAXMPI_CHROOT_PACKAGES="python3 python3-venv"
    _setup_apt qemu-user-static || return 1
    if ! _proof_binfmt; then
        _proof_log "could not register qemu-aarch64 with binfmt_misc" >&2
        return 1
    fi
    "${CHROOT[@]}" ensure || return 1
    _proof_log "chroot ready ($((SECONDS - t))s)"
    t=$SECONDS
    _proof_venv proof-aarch64 /usr/bin/python3 'jaxmpi-*_aarch64.whl' "$JAXMPI_PIN_MPICH" \
        "${JAXMPI_PIN_JAX_NEWEST[@]}" "${JAXMPI_PY_TEST[@]}" || return 1
    _proof_log "venv ready ($((SECONDS - t))s)"
    _proof_run proof-aarch64 sh -c 'uname -m; ldd --version | head -n 1; python --version' || return 1
    t=$SECONDS
    _proof_run proof-aarch64 python -m jaxmpi info || return 1
    _proof_log "jaxmpi info: $((SECONDS - t))s"
    t=$SECONDS
    _proof_run proof-aarch64 mpiexec -n 2 python ci/wheels_proof.py || return 1
    _proof_log "aarch64: pass ($((SECONDS - t))s for the 2-rank run)"
}

case ${1-} in
old-glibc) proof_old_glibc ;;
aarch64)
    # In a private mount namespace of its own (binfmt_misc's mount, above).
    if [[ -z ${_PROOF_IN_NAMESPACE:-} ]]; then
        exec unshare --mount --propagation private -- env _PROOF_IN_NAMESPACE=1 bash "$0" aarch64
    fi
    proof_aarch64
    ;;
*)
    sed -n '6,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
