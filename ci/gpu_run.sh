#!/usr/bin/env bash
# ci/gpu_run.sh -- the GPU run: on the GPU test machine, from this tree and .gpu/ alone, at
# most 6 minutes in all, spent in the order the results matter.
#
# usage: ci/gpu_run.sh [--dry-run | --plan]
#   0. prepare: installs the packed files; records the JAX it tests, which is the image's
#      (the pack cannot bring one: ci/gpu_pack.sh says why), with its CUDA plugin's version
#      and CUDA major (verdict jax); collects the test files with pytest, beside the probes,
#      for the counts every test step must reach (verdict collect).
#   1. probes, diagnostics only (INFO lines, never a failure): nvidia-smi, then
#      ci/gpu_probe.py at 2 ranks over PyPI's MPICH and over Intel MPI with its CUDA support
#      on (I_MPI_OFFLOAD=1, I_MPI_DEBUG=10), JAXMPI_CUDA_AWARE unset: the driver file and
#      version, every libcuda in the process, the GPU each rank chose and when, what the
#      driver says of JAX's buffers (legacy CUDA IPC, handle types, memory pool) and what
#      `auto` decides for them and why.
#   2. staged: tests/python/test_cuda.py and test_cuda_order.py at 2 ranks sharing the GPU
#      over MPICH with JAXMPI_CUDA_AWARE=0, every op asserted staged by jaxmpi's device
#      counters; then test_cuda_order.py with JAXMPI_DISPATCH=fast; then, in a job of its
#      own, the MPI-error test (staged-error).
#   3. direct: the same over Intel MPI with its CUDA support forced on (I_MPI_OFFLOAD=1,
#      I_MPI_DEBUG=5) and JAXMPI_CUDA_AWARE=1, every op asserted direct (host-code reductions
#      and in-place sendrecv staged); then direct-error. Intel MPI moves device buffers
#      within a node by legacy CUDA IPC, which cannot share what XLA allocates with
#      cuMemCreate or a memory pool: its GPU IPC stays on only where the Intel MPI probe
#      found every JAX buffer shareable, else I_MPI_OFFLOAD_IPC=0 (INFO direct-ipc says
#      which, and why).
#   4. the benchmark (benches/bench_cuda.py at 4 and 64 MiB, staged and direct) if a minute
#      is left, with mpi4jax's columns if it builds there in the time left before that:
#      a diagnostic, INFO lines whatever its exit status.
# Each step has a ceiling (CEILING below: the most it may take, a kill's grace included)
# and gets at most what is left of the 360 s; the ceilings fit the budget with a margin to
# spare, so a run whose every step hangs still ends in time (`--plan` prints them and
# checks the sum; ci/gpu_check.sh runs it). A test step left less than half its ceiling
# fails unrun; the benchmark is only left out (INFO). Every test step runs under
# JAXMPI_TIMEOUT, so a rank stuck in an MPI call says which before its job ends.
# The MPI-error test runs alone: under ordered dispatch (the GPU default) the error may
# poison JAX's runtime token, and a rank that then skips a program leaves its partner
# waiting; alone, that can cost only its own short job.
# A test step passes only if every rank's report (gpu_verdict.py junit) holds as many tests
# as pytest collected from the files, none failed and none skipped, and every rank and the
# job exited 0: a crash or hang at exit after a clean report fails it too.
#
# Needs: .gpu/ from ci/gpu_pack.sh; a python3 with jax (+ its CUDA plugin), numpy and pytest
# (JAXMPI_GPU_PYTHON picks another). No network, no Rust, no binutils: installs only the
# packed files, with pip --no-index --prefix into .gpu-work/ (--target would drop the MPI
# wheel's lib/).
# Output in $OUT (default .gpu-out/, emptied first), three files, as the GPU machine brings
# back at most 8: run.log (all of it), verdicts.txt, and results.tar.gz (Python's tarfile,
# no xz needed) of everything else: jax.json, collected.txt, junit-*/rank<N>.xml,
# logs-*/rank<N>.{log,rc} (each rank's pytest output and exit status), probe-*/rank<N>.json,
# probe-*.log, bench-*.md, nvidia-smi.txt, mpi4jax-build.log. The archive is rewritten
# after every step and on any exit (a signal too), so a run cut short still returns what
# it found; the returned-files verdict checks that all of $OUT would come back.
# Exit status 0 only if no check failed.
#
# --dry-run, on a machine without a GPU, checks this script and the tests: the host's
# Python and its mpi4py wheel (.gpu-cache/dry-run/) stand in for the cp312 ones, the CPU
# stands in for the GPU (JAX_PLATFORMS=cpu, JAXMPI_TEST_STANDIN=cpu: the same tests on CPU
# arrays, the device counters asserted still, the GPU-only tests skipped, saying so), and
# Intel MPI runs without I_MPI_OFFLOAD (its MPI_Init crashes with it where there is no GPU).
# It must pass.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK=$ROOT/.gpu
WORK=$ROOT/.gpu-work
DEFAULT_OUT=$ROOT/.gpu-out
OUT=$(realpath -m -- "${OUT:-$DEFAULT_OUT}")
RESULTS=$WORK/results # what results.tar.gz holds
BUDGET=360
DEADLINE=$((SECONDS + BUDGET))
RANKS=2
# The most each step may take, in seconds, a kill's grace included. Their sum, the
# install's PREPARE_MOST and MARGIN fit BUDGET. The benchmark has no ceiling here: it runs
# only in what is left. Estimated per test leg on one GPU: two Python starts with the CUDA
# plugin, ~100 XLA:GPU compiles (a GEMM autotune among them), 50-70 s.
declare -A CEILING=([probe-auto-mpich]=25 [probe-auto-impi]=25 [staged]=80
    [staged-fast]=35 [staged-error]=30 [direct]=80 [direct-error]=30)
STEPS=(probe-auto-mpich probe-auto-impi staged staged-fast staged-error direct direct-error)
# Installing the packed wheels and unpacking Intel MPI, first time on a pack.
PREPARE_MOST=15
MARGIN=30
# pytest's collection runs beside the probes (on the CPU), so it adds nothing while it
# takes no longer than they do.
COLLECT_MOST=40
# tests/run_pytest_mpi.sh kills a job this long after its timeout.
PYTEST_KILL_GRACE=10
TEST_FILES=(tests/python/test_cuda.py tests/python/test_cuda_order.py)
ERROR_TEST=test_an_mpi_error_then_a_good_call
# What pytest says of a GPU-only test the dry run skips (tests/python/device_helpers.py).
STANDIN_SKIP="the CPU stands in for the GPU"
# Until the Intel MPI probe says every JAX buffer can take legacy CUDA IPC.
IMPI_IPC=(I_MPI_OFFLOAD_IPC=0)

# The ceilings against the budget: prints them, and fails where they do not fit.
plan() {
    local step sum=0 probes=0
    for step in "${STEPS[@]}"; do
        printf '  %-18s %4d s\n' "$step" "${CEILING[$step]}"
        sum=$((sum + CEILING[$step]))
        [[ $step == probe-* ]] && probes=$((probes + CEILING[$step]))
    done
    printf '  %-18s %4d s (beside the probes, %d s)\n' collect "$COLLECT_MOST" "$probes"
    printf '  %-18s %4d s\n  %-18s %4d s of %d s, %d s to spare (want %d)\n' prepare \
        "$PREPARE_MOST" total $((sum + PREPARE_MOST)) "$BUDGET" \
        $((BUDGET - sum - PREPARE_MOST)) "$MARGIN"
    ((sum + PREPARE_MOST + MARGIN <= BUDGET && COLLECT_MOST <= probes))
}

dry_run=0
case ${1-} in
--dry-run) dry_run=1 && shift ;;
--plan) shift && (($# == 0)) && { plan; exit; } ;;
esac
if (($#)); then
    sed -n '5p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
[[ $OUT == "$DEFAULT_OUT" ]] && rm -rf "$OUT"
mkdir -p "$OUT"
VERDICTS=$OUT/verdicts.txt
# Test files by their paths from here; pytest's -k and --junitxml need no others.
cd "$ROOT" || exit 1

say() { echo "gpu_run: $*"; }

verdict() { # NAME STATUS DETAIL: a check's line in verdicts.txt
    printf '%s %s: %s\n' "$( (($2 == 0)) && echo PASS || echo FAIL)" "$1" "$3" | tee -a "$VERDICTS"
}

info() { # NAME DETAIL: a diagnostic's line, which never fails the run
    printf 'INFO %s: %s\n' "$1" "$2" | tee -a "$VERDICTS"
}

left() { echo $((DEADLINE - SECONDS)); }

archive() { # RESULTS into OUT/results.tar.gz; prints gpu_verdict.py's PASS or FAIL line
    "${JAXMPI_GPU_PYTHON:-python3}" "$ROOT/ci/gpu_verdict.py" archive "$RESULTS" "$OUT"
}

limit() { # CEILING [GRACE]: the seconds a step may take, at most CEILING and what is
    # left, less GRACE (the kill's, when the step is stopped by a signal and then killed)
    local l
    l=$(left)
    ((l > $1)) && l=$1
    l=$((l - ${2:-0}))
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
    say "$("$PY" -VV | head -n 1), JAX_PLATFORMS=$JAX_PLATFORMS, prefix $WORK/py"
}

# The JAX under test, the image's, as the report must state it: jax, jaxlib, the CUDA
# plugin's version and CUDA major, against the driver's CUDA (nvidia-smi's header).
which_jax() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi >"$RESULTS/nvidia-smi.txt" 2>&1
        info nvidia-smi "$(grep -m 1 -o 'Driver Version: [0-9.]*' "$RESULTS/nvidia-smi.txt") $(
            grep -m 1 -oE 'NVIDIA [A-Z][A-Za-z0-9 -]+[0-9]' "$RESULTS/nvidia-smi.txt")"
    else
        info nvidia-smi "not found"
    fi
    local said rc cpu=()
    ((dry_run)) && cpu=(--cpu)
    python "$ROOT/ci/gpu_verdict.py" installed >"$RESULTS/jax.json"
    said=$(python "$ROOT/ci/gpu_verdict.py" jax "$RESULTS/jax.json" \
        --driver "$RESULTS/nvidia-smi.txt" "${cpu[@]}")
    rc=$?
    verdict jax "$rc" "$(sed 's/^\(PASS\|FAIL\|INFO\): //' <<<"$said" | paste -sd ';')"
}

# --- What the test files hold -------------------------------------------------------------
# pytest collects them once, with the CPU standing in (no GPU client to start, and no
# test's parameters depend on the device: the items are the GPU run's), beside the probes.
# Every test step's expected count comes from this list, never from a number written here.
collect() {
    env JAX_PLATFORMS=cpu JAXMPI_TEST_STANDIN=cpu JAXMPI_MPI="$MPICH_LIB" \
        MPI4PY_LIBMPI="$MPICH_LIB" timeout -k 5 "$(limit "$COLLECT_MOST" 5)" "$MPICH_BIN/mpiexec" -n 1 \
        python -m pytest -p no:cacheprovider -q --collect-only "${TEST_FILES[@]}" \
        >"$RESULTS/collected.txt" 2>&1
    echo $? >"$RESULTS/collected.rc"
}

# expected LEG: how many tests LEG runs per rank, by the collected list (0 without one).
expected() {
    local listing=$RESULTS/collected.txt item='^[^ ]*\.py::' error="::$ERROR_TEST(\[|$)"
    [[ $(cat "$RESULTS/collected.rc" 2>/dev/null) == 0 ]] || { echo 0 && return; }
    case $1 in
    staged | direct) grep -E "$item" "$listing" | grep -cvE "$error" ;;
    staged-fast) grep -cE "^([^ ]*/)?${TEST_FILES[1]##*/}::" "$listing" ;;
    *-error) grep -E "$item" "$listing" | grep -cE "$error" ;;
    esac
}

# The collection's verdict: it ran, and found the MPI-error test once and the rest.
collected() {
    local status main error
    status=$(cat "$RESULTS/collected.rc" 2>/dev/null || echo "none (not finished)")
    main=$(expected staged) error=$(expected staged-error)
    if [[ $status == 0 ]] && ((main > 0 && error == 1)); then
        verdict collect 0 "$main tests and $ERROR_TEST in ${TEST_FILES[*]}, \
$(expected staged-fast) of them in ${TEST_FILES[1]##*/}"
    else
        verdict collect 1 "pytest --collect-only: exit status $status, $main tests besides \
$error $ERROR_TEST (see collected.txt)"
    fi
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
        # Level 5 lists every I_MPI_* setting in effect (Intel's I_MPI_DEBUG reference);
        # the probe, a few calls, gets everything above it too.
        ENV+=(I_MPI_DEBUG="$([[ $1 == direct ]] && echo 5 || echo 10)")
        ;;
    esac
    case $1 in
    staged) ENV+=(JAXMPI_CUDA_AWARE=0 JAXMPI_TEST_EXPECT=staged) ;;
    direct) ENV+=(JAXMPI_CUDA_AWARE=1 JAXMPI_TEST_EXPECT=direct "${IMPI_IPC[@]}") ;;
    esac
}

# Every device pointer goes to Intel MPI in the direct leg, XLA's allocations included: it
# keeps its GPU IPC only where the probe found every JAX buffer shareable by legacy CUDA IPC
# (the driver's is_legacy_cuda_ipc_capable, per rank), else it moves them without IPC.
# I_MPI_OFFLOAD_IPC is not in the Developer Reference pages on GPU support (2021.8 to
# 2021.15, "current"), only named by impi-rt 2021.18's libmpi.so.12 (beside
# I_MPI_OFFLOAD_IPC_THRESHOLD and _MANAGED) and set to 0 in public job scripts run with
# I_MPI_OFFLOAD_MODE=cuda; the direct leg's log (I_MPI_DEBUG=5) shows whether it took.
choose_impi_ipc() {
    local said
    if said=$(python "$ROOT/ci/gpu_verdict.py" ipc "$RESULTS/probe-auto-impi" "$RANKS"); then
        IMPI_IPC=()
        info direct-ipc "Intel MPI's GPU IPC left on: $said"
    else
        IMPI_IPC=(I_MPI_OFFLOAD_IPC=0)
        info direct-ipc "Intel MPI's GPU IPC off (I_MPI_OFFLOAD_IPC=0): $said"
    fi
}

# --- 1. Probes ------------------------------------------------------------------------------
probes() {
    local which
    for which in auto-mpich auto-impi; do
        mpi_env "$which"
        echo "===== probe $which: ${ENV[*]} ====="
        env -u JAXMPI_CUDA_AWARE "${ENV[@]}" timeout -k 5 "$(limit "${CEILING[probe-$which]}" 5)" \
            "${LAUNCH[@]}" python "$ROOT/ci/gpu_probe.py" "$RESULTS/probe-$which" \
            >"$RESULTS/probe-$which.log" 2>&1 ||
            info "probe-$which" "exit status $? (see probe-$which.log)"
        python "$ROOT/ci/gpu_verdict.py" probe "$RESULTS/probe-$which" "$RANKS" | tee -a "$VERDICTS"
    done
}

# --- 2, 3. Tests ------------------------------------------------------------------------------
# run_tests NAME staged|direct [VAR=VALUE...] -- PYTEST ARGS...: one step, at most its
# ceiling, judged on its reports against the collected count, and on its exit statuses.
run_tests() {
    local name=$1 most=${CEILING[$1]}
    mpi_env "$2"
    shift 2
    while [[ $1 != -- ]]; do ENV+=("$1") && shift; done
    shift
    local seconds skips=()
    seconds=$(limit "$most")
    if ((seconds < most / 2)); then
        verdict "$name" 1 "not run: $(left) s of the $BUDGET s left, its ceiling $most s"
        return
    fi
    ((dry_run)) && skips=(--skipped-because "$STANDIN_SKIP")
    echo "===== $name: ${ENV[*]} ($seconds s at most) ====="
    local started=$SECONDS said rc status
    # --capture=no: what a rank writes from C or Rust (Intel MPI's debug lines, the
    # JAXMPI_TIMEOUT report, a crash's last words) reaches its log before a kill or abort.
    env "${ENV[@]}" JAXMPI_TEST_JUNITDIR="$RESULTS/junit-$name" \
        JAXMPI_TEST_LOGDIR="$RESULTS/logs-$name" \
        JAXMPI_TEST_TIMEOUT=$((seconds - PYTEST_KILL_GRACE)) \
        "$ROOT/tests/run_pytest_mpi.sh" "${LAUNCH[@]}" -- -q -rs --capture=no "$@"
    status=$?
    said=$(python "$ROOT/ci/gpu_verdict.py" junit "$RESULTS/junit-$name" "$RANKS" \
        "$(expected "$name")" "${skips[@]}" --exit "$status" --rc-dir "$RESULTS/logs-$name")
    rc=$?
    said=${said//PASS: /}
    said=${said//FAIL: /}
    verdict "$name" "$rc" "${said//$'\n'/; } ($((SECONDS - started)) s)"
    archive >/dev/null
}

tests() {
    # A stuck call reports itself (and ends the job) before the step's end, and no op here
    # waits that long for its partner: the longest wait is a partner's first compile of a
    # matmul, XLA's GEMM autotune (5-20 s).
    local main=(JAXMPI_TIMEOUT=40 -- -k "not $ERROR_TEST" "${TEST_FILES[@]}")
    local error=(JAXMPI_TIMEOUT=15 -- -k "$ERROR_TEST" "${TEST_FILES[0]}")
    run_tests staged staged "${main[@]}"
    run_tests staged-fast staged JAXMPI_DISPATCH=fast JAXMPI_TIMEOUT=20 -- "${TEST_FILES[1]}"
    run_tests staged-error staged "${error[@]}"
    choose_impi_ipc
    run_tests direct direct "${main[@]}"
    run_tests direct-error direct "${error[@]}"
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
    local log=$RESULTS/mpi4jax-build.log nvcc
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
            2>&1 | tee "$RESULTS/bench-$mode.md"
        rc=${PIPESTATUS[0]}
        case $rc in
        0) info "bench-$mode" "table in bench-$mode.md" ;;
        3) info "bench-$mode" "no GPU: nothing measured" ;;
        *) info "bench-$mode" "exit status $rc, a diagnostic: no failure (see bench-$mode.md)" ;;
        esac
        archive >/dev/null
    done
}

main() {
    : >"$VERDICTS"
    rm -rf "$RESULTS"
    ((dry_run)) && say "DRY RUN: the CPU stands in for the GPU"
    verdict budget "$(plan >/dev/null && echo 0 || echo 1)" "step ceilings $(plan | tail -n 1 | sed 's/^ *total *//')"
    prepare || { verdict prepare 1 "could not install from $PACK" && return 1; }
    mkdir -p "$RESULTS"
    which_jax
    collect &
    local collecting=$!
    probes
    wait "$collecting"
    collected
    archive >/dev/null
    tests
    bench
    echo "===== verdicts ($VERDICTS) after $SECONDS s of $BUDGET ====="
    cat "$VERDICTS"
    ! grep -q '^FAIL' "$VERDICTS"
}

# On every way out, a signal included: the last archive, and whether all of OUT comes back.
finish() {
    local status=$? said packed
    trap - EXIT
    said=$(archive 2>&1)
    packed=$?
    ((packed == 0 || status != 0)) || status=1
    {
        ((status <= 128)) || verdict cut-short 1 "signal $((status - 128)) after $SECONDS s"
        verdict returned-files "$packed" "$(sed 's/^\(PASS\|FAIL\): //' <<<"$said" | paste -sd ';')"
        echo "gpu_run: $( ((status == 0)) && echo PASSED || echo FAILED) in $SECONDS s"
    } | tee -a "$OUT/run.log"
    exit "$status"
}
trap finish EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

main 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
