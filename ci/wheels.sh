#!/usr/bin/env bash
# ci/wheels.sh -- the release artifacts, in dist/: the jaxmpi wheels for x86_64 and
# aarch64 Linux, and the sdist.
#
# The wheels are abi3 (one file for every CPython >= 3.10) and manylinux2014: they need
# glibc >= 2.17, the same as jaxlib 0.6.2's wheels (manylinux2014 too), so they install
# wherever the oldest JAX we support does. maturin links them with zig (PyPI's ziglang),
# which links against glibc 2.17's symbol versions whatever glibc this machine has, and
# its --compatibility check refuses a binary that would need a newer one. They are built
# without debug info and stripped: the extension is ~1.2 MB instead of ~15 MB.
# x86_64 is built with this machine's rustc; aarch64 in the trixie chroot (ci/trixie.sh),
# with Debian's rustc and its arm64 standard library (rustup's targets cannot be
# downloaded here). Only the extension crate, jaxmpi-python, is compiled.
#
# usage: ci/wheels.sh [x86_64] [aarch64] [sdist]     (none named: all three)
#
# Idempotent: each artifact has a stamp in dist/ holding a hash of what it is made from
# (ci/setup.sh's _setup_key: the sources, the toolchain, and here the build command and
# tools), so a second run with nothing changed builds nothing. Installs what it needs:
# .venvs/wheels (maturin, ziglang, auditwheel) and, for aarch64, the chroot and its Rust
# packages; the pins are in ci/setup.sh. ci/setup.sh builds the x86_64 wheel through
# this script (the file every test venv installs); ci/test.sh builds the rest and checks
# them all (tag, linked libraries, size).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=setup.sh source-path=SCRIPTDIR
source "$ROOT/ci/setup.sh" # the pins and the _setup_* helpers (sourcing does no work)
JAXMPI_SETUP_ROOT=$ROOT
PYTHON=${PYTHON:-python3}
[[ -d $HOME/.cargo/bin ]] && PATH="$HOME/.cargo/bin:$PATH"

DIST="$ROOT/dist"
TOOLS="$ROOT/.venvs/wheels"
TRIXIE=(bash "$ROOT/ci/trixie.sh" run)

_wheels_log() { printf 'wheels: %s\n' "$*"; }

# _wheels_make NAME GLOB TOOLCHAIN CMD...: runs CMD, which must leave exactly one file
# matching dist/GLOB, unless the stamp dist/.NAME-stamp says that file was made from the
# same sources, TOOLCHAIN (a description of the compiler CMD uses) and CMD.
_wheels_make() {
    local name=$1 glob=$2 toolchain=$3 key t=$SECONDS
    shift 3
    local stamp="$DIST/.$name-stamp" arg
    local -a found command=()
    # The command without PATH=...: that says where the tools are, not what they are (the
    # key has their versions), and differs between callers.
    for arg; do [[ $arg == PATH=* ]] || command+=("$arg"); done
    key=$(_setup_key "${_SETUP_WHEEL_INPUTS[@]}") &&
        key=$(printf '%s\n' "$key" "$toolchain" "${JAXMPI_WHEEL_TOOLS[*]}" "${command[*]}" |
            sha256sum | cut -d' ' -f1) ||
        key=
    mapfile -t found < <(compgen -G "$DIST/$glob")
    if ((${#found[@]} == 1)) && _setup_current "$stamp" "$key"; then
        _wheels_log "$name: up to date ($(basename "${found[0]}"))"
        return 0
    fi
    rm -f "$stamp" "${found[@]}"
    _wheels_log "$name: building"
    "$@" || return 1
    mapfile -t found < <(compgen -G "$DIST/$glob")
    if ((${#found[@]} != 1)); then
        _wheels_log "$name: expected one dist/$glob after the build, found ${#found[@]}" >&2
        return 1
    fi
    [[ -z $key ]] || printf '%s' "$key" >"$stamp"
    _wheels_log "$name: $(basename "${found[0]}") ($(stat -c %s "${found[0]}") bytes, $((SECONDS - t))s)"
}

# The arguments of `maturin build` for the release wheel of TRIPLE.
_wheels_maturin_args() {
    printf '%s\n' build --quiet --release --strip --zig --compatibility manylinux2014 \
        --target "$1" --manifest-path "$ROOT/python/Cargo.toml" -o "$DIST"
}

# Environment of the wheel builds: zig on PATH (maturin runs `zig cc` as the linker);
# the release profile without debug info (it is stripped anyway); a target folder of
# their own, so the tests' build in target/release (with debug info) stays as it is.
_wheels_env() { # TRIPLE PATH
    local zig_dir
    zig_dir=$("$TOOLS/bin/python" -c 'import pathlib, ziglang; print(pathlib.Path(ziglang.__file__).parent)') ||
        return 1
    printf '%s\n' "PATH=$zig_dir:$2" CARGO_PROFILE_RELEASE_DEBUG=false \
        "CARGO_TARGET_DIR=$ROOT/target/wheel-$1"
}

wheels_x86_64() {
    local triple=x86_64-unknown-linux-gnu toolchain
    local -a env args
    toolchain=$(rustc -vV) || return 1
    mapfile -t env < <(_wheels_env $triple "$PATH") && ((${#env[@]})) || return 1
    mapfile -t args < <(_wheels_maturin_args $triple)
    _wheels_make x86_64 'jaxmpi-*_x86_64.whl' "$toolchain" env "${env[@]}" "$TOOLS/bin/maturin" "${args[@]}"
}

wheels_aarch64() {
    local triple=aarch64-unknown-linux-gnu toolchain
    local -a env args
    if [[ -n ${JAXMPI_SKIP_TRIXIE:-} ]]; then
        _wheels_log "aarch64: needs the trixie chroot, and JAXMPI_SKIP_TRIXIE is set" >&2
        return 1
    fi
    bash "$ROOT/ci/trixie.sh" ensure || return 1
    # The arm64 standard library is a foreign-architecture package (dpkg multiarch).
    if ! "${TRIXIE[@]}" dpkg --print-foreign-architectures | grep -qx arm64; then
        "${TRIXIE[@]}" dpkg --add-architecture arm64 || return 1
    fi
    (_SETUP_IN=("${TRIXIE[@]}") && _setup_apt "${JAXMPI_WHEEL_TRIXIE_PACKAGES[@]}") || return 1
    toolchain=$("${TRIXIE[@]}" rustc -vV) || return 1
    # The chroot's own cargo and rustc, and a cargo home of its own: the host's ~/.cargo
    # is not visible in there. maturin and zig run in it from the clone's .venvs/wheels,
    # which the chroot sees at the same path (they need no newer glibc than trixie's).
    mapfile -t env < <(_wheels_env $triple /usr/local/bin:/usr/bin:/bin) && ((${#env[@]})) || return 1
    mapfile -t args < <(_wheels_maturin_args $triple)
    _wheels_make aarch64 'jaxmpi-*_aarch64.whl' "$toolchain" "${TRIXIE[@]}" env "${env[@]}" \
        "CARGO_HOME=$ROOT/target/wheel-$triple/cargo-home" "$TOOLS/bin/maturin" "${args[@]}"
}

wheels_sdist() {
    _wheels_make sdist 'jaxmpi-*.tar.gz' "" \
        "$TOOLS/bin/maturin" sdist --manifest-path "$ROOT/python/Cargo.toml" -o "$DIST"
}

main() {
    local -a want=("$@")
    local w
    ((${#want[@]})) || want=(x86_64 aarch64 sdist)
    for w in "${want[@]}"; do
        case $w in
        x86_64 | aarch64 | sdist) ;;
        *)
            sed -n '15p' "$0" | sed 's/^# \{0,1\}//' >&2
            return 2
            ;;
        esac
    done
    mkdir -p "$ROOT/.venvs" "$DIST" || return 1
    _setup_venv wheels bin/maturin "${JAXMPI_WHEEL_TOOLS[@]}" || return 1
    for w in "${want[@]}"; do
        "wheels_$w" || return 1
    done
}

main "$@"
