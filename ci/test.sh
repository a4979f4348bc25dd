#!/usr/bin/env bash
# ci/test.sh -- the project's one test command (CI runs it through .ci/run).
#
# Works on a fresh clone on a fresh machine: it runs ci/setup.sh first (apt packages, one
# venv per MPI wheel, the trixie chroot for Python 3.13 and its venvs for JAX 0.11/0.12,
# cargo build, the x86_64 release wheel every venv installs), then the steps below, each
# a script of its own (the checks in ci/checks/), and the MPI matrix of ci/matrix.sh: the
# probe on every build, the Python suite's cells (which tests each runs: the markers in
# tests/python, read by tests/python/selection.py), across hosts, under Slurm, the
# reliability checks and the documentation. It ends with a summary table, a time table
# (wall seconds per step and cell; the whole run must stay under 45 minutes on an idle
# 2-core machine, CI allows 90) and a line "N passed, N failed[, N skipped]".
# Every step runs even if an earlier one failed; the exit status is non-zero if any
# failed. Logs: .ci-out/ (one file per step, .ci-out/matrix/ one per cell).
#
# Knobs (environment): JAXMPI_PROBE, JAXMPI_CELL_TIMEOUT, JAXMPI_MATRIX_ONLY (see
# ci/matrix.sh), JAXMPI_SKIP_BUILD (see ci/setup.sh), JAXMPI_MATRIX_BUDGET=3000 (seconds
# for all the matrix cells) and JAXMPI_STEPS (which steps and cells run; see ci/steps.sh),
# JAXMPI_PYTEST_TIMEOUT=600 (per Python cell).

# No `set -e`: a failing step must not stop the run; each step's status is recorded.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/.ci-out"
cd "$ROOT" || exit 1
# rustup's cargo/clippy/rustfmt live here; a non-login CI shell may lack it.
[[ -d $HOME/.cargo/bin ]] && PATH="$HOME/.cargo/bin:$PATH"
# Start from an empty log folder so no stale log is mistaken for this run's.
rm -rf "$OUT"
mkdir -p "$OUT/matrix"
# shellcheck source=steps.sh source-path=SCRIPTDIR
source "$ROOT/ci/steps.sh"
# shellcheck source=matrix.sh source-path=SCRIPTDIR
source "$ROOT/ci/matrix.sh"
CHECKS=$ROOT/ci/checks

GROUP=setup
step "setup" setup bash "$ROOT/ci/setup.sh"

GROUP=checks
step "cargo fmt" fmt cargo fmt --all -- --check
step "cargo clippy" clippy cargo clippy --workspace --all-targets -- -D warnings
step "cargo test" cargo-test "$CHECKS/cargo_test.sh"
step "ruff: lint and format" ruff "$CHECKS/ruff.sh"
step "mypy" mypy "$CHECKS/mypy.sh"
# python/jaxmpi imports one way, from the public API down to the runtime, without a cycle.
step "python: import layers" import-layers python3 "$ROOT/ci/import_layers.py"
# No Rust folder's files import each other in a circle (ci/checks/rust_import_cycles.py).
step "rust: no import circle inside a folder" rust-import-cycles python3 "$CHECKS/rust_import_cycles.py"
step "scripts: run bits in git" run-bits "$CHECKS/run_bits.sh"
# A test file added to tests/python runs on every build, with no list to touch.
step "tests: the suite's selection" selection "$CHECKS/selection.sh"
# The GPU run's scripts (ci/gpu_run.sh runs only on a GPU machine): syntax, offline
# installs, and the verdict logic on canned reports.
step "GPU scripts (no GPU: syntax, offline, verdict logic)" gpu-check bash "$ROOT/ci/gpu_check.sh"
# jaxmpi's GPU start-up with JAX's real CUDA plugins installed and no GPU, as on a cluster's
# login node: import, info, a 2-rank allreduce, the start-up on a faked driver (3 passes,
# ~50 s each on 2 cores).
step "GPU start-up with JAX's CUDA 12 and 13 plugins, no GPU" gpu-startup "$ROOT/tests/gpu_startup.sh"
# setup built the x86_64 wheel (the tests install it); the aarch64 one and the sdist.
step "wheels: aarch64 and sdist" wheels bash "$ROOT/ci/wheels.sh"
step "readelf: no DT_NEEDED on MPI/CUDA/Python" readelf "$CHECKS/needed.sh"
# One wheel per architecture for every Python >= 3.10 and glibc >= 2.17.
step "wheels: abi3, manylinux tag, size" wheel-check "$CHECKS/wheel_tags.sh"
step "XLA plug-in: the names of jaxlib 0.6.2 to 0.12 exported" xla-plugin-contract "$CHECKS/xla_plugin_contract.sh"

banner "MPI matrix: probe $(matrix_probe)"
probe_cells=()
for build in "${JAXMPI_MATRIX_BUILDS[@]}"; do
    [[ ${JAXMPI_MATRIX_PROBE[$build]} == probe ]] || continue
    for n in "${JAXMPI_MATRIX_RANKS[@]}"; do probe_cells+=("$build $n"); done
done
for build in "${JAXMPI_MATRIX_SIDE_BUILDS[@]}"; do
    [[ ${JAXMPI_MATRIX_PROBE[$build]} == probe ]] || continue
    for n in "${JAXMPI_MATRIX_SIDE_RANKS[@]}"; do probe_cells+=("$build $n"); done
done
matrix_cells probe run_cell "${probe_cells[@]}"

GROUP=checks
step "selection errors" selection-errors "$ROOT/tests/selection_errors.sh" "$(matrix_probe)"
# The linked backend (mpi-sys, bindings from each MPI's own mpi.h) against jaxmpi's own
# ABI tables, on Debian's Open MPI and MPICH.
step "linked oracle (Debian Open MPI + MPICH)" oracle bash "$ROOT/ci/oracle.sh"

# The Python suite, group by group (ci/matrix.sh's JAXMPI_SUITE_TABLE): at 2 ranks on
# every build (and 1 on the first), at 3 where the number of ranks enters, the files under
# jax.distributed in processes of their own, non-blocking ops with the progress thread.
banner "MPI matrix: Python suite"
# The documentation (ci/docs.sh): the site built with -W, its internal links and anchors,
# every example under mpirun -n 2 with its output compared (one job per environment, not
# one per block), three pages rendered by headless chromium: ~40 s (73% busy), setup having
# installed .venvs/docs and chromium. It runs beside the suite's first cell, one rank on
# two cores (54% busy alone), and ends within it.
GROUP=docs
step_beside "docs: build -W, links, examples under mpirun, screenshots" docs bash "$ROOT/ci/docs.sh"
suite_cells pytest
steps_joined
suite_cells pytest-ranks
suite_cells sharded
suite_cells nonblocking-agent
suite_cells layouts

# The device-rank layer against gloo (tests/differential/run.py): generated sharded programs,
# per-device branches and loops, permutes, MeshComm ops with PROC_NULL ends and GSPMD
# reshapes among them, each run with JAX's collectives on gloo and on jaxmpi and compared
# bit for bit: 4 seeds in each of 8 layouts (2x1 to 4x2): 3 fixed ones and one of the
# commit's (its hash's, so each commit explores a program no earlier one ran, and a
# failure reproduces with `--seeds N`), then 3 seeds at 3x2 and 4x2 under
# JAXMPI_MESH_REDUCTIONS=ordered (its 2x2 and 1x4 are pytest cells): ~140 s on 2 cores
# (117 s and 25 s; with 6 fixed seeds it was 121 s and 25 s).
# The soak, thousands of programs: benches/RESULTS.md.
GROUP=differential
commit_seed=$((16#$(git -C "$ROOT" rev-parse --short=7 HEAD 2>/dev/null || echo 0) % 100000 + 1000))
step "device ranks against gloo: generated programs, 8 layouts" differential \
    "$ROOT/.venvs/mpich/bin/python" "$ROOT/tests/differential/run.py" \
    --seeds "0,1,2,$commit_seed" --out "$OUT/differential"
step "device ranks against gloo: ordered reductions" differential-ordered \
    "$ROOT/.venvs/mpich/bin/python" "$ROOT/tests/differential/run.py" --seeds 100:103 \
    --layouts 3x2,4x2 --env JAXMPI_MESH_REDUCTIONS=ordered --out "$OUT/differential-ordered"

# Across 2 simulated hosts (ci/hosts.sh; needs root): the ops on both PyPI wheels, node-local
# ranks at 2 x 2, then 16 device ranks (2 hosts x 4 processes x 2 devices: JAX's
# collectives through the pass and a MeshComm's allreduce and halo, ~8-10 s), settings the
# ranks disagree on, a lost host and a cut link.
GROUP=multihost
# shellcheck source=multihost.sh source-path=SCRIPTDIR
source "$ROOT/ci/multihost.sh"
selected "multihost " && multihost_cells # the cluster only where a cell of it is wanted
step "across hosts: 16 device ranks, settings, lost host, cut link" multihost-faults \
    "$ROOT/tests/multihost_faults.sh"

# Under Slurm (ci/slurm.sh: 2 nodes on the simulated hosts; needs root): srun, sbatch and
# salloc + mpiexec/mpirun on both PyPI wheels, the wrong --mpi, --export, then scancel,
# --time and a node lost: 2m15s, the cores half idle (Slurm noticing a lost node, a time
# limit's minute, launches), so it runs beside JAX's collectives' jobs (below; 58% busy
# alone), which use neither the simulated hosts nor anything else of Slurm's: 206-254 s
# for both in three runs, where one after the other took 305 s.
GROUP=slurm
step_beside "under Slurm: srun, sbatch, salloc; wrong --mpi; scancel, --time, node lost" slurm \
    "$ROOT/tests/slurm_jobs.sh"
# JAX's collectives over MPI, a job per check: import and initialization orders on every
# family (the usual order on every build), exit status, JAXMPI_DEBUG's lines, a stuck
# collective under JAXMPI_TIMEOUT, the refusals, a program without MPI collectives; then
# jaxmpi and jax in different site directories (the startup hook decides at `import jax`).
GROUP=jax-collectives
step "JAX's collectives over MPI: orders, exit, debug, timeout, refusals" jax-collectives-jobs \
    "$ROOT/tests/jax_collectives_jobs.sh"
step "JAX's collectives over MPI: jaxmpi and jax in different site directories" startup-layouts \
    "$ROOT/tests/startup_layouts.sh"
# Where plain jax.distributed.initialize() cannot start from an MPI job (Open MPI 5 without
# mpi4py, a Slurm allocation's variables) and jaxmpi.distributed.initialize() can (~15 s).
step "jax.distributed from MPI jobs: Open MPI 5 without mpi4py, Slurm's variables" \
    jax-distributed-jobs "$ROOT/tests/jax_distributed_jobs.sh"
# Profiling tools see every MPI call: a PMPI interposer preloaded through the launcher
# counts exactly the calls JAXMPI_DEBUG names (ops, a started op, MeshComm, psum through
# the pass and through the plug-in), on PyPI MPICH and Open MPI; copies not preloaded are
# never called (~40 s).
step "profiling tools: a preloaded PMPI interposer sees every MPI call" interposer-jobs \
    "$ROOT/tests/interposer_jobs.sh"
steps_joined

# Messages over 2^31-1 elements, one cell at a time.
suite_cells large

GROUP=linked
step "Python suite, linked build on Debian MPICH" linked-python bash "$ROOT/ci/linked_python.sh"
# jaxmpi's own profile (JAXMPI_PROFILE, jaxmpi.profile, python -m jaxmpi profile): a known
# program on PyPI MPICH and Open MPI (its calls, bytes and call sites in each rank's file
# and in the merge, the merged trace field by field, the clocks within 1 ms, also with a
# rank's clock 5 s ahead and 500 ppm fast), records overflowing, the merge's bad input, the
# shallow-water demo at 4 ranks and a training step at 2x2 through the pass, written,
# merged and plotted; the plug-in on the oldest JAX (25 s on an idle 2-core machine).
GROUP=profile
step "jaxmpi's own profile: recorded, merged, plotted; clocks; bad input" profile-jobs \
    "$ROOT/tests/profile_jobs.sh"
# jaxmpi's ops on a MeshComm (ranks are devices), whole jobs on both families: the
# shallow-water model at 4x1, 2x2 and 1x4 bit for bit, JAXMPI_DEBUG, JAXMPI_TIMEOUT.
GROUP=mesh-comm
step "MeshComm: shallow water in three layouts, debug, timeout" mesh-comm-jobs \
    "$ROOT/tests/mesh_comm_jobs.sh"
GROUP=reliability
# Failures that end a job: a receive that never matches under JAXMPI_TIMEOUT, concurrent
# calls below MPI_THREAD_MULTIPLE, JAXMPI_DEBUG's lines, bad values of the env vars.
step "reliability: errors, timeout, debug" reliability-errors "$ROOT/tests/reliability_errors.sh"
# A rank killed mid-job: every build at 2 ranks (3 on those with a launcher of their own)
# must end the job, with a diagnostic.
step "reliability: rank death" rank-death "$ROOT/tests/rank_death.sh"
# Memory stays flat over many calls (the full-size soak is benches/soak.py).
step "reliability: soak (lite)" soak "$ROOT/ci/soak.sh"
# Dispatch: exit with jitted sends and receives still in flight on every build (both
# modes), and tests/python/test_dispatch.py under JAXMPI_DISPATCH=ordered.
step "dispatch modes" dispatch-modes "$ROOT/tests/dispatch_modes.sh"

summary
