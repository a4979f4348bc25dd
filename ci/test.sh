#!/usr/bin/env bash
# ci/test.sh -- the project's one test command (CI runs it through .ci/run).
#
# Works on a fresh clone on a fresh machine: it runs ci/setup.sh first
# (apt packages, one venv per MPI wheel, the trixie chroot for Python 3.13 and its
# venvs for JAX 0.11/0.12, cargo build, the x86_64 release wheel every venv installs), then
#   fmt, clippy, cargo test, ruff, the aarch64 wheel and the sdist (ci/wheels.sh), the
#   readelf check of the artifacts, the wheels' tags (auditwheel) and sizes,
#   the probe on every MPI build of ci/matrix.sh at 1, 2 and 3 ranks,
#   the selection-error cases, the linked backend's ABI oracle (Debian Open MPI
#   and MPICH), the Python suite (tests/python) on the default MPI at 1 rank, on
#   every build of the matrix at 2 (every MPI, JAX 0.6.2, 0.11 and 0.12) and on a
#   linked build, its rank-dependent part at 3 and 4 ranks, messages over 2^31
#   elements, the reliability checks (job-ending errors, rank death, soak), and the
#   documentation (ci/docs.sh: the site built, its links, its examples, screenshots),
# and prints a summary table, a time table (wall seconds per step and cell; the whole
# run must stay under 45 minutes on an idle 2-core machine, CI allows 90) and a line
# "N passed, N failed[, N skipped]".
# Every item runs even if an earlier one failed; the exit status is non-zero
# if any item failed. Logs: .ci-out/ (one file per item).
#
# Knobs (environment): JAXMPI_PROBE, JAXMPI_CELL_TIMEOUT, JAXMPI_MATRIX_ONLY
# (see ci/matrix.sh), JAXMPI_SKIP_BUILD (see ci/setup.sh),
# JAXMPI_MATRIX_BUDGET=3000 (seconds for the whole matrix; cells left when it
# is used up fail without running), JAXMPI_PYTEST_TIMEOUT=600 (per Python cell).

# No `set -e`: a failing step must not stop the run; each step's status is
# collected instead.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/.ci-out"
cd "$ROOT" || exit 1
# rustup's cargo/clippy/rustfmt live here; a non-login CI shell may lack it.
[[ -d $HOME/.cargo/bin ]] && PATH="$HOME/.cargo/bin:$PATH"
# Start from an empty log folder so no stale log is mistaken for this run's.
rm -rf "$OUT"
mkdir -p "$OUT/matrix"

# ---------------------------------------------------------------------------
# Result bookkeeping: one row per item (step or matrix cell).
# ---------------------------------------------------------------------------
ROWS=()  # "name|version|family|ranks|result|note" (result: pass, FAIL, skip)
TIMES=() # "group|seconds|name|ranks", one per row, for the time table
GROUP=setup # the time table's group of the steps recorded next
N_PASS=0 N_FAIL=0 N_SKIP=0

record() { # record NAME VERSION FAMILY RANKS RESULT NOTE SECONDS
    local f=("$@")
    f=("${f[@]//|//}") # "|" separates the fields of a row
    ROWS+=("${f[0]}|${f[1]}|${f[2]}|${f[3]}|${f[4]}|${f[5]}")
    TIMES+=("$GROUP|${f[6]}|${f[0]}|${f[3]}")
    case $5 in
    pass) N_PASS=$((N_PASS + 1)) ;;
    skip) N_SKIP=$((N_SKIP + 1)) ;;
    *) N_FAIL=$((N_FAIL + 1)) ;;
    esac
}

banner() { printf '\n===== %s =====\n' "$*"; }

# step NAME LOGNAME CMD...: run CMD with its output both on the console
# (CI shows progress) and in .ci-out/LOGNAME.log; record pass/FAIL.
step() {
    local name=$1 log="$OUT/$2.log" t0=$SECONDS rc
    shift 2
    banner "$name"
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    if ((rc == 0)); then
        record "$name" - - - pass "$((SECONDS - t0))s" "$((SECONDS - t0))"
    else
        record "$name" - - - FAIL "exit status $rc, log .ci-out/${log##*/}" "$((SECONDS - t0))"
    fi
    printf -- '----- %s: %s (%ss)\n' "$name" "$([[ $rc == 0 ]] && echo pass || echo "FAIL (exit $rc)")" "$((SECONDS - t0))"
}

# ---------------------------------------------------------------------------
# The steps.
# ---------------------------------------------------------------------------

# readelf check: jaxmpi must load MPI (and CUDA) only at run time via dlopen,
# so no artifact may have a DT_NEEDED entry on them; otherwise it would only
# start where that exact soname is installed. Nor on libpython: the abi3 extension
# takes its symbols from the interpreter that loads it, whatever its version. Checked:
# every ELF file directly in target/release (the probe, any cdylib *.so) and the
# extension module as shipped, unpacked from each wheel in dist/ (ci/wheels.sh).
check_needed() {
    local f n=0 bad=0 needed
    local -a files=()
    local unpacked="$OUT/wheel"
    rm -rf "$unpacked" && mkdir -p "$unpacked"
    for f in "$ROOT"/dist/*.whl; do
        [[ -e $f ]] && "$ROOT/.venvs/mpich/bin/python" -m zipfile -e "$f" "$unpacked/$(basename "$f")"
    done
    while IFS= read -r -d '' f; do
        # Only ELF files (target/release also holds *.d dep-info files).
        [[ $(head -c 4 "$f" | od -An -c | tr -d ' ') == '177ELF' ]] && files+=("$f")
    done < <(
        find "$ROOT/target/release" -maxdepth 1 -type f \( -perm -u+x -o -name '*.so' \) -print0 2>/dev/null
        find "$unpacked" -type f -name '*.so' -print0
    )
    if ((${#files[@]} == 0)); then
        echo "no ELF artifacts found under target/release (did the build fail?)"
        return 1
    fi
    for f in "${files[@]}"; do
        n=$((n + 1))
        needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | tr '\n' ' ')
        # libmpi* also covers libmpi_abi; libcuda* also covers libcudart.
        if grep -qE '(^| )lib(mpi|mpich|cuda|cudart|python)[^ ]*' <<<"$needed"; then
            echo "BAD  ${f#"$ROOT"/}: NEEDED $needed"
            bad=$((bad + 1))
        else
            echo "ok   ${f#"$ROOT"/}: NEEDED $needed"
        fi
    done
    echo "$n artifact(s) checked, $bad linked against MPI/CUDA/Python"
    ((bad == 0))
}

# A wheel (zipped) above this many bytes fails check_wheels. Today's are ~0.5 MB (a
# ~1.2 MB extension); a build that kept its debug info (the release profile's debug = 1,
# an extension of ~15 MB) packs to ~3.3 MB (measured). The bound leaves room to grow.
WHEEL_MAX_BYTES=$((2 * 1024 * 1024))

# The wheels of dist/ (ci/wheels.sh), one for x86_64 and one for aarch64, and the sdist.
# Each wheel: named abi3 for CPython >= 3.10; the manylinux tags in its name (legacy
# aliases such as manylinux2014 = manylinux_2_17 included) all name the glibc that
# `auditwheel show` finds it needs, given its versioned symbols and the libraries it
# links (a library outside the manylinux policy makes that "linux_<arch>": fails). A
# lower claim would let pip install it where it cannot load, a higher one refuse
# machines it runs on. Its size printed, and below WHEEL_MAX_BYTES.
check_wheels() {
    local f arch name plat tag possible size bad=0 n
    for arch in x86_64 aarch64; do
        n=$(compgen -G "$ROOT/dist/jaxmpi-*_$arch.whl" | wc -l)
        ((n == 1)) || { echo "BAD  dist/ holds $n $arch wheels, not 1"; bad=$((bad + 1)); }
    done
    compgen -G "$ROOT/dist/jaxmpi-*.tar.gz" >/dev/null || { echo "BAD  no sdist in dist/"; bad=$((bad + 1)); }
    for f in "$ROOT"/dist/*.whl; do
        [[ -e $f ]] || continue
        name=$(basename "$f")
        "$ROOT/.venvs/wheels/bin/auditwheel" show "$f" | tee "$OUT/auditwheel-$name.txt" || {
            echo "BAD  $name: auditwheel show failed"
            bad=$((bad + 1))
            continue
        }
        possible=$(tr -s ' \n' ' ' <"$OUT/auditwheel-$name.txt" |
            sed -n 's/.*consistent with the following platform tag: "\([^"]*\)".*/\1/p')
        if [[ $name != jaxmpi-*-cp310-abi3-*.whl ]]; then
            echo "BAD  $name: not tagged cp310-abi3"
            bad=$((bad + 1))
        fi
        plat=${name%.whl}
        for tag in $(tr . ' ' <<<"${plat##*-}"); do
            tag=$(sed -e 's/^manylinux2014_/manylinux_2_17_/' -e 's/^manylinux2010_/manylinux_2_12_/' \
                -e 's/^manylinux1_/manylinux_2_5_/' <<<"$tag")
            if [[ $tag != "$possible" ]]; then
                echo "BAD  $name: claims $tag, auditwheel says it can have ${possible:-nothing}"
                bad=$((bad + 1))
            fi
        done
        size=$(stat -c %s "$f")
        echo "$name: auditwheel's tag ${possible:-none}, $size bytes (bound $WHEEL_MAX_BYTES)"
        if ((size > WHEEL_MAX_BYTES)); then
            echo "BAD  $name: $size bytes, above the bound"
            bad=$((bad + 1))
        fi
    done
    echo "$bad problem(s)"
    ((bad == 0))
}

# The plug-in jaxlib loads for JAX's own collectives (backends/src/xla_collectives): every
# name each jaxlib of the matrix resolves is in the generated contract, with the values it
# was generated with, and the extension module the wheel installed exports all of them.
check_xla_contract() {
    local venv jaxlib module bad=0
    module=$(echo "$ROOT"/.venvs/mpich/lib/python3.*/site-packages/jaxmpi/_native.abi3.so)
    for venv in mpich jax-oldest py3.13-jax-0.11 py3.13-jax-0.12; do
        jaxlib=$(echo "$ROOT/.venvs/$venv"/lib/python3.*/site-packages/jaxlib)
        python3 "$ROOT/ci/xla_collectives_contract.py" --jaxlib "$jaxlib" --check \
            --abi-header "$ROOT/.venvs/mpich/include/mpi_abi.h" --exports "$module" || bad=$((bad + 1))
    done
    ((bad == 0))
}

# Every script a user is told to run works from a fresh clone as written (./ci/wheels.sh):
# the shell scripts of ci/, tests/ and benches/, and any such script README.md or another
# Markdown file names, are tracked with their run bit (mode 100755; set it with
# `git update-index --chmod=+x`). A named script git does not track fails too.
check_run_bits() {
    local path mode bad=0 n=0
    local -a docs
    mapfile -t docs < <(git -C "$ROOT" ls-files '*.md')
    while IFS= read -r path; do
        n=$((n + 1))
        mode=$(git -C "$ROOT" ls-files -s -- "$path" | cut -d' ' -f1)
        if [[ -z $mode ]]; then
            echo "BAD  $path: named in the docs but not in git"
            bad=$((bad + 1))
        elif [[ $mode != 100755 ]]; then
            echo "BAD  $path: mode $mode in git, not 100755: git update-index --chmod=+x $path"
            bad=$((bad + 1))
        fi
    done < <(
        {
            git -C "$ROOT" ls-files 'ci/*.sh' 'tests/*.sh' 'benches/*.sh'
            (cd "$ROOT" && grep -ohE '(\./)?(ci|tests|benches)/[A-Za-z0-9_./-]+\.sh' "${docs[@]}")
        } | sed 's|^\./||' | sort -u
    )
    echo "$n script(s) checked, $bad without their run bit in git"
    ((bad == 0))
}

cargo_test() {
    # Unit tests that need a real MPI library find it through these.
    JAXMPI_TEST_LIBS_MPICH="$ROOT/.venvs/mpich/lib/libmpi.so.12" \
        JAXMPI_TEST_LIBS_OPENMPI="$ROOT/.venvs/openmpi/lib/libmpi.so.40" \
        JAXMPI_TEST_LIBS_MPIABI="$ROOT/.venvs/mpich/lib/libmpi_abi.so.1" \
        cargo test --workspace --release
}

T_START=$SECONDS
step "setup" setup bash "$ROOT/ci/setup.sh"
GROUP=checks
step "cargo fmt" fmt cargo fmt --all -- --check
step "cargo clippy" clippy cargo clippy --workspace --all-targets -- -D warnings
step "cargo test" cargo-test cargo_test
step "ruff" ruff "$ROOT/.venvs/mpich/bin/ruff" check "$ROOT/python" "$ROOT/tests" "$ROOT/examples" "$ROOT/benches"
# py.typed ships: the public API's annotations are checked (config: python/pyproject.toml).
step "mypy" mypy bash -c 'cd "$1/python" && "$1/.venvs/mpich/bin/mypy" --python-executable "$1/.venvs/mpich/bin/python"' _ "$ROOT"
# python/jaxmpi imports one way, from the public API down to the runtime, without a cycle
# (the layers are declared in the script; it reads the sources with ast, under 1 s).
step "python: import layers" import-layers python3 "$ROOT/ci/import_layers.py"
step "scripts: run bits in git" run-bits check_run_bits
# The GPU run's scripts (ci/gpu_run.sh runs only on a GPU machine): syntax, offline
# installs, and the verdict logic on canned reports.
step "GPU scripts (no GPU: syntax, offline, verdict logic)" gpu-check bash "$ROOT/ci/gpu_check.sh"
# setup built the x86_64 wheel (the tests install it); the aarch64 one and the sdist.
step "wheels: aarch64 and sdist" wheels bash "$ROOT/ci/wheels.sh"
step "readelf: no DT_NEEDED on MPI/CUDA/Python" readelf check_needed
# One wheel per architecture for every Python >= 3.10 and glibc >= 2.17.
step "wheels: abi3, manylinux tag, size" wheel-check check_wheels
step "XLA plug-in: the names of jaxlib 0.6.2 to 0.12 exported" xla-contract check_xla_contract

# ---------------------------------------------------------------------------
# The MPI matrix: the probe on every build at 1, 2 and 3 ranks, then the Python
# suite on the default build at 1-4 ranks and on every other build at 2.
# ---------------------------------------------------------------------------
# shellcheck source=matrix.sh source-path=SCRIPTDIR
source "$ROOT/ci/matrix.sh"
# Each cell is capped by its own timeout, but many hanging cells would still
# add up; past this budget the remaining cells fail unrun.
MATRIX_BUDGET=${JAXMPI_MATRIX_BUDGET:-3000}
MATRIX_T0=$SECONDS

# matrix_cells KIND RUNNER CELL...: run each "BUILD N" cell with RUNNER
# (run_cell or run_pytest_cell) and record it.
matrix_cells() {
    local kind=$1 runner=$2 cell build n log t0 result note
    shift 2
    for cell in "$@"; do
        read -r build n <<<"$cell"
        log="$OUT/matrix/$kind-$build-n$n.log"
        t0=$SECONDS
        if ((SECONDS - MATRIX_T0 > MATRIX_BUDGET)); then
            CELL_RESULT=fail CELL_VERSION="" CELL_FAMILY=""
            CELL_NOTE="not run: matrix time budget (${MATRIX_BUDGET}s) used up"
            echo "$CELL_NOTE" >"$log"
        else
            "$runner" "$build" "$n" "$log"
        fi
        case $CELL_RESULT in
        pass) result=pass ;;
        skip) result=skip ;;
        *) result=FAIL ;;
        esac
        note="$CELL_NOTE"
        [[ $result == FAIL ]] && note="$note; log .ci-out/matrix/${log##*/}"
        [[ $result == pass ]] && note="${note:+$note, }$((SECONDS - t0))s"
        GROUP=$kind record "$kind $build" "${CELL_VERSION:--}" "${CELL_FAMILY:-${JAXMPI_MATRIX_FAMILY[$build]}}" "$n" "$result" "$note" "$((SECONDS - t0))"
        printf '%-28s n=%s  %s  %s\n' "$kind $build" "$n" "$result" "$note"
        # Enough of the log to diagnose without opening the file.
        [[ $result == FAIL ]] && sed 's/^/    | /' < <(tail -n 40 "$log")
    done
}

banner "MPI matrix: probe $(matrix_probe)"
probe_cells=()
for build in "${JAXMPI_MATRIX_BUILDS[@]}"; do
    [[ " ${JAXMPI_MATRIX_PYTHON_ONLY[*]} " == *" $build "* ]] && continue
    for n in "${JAXMPI_MATRIX_RANKS[@]}"; do probe_cells+=("$build $n"); done
done
matrix_cells probe run_cell "${probe_cells[@]}"

GROUP=checks
step "selection errors" selection-errors "$ROOT/tests/selection_errors.sh" "$(matrix_probe)"
# The linked backend (mpi-sys, bindings from each MPI's own mpi.h) against jaxmpi's own
# ABI tables, on Debian's Open MPI and MPICH.
step "linked oracle (Debian Open MPI + MPICH)" oracle bash "$ROOT/ci/oracle.sh"

banner "MPI matrix: Python suite"
# At 2 ranks on every build: the whole suite where something enters every test (the first
# build, also at 1 rank; the other family; the oldest and newest JAX), and the part an MPI
# or a JAX version can change elsewhere (ci/matrix.sh says which, and why; ~45-60% of the
# time of a whole cell: the 2-rank suite on 10 builds was half of CI's time on a slow host).
mpi_part_cell() { PYTEST_TARGETS=$JAXMPI_MPI_PART_FILES PYTEST_K=$JAXMPI_MPI_PART_K run_pytest_cell "$@"; }
jax_part_cell() { PYTEST_K=$JAXMPI_JAX_PART_K run_pytest_cell "$@"; }
whole_suite_cell() {
    if [[ " ${JAXMPI_MATRIX_WHOLE_SUITE[*]} " == *" $1 "* ]]; then
        run_pytest_cell "$@"
    elif [[ " ${JAXMPI_MATRIX_PYTHON_ONLY[*]} " == *" $1 "* ]]; then
        jax_part_cell "$@" # a JAX release over the first build's MPI
    else
        mpi_part_cell "$@"
    fi
}
pytest_cells=("${JAXMPI_MATRIX_BUILDS[0]} 1")
for build in "${JAXMPI_MATRIX_BUILDS[@]}"; do pytest_cells+=("$build 2"); done
matrix_cells pytest whole_suite_cell "${pytest_cells[@]}"

# At 3 and 4 ranks (odd, and more ranks than cores), only what the number of ranks can
# change: results that depend on it (roots other than 0 and the last, prefix reductions,
# alltoall blocks, uneven counts, pairs with one rank left over, communicator splits,
# the decomposed model, random sequences of ops, control flow, derivatives and vmap
# across ranks, node-local ranks, non-blocking pairs with one rank left over). Left out there, because the number of ranks does not
# enter them and 1 and 2 ranks on every build already run them: the dtype tables
# (test_dtypes: how each dtype and op maps to MPI), errors raised while tracing
# (test_errors) and MPI's own failures (test_mpi_errors: between pairs of ranks), the
# compiled HLO (test_zero_copy), processes started alone (test_startup, test_support),
# the README's examples, threads on their own communicators, the native module and CUDA;
# and, in the files kept, 9 of the 15 dtypes (kept: bool, int32, int64,
# float16 -- jaxmpi's own reduction --, float64, complex128: every size, kind, own op).
# That is ~640 of the ~1,760 tests at 4 ranks.
RANK_DEPENDENT_FILES="tests/python/test_collectives.py tests/python/test_varcount.py
    tests/python/test_p2p.py tests/python/test_comms.py tests/python/test_randomized.py
    tests/python/test_shallow_water.py tests/python/test_control_flow.py
    tests/python/test_autodiff.py tests/python/test_vmap.py tests/python/test_node_local.py
    tests/python/test_checked.py tests/python/test_ragged.py tests/python/test_nonblocking.py"
RANK_DEPENDENT_K="not int8 and not int16 and not uint32 and not uint64 and not bfloat16 and not float32 and not complex64"
rank_dependent_cell() { PYTEST_TARGETS=$RANK_DEPENDENT_FILES PYTEST_K=$RANK_DEPENDENT_K run_pytest_cell "$@"; }
matrix_cells pytest-ranks rank_dependent_cell "${JAXMPI_MATRIX_BUILDS[0]} 3" "${JAXMPI_MATRIX_BUILDS[0]} 4"

# Inside JAX's sharded programs (jax.distributed over loopback, ops inside shard_map) and
# JAX's own collectives over MPI (test_xla_collectives.py: every collective XLA sends to
# MPI, a 2 x 2 mesh at 4 ranks): jax.distributed must start before any JAX computation, so
# the two files run in a pytest process of their own, at 2 ranks on every build (8-18 s a
# cell, most of it the processes' start), and at 4 ranks on the first, where a mesh can
# leave out ranks of a communicator or cut one in two; there without the two tests that
# start processes of their own on rank 0 (the number of ranks does not enter them; ~12 s
# of the cell's ~30 s).
sharded_cell() {
    PYTEST_TARGETS="tests/python/test_sharded.py tests/python/test_xla_collectives.py" \
        run_pytest_cell "$@" JAXMPI_TEST_SHARDED=1
}
sharded_ranks_cell() { PYTEST_K="not several_local_devices and not process_count_that_differs" sharded_cell "$@"; }
sharded_cells=()
for build in "${JAXMPI_MATRIX_BUILDS[@]}"; do sharded_cells+=("$build 2"); done
matrix_cells sharded sharded_cell "${sharded_cells[@]}"
matrix_cells sharded sharded_ranks_cell "${JAXMPI_MATRIX_BUILDS[0]} 4"

# Non-blocking transfers through the progress thread. The suite's cells leave the choice
# to jaxmpi, which on CI's 2 cores at 2 ranks is no thread (waits block in MPI_Wait; see
# README's Non-blocking): here the thread is forced, on every build, at 2 ranks and at 3
# (~6-12 s a cell).
agent_cell() { PYTEST_TARGETS=tests/python/test_nonblocking.py run_pytest_cell "$@" JAXMPI_PROGRESS=thread; }
matrix_cells nonblocking-agent agent_cell "${sharded_cells[@]}" "${JAXMPI_MATRIX_BUILDS[0]} 3"

# Across 2 simulated hosts (ci/hosts.sh; needs root): the ops on both PyPI wheels, node-local
# ranks at 2 x 2, then settings the ranks disagree on, a lost host and a cut link.
GROUP=multihost
# shellcheck source=multihost.sh source-path=SCRIPTDIR
source "$ROOT/ci/multihost.sh"
multihost_cells
step "across hosts: settings, lost host, cut link" multihost-faults "$ROOT/tests/multihost_faults.sh"

# Under Slurm (ci/slurm.sh: 2 nodes on the simulated hosts; needs root): srun, sbatch and
# salloc + mpiexec/mpirun on both PyPI wheels, the wrong --mpi, --export, then scancel,
# --time and a node lost. 2m15s-2m20s on 2 cores shared with another job's tests, most of
# it JAX starting in each rank and Slurm noticing the lost node (~30 s); the --time case's
# 95 s run beside the others.
GROUP=slurm
step "under Slurm: srun, sbatch, salloc; wrong --mpi; scancel, --time, node lost" slurm \
    "$ROOT/tests/slurm_jobs.sh"

# Messages over 2^31-1 elements, once through MPI-4 large counts (MPICH 5) and once
# through derived datatypes and segmented reductions (Open MPI 4.1 has no _c functions).
# About 6 GiB per rank, so one cell at a time, on 2 ranks.
large_cell() { PYTEST_TARGETS=tests/python/test_large.py run_pytest_cell "$@" JAXMPI_TEST_LARGE=1; }
matrix_cells large large_cell "pypi-mpich-5 2" "debian-openmpi-4.1 2"

GROUP=linked
step "Python suite, linked build on Debian MPICH" linked-python bash "$ROOT/ci/linked_python.sh"
# The documentation (ci/docs.sh): the site built with -W, its internal links and anchors,
# every example under mpirun -n 2 with its output compared (one job per environment, not
# one per block), three pages rendered by headless chromium: 24-29 s once .venvs/docs and
# chromium are installed (measured on the shared 2-core VM); the first run on a machine
# installs them, about 2-3 minutes more.
GROUP=docs
step "docs: build -W, links, examples under mpirun, screenshots" docs bash "$ROOT/ci/docs.sh"
# JAX's collectives over MPI, a job per check: import and initialization orders on every
# family (the usual order on every build), exit status, JAXMPI_DEBUG's lines, a stuck
# collective under JAXMPI_TIMEOUT, the refusals, a program without MPI collectives.
GROUP=xla-collectives
step "JAX's collectives over MPI: orders, exit, debug, timeout, refusals" xla-jobs \
    "$ROOT/tests/xla_collectives_jobs.sh"
# The startup hook where jax lives in a site directory processed after jaxmpi's: jaxmpi in
# the user site, a --system-site-packages venv, a layering .pth file (~10 s).
step "JAX's collectives over MPI: jaxmpi and jax in different site directories" startup-layouts \
    "$ROOT/tests/startup_layouts.sh"
GROUP=reliability
# Failures that end a job: a receive that never matches under JAXMPI_TIMEOUT, concurrent
# calls below MPI_THREAD_MULTIPLE, JAXMPI_DEBUG's lines, bad values of the env vars.
step "reliability: errors, timeout, debug" reliability-errors "$ROOT/tests/reliability_errors.sh"
# A rank killed mid-job: every build at 2 and 3 ranks must end the job, with a diagnostic.
step "reliability: rank death" rank-death "$ROOT/tests/rank_death.sh"
# Memory stays flat over many calls (the full-size soak is benches/soak.py).
step "reliability: soak (lite)" soak "$ROOT/ci/soak.sh"
# Dispatch: exit with jitted sends and receives still in flight on every build (both
# modes), and tests/python/test_dispatch.py under JAXMPI_DISPATCH=ordered.
step "dispatch modes" dispatch-modes "$ROOT/tests/dispatch_modes.sh"

# ---------------------------------------------------------------------------
# Summary.
# ---------------------------------------------------------------------------

# Wall seconds per group (in run order), each group's items slowest first, setup's own
# parts from its log, and the total: where the time goes, to keep the run under its
# budget (45 minutes on an idle 2-core machine; CI allows 90).
time_table() {
    local -a groups=()
    local -A sum=()
    local row group secs name ranks
    for row in "${TIMES[@]}"; do
        IFS='|' read -r group secs _ <<<"$row"
        [[ -v sum[$group] ]] || groups+=("$group")
        sum[$group]=$((${sum[$group]:-0} + secs))
    done
    banner "time table (wall seconds)"
    for group in "${groups[@]}"; do
        printf '%6ss  %s\n' "${sum[$group]}" "$group"
        for row in "${TIMES[@]}"; do
            IFS='|' read -r _ secs name ranks <<<"$row"
            [[ $row == "$group|"* ]] && printf '%s|%s|%s\n' "$secs" "$name" "$ranks"
        done | sort -t'|' -k1,1nr | while IFS='|' read -r secs name ranks; do
            printf '%6ss      %s%s\n' "$secs" "$name" "$([[ $ranks != - ]] && echo " (n=$ranks)")"
        done
        if [[ $group == setup && -f $OUT/setup.log ]]; then
            sed -n '/^setup: all done/d; s/^setup: \(.*\) done (\([0-9]*\)s)$/\2|\1/p' "$OUT/setup.log" |
                while IFS='|' read -r secs name; do printf '%6ss          %s\n' "$secs" "$name"; done
        fi
    done
    printf '%6ss  total (wall, %s min)\n' "$((SECONDS - T_START))" "$(((SECONDS - T_START + 30) / 60))"
}
banner "summary ($((SECONDS - T_START))s)"
fmt='%-36s %-44s %-8s %-5s %-6s %s\n'
# shellcheck disable=SC2059  # the format is ours
printf "$fmt" "MPI build / step" "version" "family" "ranks" "result" "notes"
for row in "${ROWS[@]}"; do
    IFS='|' read -r name version family ranks result note <<<"$row"
    # Library version strings carry tabs/newlines and build details: keep the
    # first 44 characters with whitespace squeezed.
    version=$(tr -s '[:space:]' ' ' <<<"$version" | sed 's/ *$//')
    ((${#version} > 44)) && version="${version:0:43}~"
    # shellcheck disable=SC2059
    printf "$fmt" "$name" "$version" "$family" "$ranks" "$result" "$note"
done
time_table
summary="$N_PASS passed, $N_FAIL failed"
((N_SKIP > 0)) && summary+=", $N_SKIP skipped"
echo "$summary"
((N_FAIL == 0))
