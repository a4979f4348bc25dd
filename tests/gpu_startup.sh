#!/usr/bin/env bash
# tests/gpu_startup.sh -- jaxmpi's GPU start-up on a machine without a GPU, with JAX's real
# CUDA plugin installed (.venvs/cuda-plugin, from ci/setup.sh), as on every GPU cluster's
# login node and in every image made with `pip install "jax[cuda12]"`: that is where a
# GPU user meets the start-up first. With JAX_PLATFORMS=cpu and with it unset (JAX then
# tries CUDA and falls back to the CPU):
#   - `import jaxmpi` alone, after JAX's backend started, and after mpi4py initialized MPI;
#   - a jitted allreduce at 2 ranks, right;
#   - `python -m jaxmpi info` saying why CUDA is not used;
#   - tests/python/test_gpu_startup.py at 2 ranks (the start-up on a faked driver answer,
#     every op lowered for CUDA, this process's own start-up with the plugin found).
# About 40 s. Prints "N passed, N failed".
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV=$ROOT/.venvs/mpich
PLUGIN=$ROOT/.venvs/cuda-plugin
[[ -d $PLUGIN/jax_plugins && -x $VENV/bin/mpiexec ]] || {
    echo "gpu_startup: run ci/setup.sh first (it installs $PLUGIN)" >&2
    exit 1
}
export PATH="$VENV/bin:$PATH" PYTHONPATH=$PLUGIN JAXMPI_TEST_CUDA_PLUGIN=1
# shellcheck source=expect.sh
source "$ROOT/tests/expect.sh"

ALLREDUCE='
import jax, jax.numpy as jnp, jaxmpi
size = jaxmpi.COMM_WORLD.Get_size()
total = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM))(jnp.arange(3.0))
assert jax.default_backend() == "cpu" and (total == size * jnp.arange(3.0)).all(), total
if jaxmpi.COMM_WORLD.Get_rank() == 0:  # one line: two ranks printing at once interleave
    print("allreduce right on", jax.default_backend())'

for platforms in cpu unset; do
    if [[ $platforms == cpu ]]; then
        export JAX_PLATFORMS=cpu
        why='not used \(JAX_PLATFORMS=cpu leaves CUDA out\)'
    else
        unset JAX_PLATFORMS
        why='not used \(jaxlib has CUDA, but the NVIDIA driver does not load'
    fi
    expect "import jaxmpi (JAX_PLATFORMS=$platforms)" 0 '^imported$' timeout 120 \
        python -c 'import jaxmpi; print("imported")'
    # JAX's backend started first: no GPU was opened, so no GPU choice was lost either.
    expect "JAX started before import jaxmpi (JAX_PLATFORMS=$platforms)" 0 '^imported after cpu' timeout 120 \
        python -c 'import jax; jax.devices(); import jaxmpi; print("imported after", jax.default_backend())'
    expect "mpi4py first, then jaxmpi, 2 ranks (JAX_PLATFORMS=$platforms)" 0 '^before jaxmpi' timeout 120 \
        mpiexec -n 2 python -c 'from mpi4py import MPI; import jaxmpi
MPI.COMM_WORLD.Get_rank() or print(
    jaxmpi._runtime.library.info["initialized_here"] and "by jaxmpi" or "before jaxmpi")'
    expect "jitted allreduce, 2 ranks (JAX_PLATFORMS=$platforms)" 0 '^allreduce right on cpu' timeout 120 \
        mpiexec -n 2 python -c "$ALLREDUCE"
    expect "jaxmpi info says why CUDA is unused (JAX_PLATFORMS=$platforms)" 0 "^CUDA +$why" timeout 120 \
        python -m jaxmpi info
    expect "test_gpu_startup.py, 2 ranks (JAX_PLATFORMS=$platforms)" 0 '[0-9]+ passed in ' timeout 120 \
        mpiexec -n 2 python -m pytest -q -p no:cacheprovider "$ROOT/tests/python/test_gpu_startup.py"
done
expect_summary
