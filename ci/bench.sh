#!/usr/bin/env bash
# ci/bench.sh -- jaxmpi ops against a raw C loop over the same MPI (benches/bench_ops.py),
# on 2 ranks of the embedded MPICH. Sets everything up first, like ci/test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/ci/setup.sh"
venv="$ROOT/.venvs/mpich"
mkdir -p "$ROOT/target/bench"
raw="$ROOT/target/bench/libjaxmpi_raw.so"
"$venv/bin/mpicc" -O2 -shared -fPIC "$ROOT/benches/raw_loop.c" -o "$raw"
VIRTUAL_ENV=$venv PATH="$venv/bin:$PATH" JAX_PLATFORMS=cpu \
    "$venv/bin/mpiexec" -n 2 "$venv/bin/python" "$ROOT/benches/bench_ops.py" "$raw"
