#!/usr/bin/env bash
# ci/bench.sh -- jaxmpi against mpi4jax and a raw C loop over the same MPI, in one go:
#   1. every op at 1, 4 Ki and 4 Mi float32 elements inside a jitted fori_loop, and the
#      cost of calling a tiny jitted function with one op (benches/bench_ops.py), on
#      2 ranks and on 4 (oversubscribed on a 2-core machine; reported separately);
#   2. the shallow-water solve: examples/shallow_water.py on jaxmpi against mpi4jax's own
#      example on mpi4jax, and on jaxmpi as a drop-in (benches/bench_shallow_water.py);
#   3. benches/RESULTS.md (the tables; the analysis around them is kept) and
#      benches/bench_plot.png (benches/report.py).
# Sets everything up first: ci/setup.sh, then benches/setup_mpi4jax.sh (the venv
# .venvs/bench-mpi4jax, where mpi4jax is built with the mpicc of the same MPICH wheel).
#
# Knobs: BENCH_RANKS ("2 4"), BENCH_ROUNDS (7), BENCH_SW_ROUNDS (3; 0 skips the
# shallow-water part), BENCH_OUT (target/bench: the JSON files).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RANKS=${BENCH_RANKS:-2 4}
ROUNDS=${BENCH_ROUNDS:-7}
SW_ROUNDS=${BENCH_SW_ROUNDS:-3}
OUT=${BENCH_OUT:-$ROOT/target/bench}

bash "$ROOT/ci/setup.sh"
bash "$ROOT/benches/setup_mpi4jax.sh"
venv="$ROOT/.venvs/bench-mpi4jax"
export VIRTUAL_ENV=$venv PATH="$venv/bin:$PATH" JAX_PLATFORMS=cpu
mkdir -p "$OUT"
raw="$OUT/libraw_loop.so" minimal="$OUT/libffi_minimal.so"
"$venv/bin/mpicc" -O2 -shared -fPIC "$ROOT/benches/raw_loop.c" -o "$raw"
"$venv/bin/mpicxx" -O2 -std=c++17 -shared -fPIC -Wno-return-type \
    -I"$("$venv/bin/python" -c 'import jax.ffi; print(jax.ffi.include_dir())')" \
    "$ROOT/benches/ffi_minimal.cc" -o "$minimal"

ops_files=()
for n in $RANKS; do
    echo "bench: ops on $n ranks"
    timeout 3600 "$venv/bin/mpiexec" -n "$n" "$venv/bin/python" "$ROOT/benches/bench_ops.py" \
        "$raw" "$OUT/ops_$n.json" --rounds "$ROUNDS" --minimal "$minimal"
    ops_files+=("$OUT/ops_$n.json")
done

sw=()
if ((SW_ROUNDS > 0)); then
    echo "bench: shallow water on 2 ranks"
    example=$(ls "$venv"/src/mpi4jax-*/examples/shallow_water.py)
    "$venv/bin/python" "$ROOT/benches/bench_shallow_water.py" "$example" "$OUT/sw.json" \
        --ranks 2 --rounds "$SW_ROUNDS"
    sw=(--sw "$OUT/sw.json")
fi

"$venv/bin/python" "$ROOT/benches/report.py" "$ROOT/benches/RESULTS.md" \
    "$ROOT/benches/bench_plot.png" "${ops_files[@]}" "${sw[@]}"
