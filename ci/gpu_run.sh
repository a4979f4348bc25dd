#!/usr/bin/env bash
# ci/gpu_run.sh -- the GPU run, on the GPU test machine, from this tree and .gpu/ alone.
#
# usage: ci/gpu_run.sh [--dry-run] tests|bench
#   tests  the CUDA tests at 2 ranks sharing the GPU: staged (PyPI's MPICH, not CUDA-aware)
#          and direct (Intel MPI with I_MPI_OFFLOAD=1), each with the default dispatch and
#          with JAXMPI_DISPATCH=fast (the order stress test), plus test_dispatch.py on the
#          GPU under fast; checks that `python -m jaxmpi info` reports the mode each leg
#          asked for; counts the CUDA driver symbols jaxmpi calls in libcuda.
#   bench  benches/bench_cuda.py, staged and direct, with mpi4jax's columns where mpi4jax
#          builds there (from its sdist, with the packed MPICH's mpicc).
# Each stays under 10 minutes: every leg gets at most the time left of a 560 s budget.
#
# Needs: .gpu/ from ci/gpu_pack.sh; a python3 with jax (+ its CUDA plugin), numpy and pytest
# (JAXMPI_GPU_PYTHON picks another). No network, no Rust: installs only the packed files,
# with pip --no-index --prefix into .gpu-work/ (--target would drop the MPI wheel's lib/).
# Output, for reading back: $OUT (default .gpu-out/): <command>.log (all of it),
# verdicts-<command>.txt, junit-*/rank<N>.xml, info-*.txt, bench-*.md, nvidia-smi.txt,
# cuda-symbols.txt, mpi4jax-build.log.
# Exit status 0 only if every check passed: a CUDA test that skipped is a failure here.
#
# --dry-run (on a machine without GPU, to test this script): the host's Python and its
# mpi4py wheel (.gpu-cache/dry-run/) stand in for the cp312 ones, JAX_PLATFORMS=cpu, and
# Intel MPI runs without I_MPI_OFFLOAD (MPI_Init crashes with it where there is no GPU).
# The CUDA tests then skip and the bench measures nothing, so the run must end in FAIL.
#
# Environment: JAXMPI_GPU_PYTHON; JAXMPI_GPU_AWARE (JAXMPI_CUDA_AWARE of the direct legs,
# default auto: Intel MPI's own answer must make it direct).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK=$ROOT/.gpu
WORK=$ROOT/.gpu-work
OUT=${OUT:-$ROOT/.gpu-out}
DEADLINE=$((SECONDS + 560))

dry_run=0
[[ ${1-} == --dry-run ]] && dry_run=1 && shift
command=${1-}
[[ $command == tests || $command == bench ]] || {
    sed -n '3,4p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
mkdir -p "$OUT"

verdict() { # NAME STATUS DETAIL: one line of verdicts-$command.txt
    printf '%s %s: %s\n' "$( (($2 == 0)) && echo PASS || echo FAIL)" "$1" "$3" |
        tee -a "$OUT/verdicts-$command.txt"
}

time_left() { # seconds a leg may take, at most $1, at least 1 (`timeout 0` is no limit)
    local left=$((DEADLINE - SECONDS))
    ((left > $1)) && left=$1
    echo $((left < 1 ? 1 : left))
}

# --- Install the packed files (once per pack: a stamp holds its manifest) ---------------
say() { echo "gpu_run: $*"; }

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
    if ((dry_run)); then export JAX_PLATFORMS=cpu; else export JAX_PLATFORMS=cuda,cpu; fi
    local versions='import sys, jax; print(sys.version.split()[0], "jax", jax.__version__)'
    say "python $("$PY" -c "$versions"), JAX_PLATFORMS=$JAX_PLATFORMS, prefix $WORK/py"
}

# mpi_env staged|direct: the launcher and environment of one MPI, into LAUNCH and ENV.
mpi_env() {
    if [[ $1 == staged ]]; then
        LAUNCH=("$MPICH_BIN/mpiexec" -n 2)
        ENV=(JAXMPI_MPI="$MPICH_LIB" MPI4PY_LIBMPI="$MPICH_LIB" JAXMPI_CUDA_AWARE=0)
    else
        local lib=$WORK/impi/lib/libmpi.so.12
        LAUNCH=("$WORK/impi/bin/mpiexec" -n 2)
        # shm: one node needs no libfabric (not packed); offload: Intel MPI's CUDA backend.
        ENV=(JAXMPI_MPI="$lib" MPI4PY_LIBMPI="$lib" I_MPI_FABRICS=shm
            JAXMPI_CUDA_AWARE="${JAXMPI_GPU_AWARE:-auto}")
        ((dry_run)) || ENV+=(I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda)
    fi
}

check_mode() { # staged|direct
    mpi_env "$1"
    local file=$OUT/info-$1.txt
    env "${ENV[@]}" timeout "$(time_left 60)" "${LAUNCH[@]}" python -m jaxmpi info >"$file" 2>&1
    cat "$file"
    local line
    line=$(python "$ROOT/ci/gpu_verdict.py" mode "$file" 2 "$1")
    verdict "info-$1" $? "${line#*: }"
}

# run_tests NAME staged|direct [--allow-skips] [VAR=VALUE...] -- TEST FILES...
run_tests() {
    local name=$1 allow=()
    mpi_env "$2"
    shift 2
    [[ ${1-} == --allow-skips ]] && allow=(--allow-skips) && shift
    while [[ $1 != -- ]]; do ENV+=("$1") && shift; done
    shift
    local limit
    limit=$(time_left 200)
    if ((limit < 30)); then
        verdict "$name" 1 "not run: the 560 s budget is spent"
        return
    fi
    rm -rf "$OUT/junit-$name"
    echo "===== $name: ${ENV[*]} ====="
    env "${ENV[@]}" JAXMPI_TEST_JUNITDIR="$OUT/junit-$name" JAXMPI_TEST_TIMEOUT="$limit" \
        "$ROOT/tests/run_pytest_mpi.sh" "${LAUNCH[@]}" -- -q -rs "${@/#/$ROOT/}"
    local said rc
    said=$(python "$ROOT/ci/gpu_verdict.py" junit "$OUT/junit-$name" 2 "${allow[@]}")
    rc=$?
    said=${said//PASS: /}
    said=${said//FAIL: /}
    verdict "$name" "$rc" "${said//$'\n'/; }"
}

# What the GPU and driver are, and whether the driver has every symbol jaxmpi calls (cudarc
# looks each up by name at its first call: a missing one fails that op, not the import).
record_machine() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
    else
        echo "nvidia-smi: not found" >"$OUT/nvidia-smi.txt" && false
    fi
    verdict nvidia-smi $? "$(head -n 4 "$OUT/nvidia-smi.txt" | tr -s ' \n' ' ')"
    local names libcuda wanted missing=()
    if ! command -v nm >/dev/null || ! command -v strings >/dev/null; then
        verdict cuda-symbols 1 "binutils (nm, strings) not installed: not counted"
        return
    fi
    names=$(strings -a "$(find "$SITE/jaxmpi" -name '_native*.so' | head -n 1)")
    libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF; exit}')
    mapfile -t wanted < <(grep -rhoE 'sys::cu[A-Za-z0-9_]+' "$ROOT/backends/src" |
        cut -c6- | sort -u)
    {
        echo "jaxmpi calls ${#wanted[@]} driver functions (backends/src): ${wanted[*]}"
        echo "libcuda: ${libcuda:-not found}"
        for sym in "${wanted[@]}"; do
            grep -qx "$sym" <<<"$names" || echo "not named in jaxmpi's module: $sym"
            [[ -n $libcuda ]] && nm -D --defined-only "$libcuda" | grep -qw "$sym" ||
                missing+=("$sym")
        done
        echo "in libcuda: $((${#wanted[@]} - ${#missing[@]})) of ${#wanted[@]}"
    } >"$OUT/cuda-symbols.txt"
    cat "$OUT/cuda-symbols.txt"
    ((${#missing[@]} == 0 && ${#wanted[@]} > 0))
    verdict cuda-symbols $? "$(tail -n 1 "$OUT/cuda-symbols.txt") (missing: ${missing[*]:-none})"
}

tests() {
    record_machine
    check_mode staged
    run_tests staged staged -- tests/python/test_cuda.py tests/python/test_cuda_order.py
    run_tests staged-fast staged JAXMPI_DISPATCH=fast -- tests/python/test_cuda_order.py
    # Its skips (rank-0-only and MPICH-only tests) are by design; its failures are not.
    run_tests dispatch-fast staged --allow-skips JAXMPI_DISPATCH=fast -- \
        tests/python/test_dispatch.py
    check_mode direct
    run_tests direct direct -- tests/python/test_cuda.py tests/python/test_cuda_order.py
    run_tests direct-fast direct JAXMPI_DISPATCH=fast -- tests/python/test_cuda_order.py
}

# mpi4jax from its sdist against the packed MPICH (no build isolation: its build tools are
# packed too). Where it does not build, the benchmark leaves its columns out.
build_mpi4jax() {
    local log=$OUT/mpi4jax-build.log nvcc
    nvcc=$(command -v nvcc) && export CUDA_PATH=${CUDA_PATH:-$(dirname "$(dirname "$nvcc")")}
    local pip=(python -m pip install --no-index --no-deps --ignore-installed)
    if [[ ! -d $WORK/mpi4jax ]] &&
        ! { "${pip[@]}" --prefix "$WORK/tools" --find-links "$PACK" setuptools wheel nanobind &&
            PYTHONPATH="$(find "$WORK/tools" -type d -name '*-packages' | head -n 1):$PYTHONPATH" \
                MPI4JAX_BUILD_MPICC="$MPICH_BIN/mpicc" timeout "$(time_left 240)" \
                "${pip[@]}" --no-build-isolation --prefix "$WORK/mpi4jax" "$PACK"/mpi4jax-*.tar.gz
        } >"$log" 2>&1; then
        rm -rf "$WORK/mpi4jax" # half built: try again next time
    fi
    local site
    site=$(find "$WORK/mpi4jax" -path '*-packages/mpi4jax/__init__.py' 2>/dev/null | head -n 1)
    if [[ -n $site ]]; then
        MPI4JAX_SITE=$(dirname "$(dirname "$site")")
        say "mpi4jax built (${nvcc:+with CUDA from $CUDA_PATH}${nvcc:-no nvcc: CPU only})"
    else
        MPI4JAX_SITE=
        say "mpi4jax did not build (last lines of $log):" && tail -n 5 "$log"
    fi
}

bench() {
    build_mpi4jax
    local mode rc
    for mode in staged direct; do
        mpi_env "$mode"
        if (($(time_left 60) < 60)); then
            verdict "bench-$mode" 1 "not run: the 560 s budget is spent"
            continue
        fi
        echo "===== bench $mode: ${ENV[*]} ====="
        # mpi4jax's CUDA bridge links libcudart without an rpath: nvcc's lib64 (never stubs/).
        env "${ENV[@]}" PYTHONPATH="$PYTHONPATH_PACKED${MPI4JAX_SITE:+:$MPI4JAX_SITE}" \
            LD_LIBRARY_PATH="${CUDA_PATH:+$CUDA_PATH/lib64:}${LD_LIBRARY_PATH-}" \
            timeout "$(time_left 240)" "${LAUNCH[@]}" python "$ROOT/benches/bench_cuda.py" \
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
    : >"$OUT/verdicts-$command.txt"
    ((dry_run)) && echo "gpu_run: DRY RUN (no GPU: the checks below must fail)"
    prepare || { verdict prepare 1 "could not install from $PACK" && return 1; }
    case $command in
    tests) tests ;;
    bench) bench ;;
    esac
    echo "===== verdicts ($OUT/verdicts-$command.txt) ====="
    cat "$OUT/verdicts-$command.txt"
    ! grep -q '^FAIL' "$OUT/verdicts-$command.txt"
}

main 2>&1 | tee "$OUT/$command.log"
status=${PIPESTATUS[0]}
result=$( ((status == 0)) && echo PASSED || echo FAILED)
echo "gpu_run $command: $result" | tee -a "$OUT/$command.log"
exit "$status"
