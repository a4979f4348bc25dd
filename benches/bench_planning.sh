#!/usr/bin/env bash
# The device-rank layer's planning per call at 1 k to 16 k device ranks, on simulated
# groups (core/src/xla/mesh/planning_bench.rs): what a cluster's process would pay, measured
# on any machine, beside the quadratic plans it replaced. Prints one table per layout.
# Usage: benches/bench_planning.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo test --release -p jaxmpi-core --lib planning_at_scale -- --ignored --nocapture 2>&1 |
    grep -E '^(\||[0-9]+ processes)'
