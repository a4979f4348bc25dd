#!/usr/bin/env bash
# tests/gpu_startup.sh -- jaxmpi's GPU start-up on a machine without a GPU, with JAX's real
# CUDA plugins installed (.venvs/cuda12-plugin and .venvs/cuda13-plugin, from ci/setup.sh),
# as on every GPU cluster's login node and in every image made with
# `pip install "jax[cuda12]"` or `"jax[cuda13]"`: that is where a GPU user meets the
# start-up first. With the CUDA 12 plugin, JAX_PLATFORMS=cpu and unset (JAX then tries CUDA
# and falls back to the CPU); with the CUDA 13 plugin, unset only: JAX initializes a
# plugin alike under both settings and tries its client only unset, and what the cpu pass
# adds, jaxmpi reading JAX_PLATFORMS, does not depend on the plugin. Each pass:
#   - `import jaxmpi` alone, after JAX's backend started, and after mpi4py initialized MPI;
#   - a jitted allreduce at 2 ranks, right;
#   - `python -m jaxmpi info` saying why CUDA is not used;
#   - tests/python/test_gpu_startup.py at 2 ranks (the start-up on a faked driver answer,
#     every op lowered for CUDA, this process's own start-up with the plugin found).
# About 50 s a pass. Prints "N passed, N failed".
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV=$ROOT/.venvs/mpich
# CUDA major, then the JAX_PLATFORMS settings it runs under.
PASSES=("12 cpu unset" "13 unset")
for pass in "${PASSES[@]}"; do
    [[ -d $ROOT/.venvs/cuda${pass%% *}-plugin/jax_plugins && -x $VENV/bin/mpiexec ]] || {
        echo "gpu_startup: run ci/setup.sh first (it installs .venvs/cuda${pass%% *}-plugin)" >&2
        exit 1
    }
done
export PATH="$VENV/bin:$PATH" JAXMPI_TEST_CUDA_PLUGIN=1
# shellcheck source=expect.sh
source "$ROOT/tests/expect.sh"

ALLREDUCE='
import jax, jax.numpy as jnp, jaxmpi
size = jaxmpi.COMM_WORLD.Get_size()
total = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM))(jnp.arange(3.0))
assert jax.default_backend() == "cpu" and (total == size * jnp.arange(3.0)).all(), total
if jaxmpi.COMM_WORLD.Get_rank() == 0:  # one line: two ranks printing at once interleave
    print("allreduce right on", jax.default_backend())'

for pass in "${PASSES[@]}"; do
    read -r major settings <<<"$pass"
    export PYTHONPATH=$ROOT/.venvs/cuda$major-plugin
    for platforms in $settings; do
        if [[ $platforms == cpu ]]; then
            export JAX_PLATFORMS=cpu
            why='not used \(JAX_PLATFORMS=cpu leaves CUDA out\)'
        else
            unset JAX_PLATFORMS
            why='not used \(jaxlib has CUDA, but the NVIDIA driver does not load'
        fi
        on="CUDA $major plugin, JAX_PLATFORMS=$platforms"
        expect "import jaxmpi ($on)" 0 '^imported$' timeout 120 \
            python -c 'import jaxmpi; print("imported")'
        # JAX's backend started first: no GPU was opened, so no GPU choice was lost either.
        expect "JAX started before import jaxmpi ($on)" 0 '^imported after cpu' timeout 120 \
            python -c 'import jax; jax.devices(); import jaxmpi; print("imported after", jax.default_backend())'
        expect "mpi4py first, then jaxmpi, 2 ranks ($on)" 0 '^before jaxmpi' timeout 120 \
            mpiexec -n 2 python -c 'from mpi4py import MPI; import jaxmpi
MPI.COMM_WORLD.Get_rank() or print(
    jaxmpi._runtime.library.info["initialized_here"] and "by jaxmpi" or "before jaxmpi")'
        expect "jitted allreduce, 2 ranks ($on)" 0 '^allreduce right on cpu' timeout 120 \
            mpiexec -n 2 python -c "$ALLREDUCE"
        expect "jaxmpi info says why CUDA is unused ($on)" 0 "^CUDA +$why" timeout 120 \
            python -m jaxmpi info
        expect "test_gpu_startup.py, 2 ranks ($on)" 0 '[0-9]+ passed in ' timeout 120 \
            mpiexec -n 2 python -m pytest -q -p no:cacheprovider "$ROOT/tests/python/test_gpu_startup.py"
    done
done
expect_summary
