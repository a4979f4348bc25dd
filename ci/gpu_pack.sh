#!/usr/bin/env bash
# ci/gpu_pack.sh -- packs into .gpu/ every file ci/gpu_run.sh needs on the GPU test machine.
#
# usage: ci/gpu_pack.sh        (here, where PyPI can be reached; idempotent)
#
# That machine has no network and no Rust, only Python 3.12 with JAX and its CUDA plugin:
# whatever the run installs must arrive as files, with the working tree, in the ignored
# folder .gpu/ (carried next to the tree; 64 MiB in all, so the script checks the size).
# JAX is not among them: the run tests the machine's own (its image has jax, jaxlib,
# jax-cuda13-plugin and -pjrt 0.11.2, and NVIDIA's CUDA 13 libraries, as last seen), and
# its `jax` verdict records which, with the plugin's version and CUDA major. What a user
# installs, `pip install "jax[cuda13]==0.12.1"` (or "jax[cuda12]==0.12.0.1": there is no
# jax-cuda12-plugin 0.12.1 on PyPI, so "jax[cuda12]==0.12.1" does not resolve), is 227 MB
# of JAX's wheels for CUDA 13 (jaxlib 83 MB, jax-cuda13-pjrt 129 MB; 165 MB as xz) before
# NVIDIA's libraries: jaxlib alone is more than the carry has left beside this pack.
#   jaxmpi-*.whl      this checkout's x86_64 release wheel, dist/'s (ci/wheels.sh builds
#                     it here if missing or stale)
#   mpich, mpi4py     PyPI's MPICH wheel (the staged path: it is not CUDA-aware) and mpi4py,
#                     for cp312 manylinux x86_64
#   mpi4jax sdist     built there against that MPICH for the benchmark's comparison
#                     columns, with setuptools, wheel and nanobind (no build isolation)
#   impi-min.tar.xz   Intel MPI's runtime cut down to what one node needs: the only
#                     CUDA-aware MPI on PyPI (I_MPI_OFFLOAD=1), for the direct path
# Also keeps in .gpu-cache/ (never carried) the big impi-rt wheel it trims and, for
# `ci/gpu_run.sh --dry-run` on this machine, mpi4py for this machine's Python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK=$ROOT/.gpu
CACHE=$ROOT/.gpu-cache
LIMIT_MIB=56 # of the 64 MiB carried: room left for the tree growing

# The pins live in ci/setup.sh (sourcing it defines them and does nothing else).
# shellcheck source=setup.sh source-path=SCRIPTDIR
source "$ROOT/ci/setup.sh"
MPI4PY=${JAXMPI_PY_TEST[0]}
# The same mpi4jax and build tools as benches/setup_mpi4jax.sh.
MPI4JAX="mpi4jax==0.9.1.post2"
BUILD_TOOLS=("setuptools==84.2.1" "wheel==0.48.0" "nanobind==3.1.0")
# impi-rt 2021.18.1 (ci/setup.sh's pin, tested in CI's impi cell) has the same CUDA backend
# as 2021.19.0 (mpl_gpu_cuda, coll.fatbin for sm_90a); with I_MPI_FABRICS=shm neither
# needs its libfabric. The files one node needs, kept as the wheel lays them out:
IMPI_KEEP=(lib/libmpi.so.12 bin/mpiexec.hydra bin/hydra_pmi_proxy bin/hydra_bstrap_proxy
    opt/mpi/etc/coll.fatbin opt/mpi/etc/collectives.conf opt/mpi/etc/pt2pt.conf
    opt/mpi/etc/tuning_generic_shm.dat)

PIP=(python3 -m pip --disable-pip-version-check --no-input --quiet)
# What pip would pick on the GPU machine, not on this one (an explicit --platform is taken
# literally, so the older manylinux tags, mpi4py's, are listed too).
GPU_TAGS=(--only-binary=:all: --python-version 3.12 --implementation cp)
for tag in manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    GPU_TAGS+=(--platform "${tag}_x86_64")
done
log() { printf 'gpu_pack: %s\n' "$*"; }
mkdir -p "$PACK" "$CACHE/dry-run"

# --- jaxmpi: the wheel of this checkout ------------------------------------------------
export JAXMPI_SETUP_ROOT=$ROOT # where _setup_build_wheel builds
_setup_build_wheel # sets $wheel; rebuilds only if the sources changed since
rm -f "$PACK"/jaxmpi-*.whl
cp "$wheel" "$PACK/"
log "jaxmpi wheel from ${wheel#"$ROOT"/}"

# --- PyPI files (pip download skips what is already there) -----------------------------
"${PIP[@]}" download --no-deps "${GPU_TAGS[@]}" -d "$PACK" "$JAXMPI_PIN_MPICH" "$MPI4PY"
# Pure-Python wheels and an sdist: no tags to choose.
"${PIP[@]}" download --no-deps -d "$PACK" "${BUILD_TOOLS[@]}"
# pip reads an sdist's metadata by running its setup.py: with build isolation it would
# build mpi4jax's build requirements (jax, mpi4py, cmake...) from source; without, it needs
# setuptools and wheel at hand: a small venv in the cache.
tools=$CACHE/tools
[[ -x $tools/bin/python ]] || python3 -m venv "$tools"
"$tools/bin/python" -m pip --disable-pip-version-check --quiet install "${BUILD_TOOLS[@]:0:2}"
"$tools/bin/python" -m pip --disable-pip-version-check --no-input --quiet download --no-deps \
    --no-binary=:all: --no-build-isolation -d "$PACK" "$MPI4JAX"
# For the dry run only: mpi4py for this machine's Python (the cp312 one cannot install here).
"${PIP[@]}" download --no-deps --only-binary=:all: -d "$CACHE/dry-run" "$MPI4PY"

# --- Intel MPI, trimmed ---------------------------------------------------------------
"${PIP[@]}" download --no-deps "${GPU_TAGS[@]}" -d "$CACHE" "$JAXMPI_PIN_IMPI"
impi_wheel=$(ls "$CACHE"/impi_rt-"${JAXMPI_PIN_IMPI#*==}"-*.whl)
if [[ ! -s $PACK/impi-min.tar.xz || $impi_wheel -nt $PACK/impi-min.tar.xz ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # The wheel stores them as impi_rt-<v>.data/data/<path>; its licence goes along
    # (Intel's licence allows redistribution with it; it is carried, never committed).
    python3 - "$impi_wheel" "$tmp/impi" "${IMPI_KEEP[@]}" <<'EOF'
import os, sys, zipfile
wheel, dest, keep = sys.argv[1], sys.argv[2], set(sys.argv[3:])
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        path = name.split(".data/data/", 1)[-1]
        if path in keep or ".dist-info/licen" in name.lower():
            target = os.path.join(dest, path if path in keep else os.path.basename(name))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as out:
                out.write(src.read())
            if path.startswith("bin/"):
                os.chmod(target, 0o755)
            keep.discard(path)
if keep:
    sys.exit(f"gpu_pack: not in {wheel}: {sorted(keep)}")
EOF
    ln -s libmpi.so.12 "$tmp/impi/lib/libmpi.so"
    ln -s mpiexec.hydra "$tmp/impi/bin/mpiexec"
    tar -C "$tmp/impi" -cJf "$PACK/impi-min.tar.xz" .
    log "impi-min.tar.xz from $(basename "$impi_wheel")"
fi

# --- What was packed, and whether it fits ------------------------------------------------
# Only one version of each: gpu_run.sh installs by name from this folder.
for name in mpich mpi4py mpi4jax setuptools wheel nanobind; do
    files=("$PACK/$name"-[0-9]*)
    n=${#files[@]}
    [[ $n == 1 ]] || { log "$n $name files in $PACK, want one: delete the old" && exit 1; }
done
(cd "$PACK" && sha256sum -- *.whl *.tar.gz *.tar.xz >MANIFEST)
tree=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
(cd "$PACK" && ls -l -- *.whl *.tar.gz *.tar.xz | awk '{printf "  %12d  %s\n", $5, $9}')
packed=$(du -cb "$PACK" | tail -n 1 | cut -f1)
printf '  %12d  .gpu/ in all\n  %12d  working tree (tracked and untracked, not ignored)\n' \
    "$packed" "$tree"
total=$((packed + tree))
log "carried: $((total / 1024)) KiB of the 64 MiB a device call takes (limit here: $LIMIT_MIB MiB)"
((total <= LIMIT_MIB << 20)) || { log "too big"; exit 1; }
