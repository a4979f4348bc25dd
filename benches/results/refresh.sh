#!/usr/bin/env bash
# benches/results/refresh.sh -- the short benchmark runs whose output the documentation's
# plots are drawn from (benches/plots.py; ci/docs.sh draws them at every build):
#   ops.json              benches/bench_ops.py: allreduce, allgather and sendrecv from 1 to
#                         4 Mi float32 elements, jaxmpi against mpi4jax and the raw C loop
#   jax_collectives.json  benches/bench_jax_collectives.py: psum, all_gather, ppermute over
#                         gloo and over MPI through jaxmpi
#   ragged.json           benches/bench_ragged.py: the particle migration step, 1 Ki to 256 Ki
#   overlap.json          benches/bench_overlap.py: overlap on the PyPI MPICH
# all at 2 ranks on PyPI MPICH 5.0.2. The plots: `python benches/plots.py benches/results
# OUT` with matplotlib (ci/docs.sh draws them into docs/_generated/plots).
# Needs ci/setup.sh's venvs and builds .venvs/bench-mpi4jax (benches/setup_mpi4jax.sh).
# About 20 minutes on a 2-core machine. usage: benches/results/refresh.sh [PART...]
# (parts: ops jax_collectives ragged overlap; default all).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="$ROOT/benches/results"
cd "$ROOT"
parts=("$@")
((${#parts[@]})) || parts=(ops jax_collectives ragged overlap)
export JAX_PLATFORMS=cpu

for part in "${parts[@]}"; do
    echo "refresh: $part ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
    case $part in
    ops)
        bash benches/setup_mpi4jax.sh
        venv=.venvs/bench-mpi4jax
        mkdir -p target/bench
        "$venv/bin/mpicc" -O2 -shared -fPIC benches/raw_loop.c -o target/bench/libraw_loop.so
        "$venv/bin/mpiexec" -n 2 "$venv/bin/python" benches/bench_ops.py \
            target/bench/libraw_loop.so "$OUT/ops.json" --rounds 3 --no-dispatch \
            --ops allreduce,allgather,sendrecv --sizes 1,16,256,4096,65536,1048576,4194304
        ;;
    jax_collectives)
        .venvs/mpich/bin/python benches/bench_jax_collectives.py --part collectives \
            --rounds 3 --json "$OUT/jax_collectives.json"
        ;;
    ragged)
        .venvs/mpich/bin/mpiexec -n 2 .venvs/mpich/bin/python benches/bench_ragged.py \
            --steps 10 --rounds 3 --max-particles 262144 --calls 500 \
            --json "$OUT/ragged.json"
        ;;
    overlap)
        .venvs/mpich/bin/python benches/bench_overlap.py --builds pypi-mpich-5 --rounds 1 \
            --out "$OUT/overlap.json"
        ;;
    *)
        echo "refresh: unknown part $part (ops jax_collectives ragged overlap)" >&2
        exit 2
        ;;
    esac
done
echo "refresh: done; record the run in benches/results/README.md"
