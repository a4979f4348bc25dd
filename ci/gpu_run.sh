#!/usr/bin/env bash
# ci/gpu_run.sh -- the GPU run: on the GPU test machine, from this tree and .gpu/ alone, at
# most 6 minutes in all, spent in the order the results matter.
#
# usage: ci/gpu_run.sh [--dry-run]
#   1. probes, diagnostics only (INFO lines, never a failure): nvidia-smi, then
#      ci/gpu_probe.py at 2 ranks over PyPI's MPICH and over Intel MPI with its CUDA support
#      on (I_MPI_OFFLOAD=1), JAXMPI_CUDA_AWARE unset: the driver file and version, every
#      libcuda in the process, the GPU each rank chose and when, what the driver says of
#      JAX's buffers (legacy CUDA IPC, handle types, memory pool) and what `auto` decides
#      for them and why.
#   2. staged: tests/python/test_cuda.py and test_cuda_order.py at 2 ranks sharing the GPU
#      over MPICH with JAXMPI_CUDA_AWARE=0, every op asserted staged by jaxmpi's device
#      counters; then test_cuda_order.py with JAXMPI_DISPATCH=fast.
#   3. direct: the same two files over Intel MPI with its CUDA support forced on
#      (I_MPI_OFFLOAD=1) and JAXMPI_CUDA_AWARE=1, every op asserted direct (host-code
#      reductions staged).
#   4. the benchmark (benches/bench_cuda.py at 4 and 64 MiB, staged and direct) if a minute
#      is left, with mpi4jax's columns if it builds there in the time left before that.
# Each step gets at most what is left of the 360 s; a test step not started for want of
# time fails, the benchmark is only left out (INFO).
# Test counts are pinned (gpu_verdict.py junit): a test that skipped or went missing fails.
#
# Needs: .gpu/ from ci/gpu_pack.sh; a python3 with jax (+ its CUDA plugin), numpy and pytest
# (JAXMPI_GPU_PYTHON picks another). No network, no Rust, no binutils: installs only the
# packed files, with pip --no-index --prefix into .gpu-work/ (--target would drop the MPI
# wheel's lib/). Output in $OUT (default .gpu-out/): run.log (all of it), verdicts.txt,
# junit-*/rank<N>.xml, probe-*/rank<N>.json, bench-*.md, nvidia-smi.txt, mpi4jax-build.log.
# Exit status 0 only if no check failed.
#
# --dry-run, on a machine without a GPU, checks this script and the tests: the host's
# Python and its mpi4py wheel (.gpu-cache/dry-run/) stand in for the cp312 ones, the CPU
# stands in for the GPU (JAX_PLATFORMS=cpu, JAXMPI_TEST_STANDIN=cpu: the same tests on CPU
# arrays, the device counters asserted still, the GPU-only tests pinned as skipped), and
# Intel MPI runs without I_MPI_OFFLOAD (its MPI_Init crashes with it where there is no GPU).
# It must pass.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK=$ROOT/.gpu
WORK=$ROOT/.gpu-work
OUT=${OUT:-$ROOT/.gpu-out}
BUDGET=360
DEADLINE=$((SECONDS + BUDGET))
RANKS=2
# The pinned counts: tests collected per rank, and those only a GPU runs (skipped when the
# CPU stands in).
CUDA_TESTS=48
ORDER_TESTS=4
GPU_ONLY=2

dry_run=0
[[ ${1-} == --dry-run ]] && dry_run=1 && shift
if (($#)); then
    sed -n '5p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
mkdir -p "$OUT"
VERDICTS=$OUT/verdicts.txt

say() { echo "gpu_run: $*"; }

verdict() { # NAME STATUS DETAIL: a check's line in verdicts.txt
    printf '%s %s: %s\n' "$( (($2 == 0)) && echo PASS || echo FAIL)" "$1" "$3" | tee -a "$VERDICTS"
}

info() { # NAME DETAIL: a diagnostic's line, which never fails the run
    printf 'INFO %s: %s\n' "$1" "$2" | tee -a "$VERDICTS"
}

left() { echo $((DEADLINE - SECONDS)); }

limit() { # the seconds a step may take: at most $1, at most what is left
    local l
    l=$(left)
    ((l > $1)) && l=$1
    echo $((l < 1 ? 1 : l))
}

# --- Install the packed files (once per pack: a stamp holds its manifest) ---------------
prepare() {
    [[ -f $PACK/MANIFEST ]] || { say "no $PACK/MANIFEST: run ci/gpu_pack.sh first" && return 1; }
    (cd "$PACK" && sha256sum --quiet -c MANIFEST) || { say "$PACK is damaged" && return 1; }
    PY=${JAXMPI_GPU_PYTHON:-python3}
    local links=(--find-links "$PACK") host=$ROOT/.venvs/mpich/bin/python
    if ((dry_run)); then
        [[ -x $host ]] && PY=${JAXMPI_GPU_PYTHON:-$host}
        links+=(--find-links "$ROOT/.gpu-cache/dry-run")
    fi
    "$PY" -c 'import jax, numpy, pytest' || { say "$PY lacks jax, numpy or pytest" && return 1; }
    local stamp
    stamp="$(cat "$PACK/MANIFEST") $("$PY" -VV) $dry_run"
    if [[ "$(cat "$WORK/.stamp" 2>/dev/null)" != "$stamp" ]]; then
        rm -rf "$WORK" && mkdir -p "$WORK/impi" "$WORK/bin"
        # --ignore-installed: a jaxmpi or mpi4py already in the image must not count.
        "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
            --ignore-installed --prefix "$WORK/py" "${links[@]}" mpich mpi4py jaxmpi || return 1
        # Python's own tar: the image may lack xz.
        "$PY" -m tarfile -e "$PACK/impi-min.tar.xz" "$WORK/impi" || return 1
        printf '%s' "$stamp" >"$WORK/.stamp"
    fi
    # Where pip put them depends on the interpreter's install scheme: look.
    SITE=$(find "$WORK/py" -path '*-packages/jaxmpi/__init__.py' | head -n 1)
    SITE=${SITE%/jaxmpi/__init__.py}
    MPICH_LIB=$(find "$WORK/py" -name libmpi.so.12 | head -n 1)
    MPICH_BIN=$(dirname "$(dirname "$MPICH_LIB")")/bin
    [[ -d $SITE && -x $MPICH_BIN/mpiexec ]] || { say "install incomplete in $WORK/py" && return 1; }
    # run_pytest_mpi.sh runs `python`; a wrapper, not a link, keeps a venv's python a venv.
    printf '#!/bin/sh\nexec %q "$@"\n' "$(command -v "$PY")" >"$WORK/bin/python"
    chmod +x "$WORK/bin/python"
    # A --prefix is no site dir: Python would find the packages by PYTHONPATH but not run
    # their .pth files, and jaxmpi's (its startup hook: MPITRAMPOLINE_LIB for jaxlib, the
    # mpi4jax name) must run at every start as in an installed wheel. A sitecustomize runs
    # them; the packed packages stay ahead of any the image has.
    mkdir -p "$WORK/hook"
    printf 'import site\nsite.addsitedir(%s)\n' "'$SITE'" >"$WORK/hook/sitecustomize.py"
    PYTHONPATH_PACKED=$WORK/hook:$SITE
    export PATH="$WORK/bin:$PATH" PYTHONPATH=$PYTHONPATH_PACKED PYTHONDONTWRITEBYTECODE=1
    # Two ranks share one GPU: each would otherwise take 75% of its memory at start.
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    if ((dry_run)); then
        export JAX_PLATFORMS=cpu JAXMPI_TEST_STANDIN=cpu
    else
        export JAX_PLATFORMS=cuda,cpu
        unset JAXMPI_TEST_STANDIN
    fi
    local versions='import sys, jax; print(sys.version.split()[0], "jax", jax.__version__)'
    say "python $("$PY" -c "$versions"), JAX_PLATFORMS=$JAX_PLATFORMS, prefix $WORK/py"
}

# mpi_env staged|direct|auto-mpich|auto-impi: the launcher and environment of one MPI, into
# LAUNCH and ENV. staged and direct force the mode (JAXMPI_TEST_EXPECT: what the tests then
# assert of every op); auto-* leave JAXMPI_CUDA_AWARE unset (the probes).
mpi_env() {
    local impi_lib=$WORK/impi/lib/libmpi.so.12
    case $1 in
    staged | auto-mpich)
        LAUNCH=("$MPICH_BIN/mpiexec" -n "$RANKS")
        ENV=(JAXMPI_MPI="$MPICH_LIB" MPI4PY_LIBMPI="$MPICH_LIB")
        ;;
    direct | auto-impi)
        LAUNCH=("$WORK/impi/bin/mpiexec" -n "$RANKS")
        # shm: one node needs no libfabric (not packed); offload: its CUDA support, on,
        # through the driver XLA and jaxmpi load (its default name is libcuda.so).
        ENV=(JAXMPI_MPI="$impi_lib" MPI4PY_LIBMPI="$impi_lib" I_MPI_FABRICS=shm)
        ((dry_run)) ||
            ENV+=(I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda I_MPI_OFFLOAD_CUDA_LIBRARY=libcuda.so.1)
        ;;
    esac
    case $1 in
    staged) ENV+=(JAXMPI_CUDA_AWARE=0 JAXMPI_TEST_EXPECT=staged) ;;
    direct) ENV+=(JAXMPI_CUDA_AWARE=1 JAXMPI_TEST_EXPECT=direct) ;;
    esac
}

# --- 1. Probes ------------------------------------------------------------------------------
probes() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
        info nvidia-smi "$(grep -m 1 -o 'Driver Version: [0-9.]*' "$OUT/nvidia-smi.txt") $(
            grep -m 1 -oE 'NVIDIA [A-Z][A-Za-z0-9 -]+[0-9]' "$OUT/nvidia-smi.txt")"
    else
        info nvidia-smi "not found"
    fi
    local which
    for which in auto-mpich auto-impi; do
        mpi_env "$which"
        rm -rf "$OUT/probe-$which"
        echo "===== probe $which: ${ENV[*]} ====="
        env -u JAXMPI_CUDA_AWARE "${ENV[@]}" timeout "$(limit 40)" "${LAUNCH[@]}" \
            python "$ROOT/ci/gpu_probe.py" "$OUT/probe-$which" >"$OUT/probe-$which.log" 2>&1 ||
            info "probe-$which" "exit status $? (see probe-$which.log)"
        python "$ROOT/ci/gpu_verdict.py" probe "$OUT/probe-$which" "$RANKS" | tee -a "$VERDICTS"
    done
}

# --- 2, 3. Tests ------------------------------------------------------------------------------
# run_tests NAME staged|direct SECONDS COLLECTED SKIPPED [VAR=VALUE...] -- TEST FILES...
run_tests() {
    local name=$1 most=$3 collected=$4 skipped=$5
    mpi_env "$2"
    shift 5
    while [[ $1 != -- ]]; do ENV+=("$1") && shift; done
    shift
    local seconds
    seconds=$(limit "$most")
    if ((seconds < 30)); then
        verdict "$name" 1 "not run: $(left) s of the $BUDGET s left"
        return
    fi
    rm -rf "$OUT/junit-$name"
    echo "===== $name: ${ENV[*]} ($seconds s at most) ====="
    local started=$SECONDS said rc
    env "${ENV[@]}" JAXMPI_TEST_JUNITDIR="$OUT/junit-$name" JAXMPI_TEST_TIMEOUT="$seconds" \
        "$ROOT/tests/run_pytest_mpi.sh" "${LAUNCH[@]}" -- -q -rs "${@/#/$ROOT/}"
    said=$(python "$ROOT/ci/gpu_verdict.py" junit "$OUT/junit-$name" "$RANKS" "$collected" \
        --skipped "$skipped")
    rc=$?
    said=${said//PASS: /}
    said=${said//FAIL: /}
    verdict "$name" "$rc" "${said//$'\n'/; } ($((SECONDS - started)) s)"
}

tests() {
    local skips=0
    ((dry_run)) && skips=$GPU_ONLY
    local both=(tests/python/test_cuda.py tests/python/test_cuda_order.py)
    run_tests staged staged 110 $((CUDA_TESTS + ORDER_TESTS)) "$skips" -- "${both[@]}"
    run_tests staged-fast staged 45 "$ORDER_TESTS" 0 JAXMPI_DISPATCH=fast -- \
        tests/python/test_cuda_order.py
    run_tests direct direct 110 $((CUDA_TESTS + ORDER_TESTS)) "$skips" -- "${both[@]}"
}

# --- 4. Benchmark -----------------------------------------------------------------------------
# mpi4jax from its sdist against the packed MPICH (no build isolation: its build tools are
# packed too), only while there is time for it and the benchmark after it.
build_mpi4jax() {
    MPI4JAX_SITE=
    if (($(left) < 150)); then
        info mpi4jax "not built: $(left) s left"
        return
    fi
    local log=$OUT/mpi4jax-build.log nvcc
    nvcc=$(command -v nvcc) && export CUDA_PATH=${CUDA_PATH:-$(dirname "$(dirname "$nvcc")")}
    local pip=(python -m pip install --no-index --no-deps --ignore-installed)
    if [[ ! -d $WORK/mpi4jax ]] &&
        ! { "${pip[@]}" --prefix "$WORK/tools" --find-links "$PACK" setuptools wheel nanobind &&
            PYTHONPATH="$(find "$WORK/tools" -type d -name '*-packages' | head -n 1):$PYTHONPATH" \
                MPI4JAX_BUILD_MPICC="$MPICH_BIN/mpicc" timeout "$(limit 60)" \
                "${pip[@]}" --no-build-isolation --prefix "$WORK/mpi4jax" "$PACK"/mpi4jax-*.tar.gz
        } >"$log" 2>&1; then
        rm -rf "$WORK/mpi4jax" # half built: try again next time
    fi
    local site
    site=$(find "$WORK/mpi4jax" -path '*-packages/mpi4jax/__init__.py' 2>/dev/null | head -n 1)
    if [[ -n $site ]]; then
        MPI4JAX_SITE=$(dirname "$(dirname "$site")")
        info mpi4jax "built (${nvcc:+with CUDA from $CUDA_PATH}${nvcc:-no nvcc: CPU only})"
    else
        info mpi4jax "did not build: $(tail -n 1 "$log")"
    fi
}

bench() {
    build_mpi4jax
    local mode rc
    for mode in staged direct; do
        mpi_env "$mode"
        if (($(left) < 60)); then
            info "bench-$mode" "not run: $(left) s of the $BUDGET s left"
            continue
        fi
        echo "===== bench $mode: ${ENV[*]} ====="
        # mpi4jax's CUDA bridge links libcudart without an rpath: nvcc's lib64 (never stubs/).
        env "${ENV[@]}" JAXMPI_BENCH_MIB="4 64" \
            PYTHONPATH="$PYTHONPATH_PACKED${MPI4JAX_SITE:+:$MPI4JAX_SITE}" \
            LD_LIBRARY_PATH="${CUDA_PATH:+$CUDA_PATH/lib64:}${LD_LIBRARY_PATH-}" \
            timeout "$(limit 60)" "${LAUNCH[@]}" python "$ROOT/benches/bench_cuda.py" \
            2>&1 | tee "$OUT/bench-$mode.md"
        rc=${PIPESTATUS[0]}
        case $rc in
        0) verdict "bench-$mode" 0 "table in bench-$mode.md" ;;
        3) verdict "bench-$mode" 1 "no GPU: nothing measured" ;;
        *) verdict "bench-$mode" 1 "exit status $rc; see bench-$mode.md" ;;
        esac
    done
}

main() {
    : >"$VERDICTS"
    ((dry_run)) && say "DRY RUN: the CPU stands in for the GPU"
    prepare || { verdict prepare 1 "could not install from $PACK" && return 1; }
    probes
    tests
    bench
    echo "===== verdicts ($VERDICTS) after $SECONDS s of $BUDGET ====="
    cat "$VERDICTS"
    ! grep -q '^FAIL' "$VERDICTS"
}

main 2>&1 | tee "$OUT/run.log"
status=${PIPESTATUS[0]}
result=$( ((status == 0)) && echo PASSED || echo FAILED)
echo "gpu_run: $result in $SECONDS s" | tee -a "$OUT/run.log"
exit "$status"
