#!/usr/bin/env bash
# GPU checks (run on a machine with an NVIDIA GPU): the CUDA tests at 2 ranks sharing the GPU,
# staged (JAXMPI_CUDA_AWARE=0) and automatic, then the GPU benchmark. Own venv, idempotent.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=${JAXMPI_GPU_VENV:-$ROOT/.venvs/gpu}
[ -x "$V/bin/python" ] || python3 -m venv "$V"
"$V/bin/pip" install -q "jax[cuda12]" mpich mpi4py pytest numpy maturin
if [ ! -f "$ROOT/python/jaxmpi/_native.abi3.so" ]; then
    (cd "$ROOT" && cargo build --release && cp target/release/lib_native.so python/jaxmpi/_native.abi3.so)
fi
# mpi4jax, built with CUDA from the nvidia-* wheels jax[cuda12] brought, for the benchmark's
# comparison columns; where it does not build, the benchmark says so and leaves them out.
"$V/bin/pip" install -q setuptools wheel nanobind
MPI4JAX_BUILD_MPICC="$V/bin/mpicc" "$V/bin/pip" install -q --no-build-isolation \
    --no-binary mpi4jax "mpi4jax==0.9.1.post2" ||
    echo "gpu.sh: mpi4jax did not build; the benchmark runs without its columns"
export VIRTUAL_ENV=$V PATH=$V/bin:$PATH PYTHONPATH=$ROOT/python
python -m jaxmpi info
for aware in 0 auto; do
    JAXMPI_CUDA_AWARE=$aware "$ROOT/tests/run_pytest_mpi.sh" "$V/bin/mpiexec" -n 2 -- -q \
        "$ROOT/tests/python/test_cuda.py"
done
"$V/bin/mpiexec" -n 2 python "$ROOT/benches/bench_cuda.py"
