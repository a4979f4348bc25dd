#!/usr/bin/env bash
# The device-rank layer's planning per call at 1 k to 16 k device ranks, on simulated
# groups: what a cluster's process would pay, measured on any machine. Two tables:
# - core/src/xla/mesh/planning_bench.rs: its steps (a group made, the pieces listed, ranks
#   and positions looked up, a permute placed), one table per layout, beside the quadratic
#   plans they replaced;
# - core/src/xla/mesh/calls_bench.rs: each collective's whole call on one process of a
#   simulated cluster (MPI calls counted, nothing moved), at 1 k, 4 k and 16 k ranks, 1 and
#   8 devices a process, both reduction modes: time and bytes allocated, and their growth.
# Usage: benches/bench_planning.sh   (JAXMPI_BENCH_CASE=part-of-a-name: those calls only)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo test --release -p jaxmpi-core --lib planning_at_scale -- --ignored --nocapture 2>&1 |
    grep -E '^(\||[0-9]+ processes)'
echo
cargo test --release -p jaxmpi-core --lib collectives_at_scale -- --ignored --nocapture 2>&1 |
    grep -E '^\|'
