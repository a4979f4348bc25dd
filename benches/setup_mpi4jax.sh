#!/usr/bin/env bash
# benches/setup_mpi4jax.sh -- the venv the benchmark compares in: .venvs/bench-mpi4jax.
#
# mpi4jax (an sdist) built from source with the mpicc of PyPI's MPICH wheel, next to the
# same MPICH, JAX and mpi4py as .venvs/mpich, plus the jaxmpi wheel that ci/setup.sh
# built (dist/, through ci/wheels.sh): jaxmpi, mpi4jax and the raw C loop all run over one libmpi.
# Idempotent (a marker file records the pins); the jaxmpi wheel is reinstalled every time.
# Also unpacks the sdist to .venvs/bench-mpi4jax/src/ (mpi4jax's examples/ are run from there).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venvs/bench-mpi4jax"
PIP=(python -m pip --quiet --disable-pip-version-check --no-input)

MPI4JAX="mpi4jax==0.9.1.post2"
RUNTIME=("mpich==5.0.2" "jax==0.10.2" "jaxlib==0.10.2" "mpi4py==4.1.2" "numpy==2.4.6"
    "matplotlib==3.11.2" "tqdm==4.70.1")
BUILD=("setuptools==84.2.1" "wheel==0.48.0" "nanobind==3.1.0")

want="$MPI4JAX ${RUNTIME[*]} ${BUILD[*]}"
if [[ ! -f $VENV/.bench-setup || "$(cat "$VENV/.bench-setup")" != "$want" ]]; then
    echo "bench: building $VENV ($MPI4JAX against mpich's mpicc)"
    python3 -m venv --clear "$VENV"
    (
        PATH="$VENV/bin:$PATH"
        "${PIP[@]}" install "${RUNTIME[@]}" "${BUILD[@]}"
        # No build isolation: build against exactly this JAX and mpi4py, with this mpicc.
        MPI4JAX_BUILD_MPICC="$VENV/bin/mpicc" "${PIP[@]}" install --no-build-isolation \
            --no-binary mpi4jax "$MPI4JAX"
        rm -rf "$VENV/src" && mkdir -p "$VENV/src"
        "${PIP[@]}" download --no-deps --no-binary mpi4jax --no-build-isolation \
            -d "$VENV/src" "$MPI4JAX"
        tar -xzf "$VENV"/src/mpi4jax-*.tar.gz -C "$VENV/src"
    )
    printf '%s' "$want" >"$VENV/.bench-setup"
fi
# ci/wheels.sh leaves exactly one wheel per architecture.
wheel=$(ls "$ROOT"/dist/jaxmpi-*_"$(uname -m)".whl)
"$VENV/bin/python" -m pip --quiet --disable-pip-version-check install --no-deps \
    --force-reinstall "$wheel"
