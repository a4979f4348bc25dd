#!/usr/bin/env bash
# ci/gpu_check.sh -- keeps the GPU run's scripts working where there is no GPU (CI): they
# parse, shellcheck finds no warning (where it is installed), gpu_run.sh neither builds
# Rust, nor installs from an index, nor needs binutils or ldconfig, nor writes a test count
# down (they come from the files); its step ceilings fit its budget with margin
# (`gpu_run.sh --plan`); and gpu_verdict.py, which decides whether a GPU run passed, judges
# canned reports right: a test skipped, failed or missing against the collected count
# fails the run, and so does a rank or a job that did not exit 0 after clean reports (a
# crash or hang at exit); the JAX a run tests is read with its CUDA plugin's version and
# CUDA major, and a plugin JAX cannot load fails; the probe's diagnostics never fail; the
# probe's legacy CUDA IPC answer, which sets up the direct leg, is read right; and a run's
# results, packed, leave at most the 8 files the GPU machine brings back.
# A few seconds. (ci/gpu_run.sh --dry-run runs the whole run on the CPU.)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPTS=("$ROOT/ci/gpu_pack.sh" "$ROOT/ci/gpu_run.sh" "$ROOT/ci/gpu_check.sh")
PYTHONS=("$ROOT/ci/gpu_verdict.py" "$ROOT/ci/gpu_probe.py")
PYTHON=${PYTHON:-python3}
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for script in "${SCRIPTS[@]}"; do
    bash -n "$script" || failed=1
done
"$PYTHON" -m py_compile "${PYTHONS[@]}" || failed=1
if command -v shellcheck >/dev/null; then
    shellcheck -x -S warning "${SCRIPTS[@]}" || failed=1
else
    echo "gpu_check: shellcheck not installed: syntax checked only"
fi

# Offline by construction: the GPU machine has no index and no Rust.
if grep -nE '\b(cargo|maturin|rustc)\b' "$ROOT/ci/gpu_run.sh" ||
    grep -n 'pip install' "$ROOT/ci/gpu_run.sh" | grep -v -- --no-index; then
    echo "gpu_check: FAIL: ci/gpu_run.sh must not build Rust nor install from an index (above)"
    failed=1
fi
# The image may lack binutils, and ldconfig may not list the driver: the probe asks jaxmpi.
if grep -nE '^[^#]*\b(nm|strings|ldconfig|objdump|readelf)\b' "$ROOT/ci/gpu_run.sh"; then
    echo "gpu_check: FAIL: ci/gpu_run.sh must not depend on binutils or ldconfig (above)"
    failed=1
fi

# Counts come from pytest's collection of the test files, never from a number written down.
if grep -nE '^[^#]*_TESTS=[0-9]|^[^#]*\bjunit\b.*[[:space:]][0-9]+[[:space:]]*(\\|$)' "$ROOT/ci/gpu_run.sh"; then
    echo "gpu_check: FAIL: ci/gpu_run.sh writes a test count down (above): expected() derives them"
    failed=1
fi
# Every step's ceiling, with the install and a margin, within the budget.
if ! plan=$(bash "$ROOT/ci/gpu_run.sh" --plan); then
    printf 'gpu_check: FAIL: the step ceilings do not fit the budget:\n%s\n' "$plan"
    failed=1
fi

# The benchmark is a diagnostic: its outcome is never a verdict.
if grep -nE '^[^#]*\bverdict "?bench' "$ROOT/ci/gpu_run.sh"; then
    echo "gpu_check: FAIL: ci/gpu_run.sh fails the run on the benchmark (above): INFO lines only"
    failed=1
fi

# A report as pytest writes it (--junitxml), one rank's; OUTCOMES: p(assed), s(kipped),
# f(ailed), one letter per test.
report() { # DIR RANK OUTCOMES
    local cases="" skipped failures i inner
    for ((i = 0; i < ${#3}; i++)); do
        case ${3:i:1} in
        p) inner="" ;;
        s) inner='<skipped type="pytest.skip" message="no CUDA GPU here">x</skipped>' ;;
        f) inner='<failure message="assert 0">x</failure>' ;;
        esac
        cases+="<testcase classname=\"t\" name=\"t$i\" time=\"0.1\">$inner</testcase>"
    done
    failures=$(tr -cd f <<<"$3" | wc -c)
    skipped=$(tr -cd s <<<"$3" | wc -c)
    mkdir -p "$1"
    {
        echo '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        printf '<testsuite name="pytest" errors="0" failures="%d" skipped="%d" tests="%d">' \
            "$failures" "$skipped" "${#3}"
        echo "$cases</testsuite></testsuites>"
    } >"$1/rank$2.xml"
}

expect() { # WANTED(0 pass, 1 fail) WHAT -- gpu_verdict.py ARGS...
    local wanted=$1 what=$2 said rc
    shift 3
    said=$("$PYTHON" "$ROOT/ci/gpu_verdict.py" "$@" 2>&1)
    rc=$?
    if [[ $rc != "$wanted" ]]; then
        printf 'gpu_check: FAIL: %s: gpu_verdict.py exit %s, wanted %s:\n%s\n' "$what" "$rc" \
            "$wanted" "$said"
        failed=1
    fi
}

report "$tmp/all-passed" 0 ppp && report "$tmp/all-passed" 1 ppp
expect 0 "all passed on both ranks" -- junit "$tmp/all-passed" 2 3
expect 1 "a test missing from the collected count" -- junit "$tmp/all-passed" 2 4
expect 1 "a test more than collected" -- junit "$tmp/all-passed" 2 2
report "$tmp/skip-on-one" 0 ppp && report "$tmp/skip-on-one" 1 pps
expect 1 "one test skipped on rank 1" -- junit "$tmp/skip-on-one" 2 3
expect 1 "the same, skipped for another reason than allowed" -- junit "$tmp/skip-on-one" 2 3 \
    --skipped-because "the CPU stands in"
report "$tmp/skip-on-both" 0 pps && report "$tmp/skip-on-both" 1 pps
expect 0 "skipped for the reason allowed, on each rank" -- junit "$tmp/skip-on-both" 2 3 \
    --skipped-because "no CUDA GPU"
expect 1 "skipped, no skip allowed" -- junit "$tmp/skip-on-both" 2 3
report "$tmp/all-skipped" 0 sss && report "$tmp/all-skipped" 1 sss
expect 1 "all skipped (no GPU)" -- junit "$tmp/all-skipped" 2 3
report "$tmp/one-failed" 0 pfp && report "$tmp/one-failed" 1 ppp
expect 1 "a test failed on rank 0" -- junit "$tmp/one-failed" 2 3
expect 1 "rank 1's report missing" -- junit "$tmp/one-failed/../all-passed-one" 2 3
report "$tmp/one-rank" 0 ppp
expect 1 "one report for 2 ranks" -- junit "$tmp/one-rank" 2 3

# Each rank's exit status (RCDIR/rank<N>.rc, as tests/run_pytest_mpi.sh writes them) and
# the job's: clean reports do not pass a step whose processes crashed or hung at exit.
# (The job's status is 1 whenever a rank's is not 0; here each is judged on its own.)
exits() { # DIR STATUS...: rank<N>.rc for each STATUS in turn; "-" leaves one out
    local dir=$1 rank=0 status
    shift
    mkdir -p "$dir"
    for status; do
        [[ $status == - ]] || echo "$status" >"$dir/rank$rank.rc"
        rank=$((rank + 1))
    done
}
exits "$tmp/rc-clean" 0 0
expect 0 "clean reports, every rank and the job exit 0" -- junit "$tmp/all-passed" 2 3 \
    --exit 0 --rc-dir "$tmp/rc-clean"
exits "$tmp/rc-crash" 0 139
expect 1 "rank 1 crashed at exit after a clean report" -- junit "$tmp/all-passed" 2 3 \
    --exit 0 --rc-dir "$tmp/rc-crash"
exits "$tmp/rc-hang" - 0
expect 1 "rank 0 hung at exit, killed before it said its status" -- junit "$tmp/all-passed" 2 3 \
    --exit 0 --rc-dir "$tmp/rc-hang"
expect 1 "every rank exited 0, the job timed out (the launcher hung)" -- junit "$tmp/all-passed" \
    2 3 --exit 124 --rc-dir "$tmp/rc-clean"

# The JAX a run tests: the line must name the plugin's version and CUDA major.
versions() { # FILE JSON
    echo "$2" >"$1"
}
smi() { # FILE CUDA: an nvidia-smi header for a driver of that CUDA version
    printf '| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: %s |\n' "$2" >"$1"
}
smi "$tmp/smi-13" 13.0 && smi "$tmp/smi-12" 12.8
good='{"python": "3.12.3", "jax": "0.11.2", "jaxlib": "0.11.2", "jax-cuda13-plugin": "0.11.2",
  "jax-cuda13-pjrt": "0.11.2"}'
versions "$tmp/jax-good.json" "$good"
said=$("$PYTHON" "$ROOT/ci/gpu_verdict.py" jax "$tmp/jax-good.json" --driver "$tmp/smi-13" 2>&1)
if [[ $? != 0 || $said != "PASS: "*"jax-cuda13-plugin 0.11.2 (CUDA 13)"*"CUDA 13.0"* ]]; then
    printf 'gpu_check: FAIL: jax: the image'"'"'s JAX, as seen last:\n%s\n' "$said"
    failed=1
fi
expect 1 "a CUDA 13 plugin on a driver for CUDA 12.8" -- jax "$tmp/jax-good.json" --driver "$tmp/smi-12"
versions "$tmp/jax-skew.json" '{"jax": "0.12.1", "jaxlib": "0.12.1", "jax-cuda12-plugin": "0.12.0.1",
  "jax-cuda12-pjrt": "0.12.0.1"}'
expect 1 "a plugin of another version than jaxlib's" -- jax "$tmp/jax-skew.json" --driver "$tmp/smi-13"
versions "$tmp/jax-two.json" '{"jax": "0.11.2", "jaxlib": "0.11.2", "jax-cuda12-plugin": "0.11.2",
  "jax-cuda12-pjrt": "0.11.2", "jax-cuda13-plugin": "0.11.2", "jax-cuda13-pjrt": "0.11.2"}'
expect 1 "plugins for two CUDA majors" -- jax "$tmp/jax-two.json" --driver "$tmp/smi-13"
versions "$tmp/jax-cpu.json" '{"jax": "0.10.2", "jaxlib": "0.10.2"}'
expect 1 "no CUDA plugin on the GPU machine" -- jax "$tmp/jax-cpu.json" --driver "$tmp/smi-13"
expect 0 "no CUDA plugin where the CPU stands in" -- jax "$tmp/jax-cpu.json" --cpu
expect 1 "no versions read" -- jax "$tmp/missing.json"
if ! "$PYTHON" "$ROOT/ci/gpu_verdict.py" installed | "$PYTHON" -c 'import json, sys
sys.exit("python" not in json.load(sys.stdin))'; then
    echo "gpu_check: FAIL: gpu_verdict.py installed: no JSON with this Python's version"
    failed=1
fi

# The probe's files: whatever they say (or lack), a diagnostic never fails the run.
mkdir -p "$tmp/probe"
cat >"$tmp/probe/rank0.json" <<'JSON'
{"rank": 0, "cuda": {"unused": null, "driver": true, "driver_version": 13000,
 "libcuda": "/usr/lib/libcuda.so.580", "libcudas_mapped": ["/usr/lib/libcuda.so.580",
 "/usr/local/cuda/lib64/stubs/libcuda.so"], "devices": 1, "rank_gpu": 0,
 "chosen": "node-local rank 0 (from MPI_LOCALRANKID) mod 1 GPU(s)", "when": "before MPI_Init",
 "mode": "staged (pinned host copies)"},
 "cuda_aware": {"cuda_aware": false, "cuda_aware_reason": "no CUDA support"},
 "buffers": {"1 MiB": {"is_legacy_cuda_ipc_capable": 0, "mode": "staged", "why": "pool"}}}
JSON
said=$("$PYTHON" "$ROOT/ci/gpu_verdict.py" probe "$tmp/probe" 2 2>&1)
rc=$?
if [[ $rc != 0 ]] || ! grep -q 'UNEXPECTED' <<<"$said" || ! grep -q 'rank 1: no probe report' <<<"$said" ||
    grep -qE '^(PASS|FAIL)' <<<"$said"; then
    printf 'gpu_check: FAIL: probe summary (exit %s):\n%s\n' "$rc" "$said"
    failed=1
fi
# The legacy CUDA IPC answer: yes only if every rank found every buffer capable.
ipc_report() { # DIR RANK VALUE: a probe file whose 64 MiB buffer says VALUE (JSON)
    mkdir -p "$1"
    printf '{"rank": %s, "buffers": {"1 MiB": {"is_legacy_cuda_ipc_capable": 1},
      "64 MiB": {"is_legacy_cuda_ipc_capable": %s, "mode": "staged"}}}\n' "$2" "$3" >"$1/rank$2.json"
}
ipc_report "$tmp/ipc-yes" 0 1 && ipc_report "$tmp/ipc-yes" 1 1
expect 0 "every buffer legacy-IPC capable" -- ipc "$tmp/ipc-yes" 2
expect 1 "a rank without a probe file" -- ipc "$tmp/ipc-yes" 3
ipc_report "$tmp/ipc-no" 0 1 && ipc_report "$tmp/ipc-no" 1 0
expect 1 "rank 1's 64 MiB buffer not capable" -- ipc "$tmp/ipc-no" 2
ipc_report "$tmp/ipc-error" 0 '"CUDA_ERROR_INVALID_VALUE"' && ipc_report "$tmp/ipc-error" 1 1
expect 1 "the driver's error for an answer" -- ipc "$tmp/ipc-error" 2
mkdir -p "$tmp/ipc-cpu"
echo '{"rank": 0, "cuda": {"unused": "no CUDA plugin"}}' >"$tmp/ipc-cpu/rank0.json"
expect 1 "no buffer probed" -- ipc "$tmp/ipc-cpu" 1

# A run's results, packed: what is left in OUT must all come back (8 files at most, in
# subfolders too), and the archive must hold every result, a runaway log cut short.
mkdir -p "$tmp/out" "$tmp/results"
: >"$tmp/out/run.log" && : >"$tmp/out/verdicts.txt"
results=(nvidia-smi.txt mpi4jax-build.log bench-staged.md bench-direct.md
    probe-auto-mpich.log probe-auto-impi.log)
for leg in staged staged-fast staged-error direct direct-error; do
    results+=("junit-$leg/rank0.xml" "junit-$leg/rank1.xml" "logs-$leg/rank1.log")
done
for probe in auto-mpich auto-impi; do results+=("probe-$probe/rank0.json" "probe-$probe/rank1.json"); done
for name in "${results[@]}"; do
    mkdir -p "$(dirname "$tmp/results/$name")" && echo "$name" >"$tmp/results/$name"
done
head -c $((20 << 20)) /dev/zero >"$tmp/results/logs-direct/rank1.log"
expect 0 "${#results[@]} results packed" -- archive "$tmp/results" "$tmp/out"
left_in_out=$(find "$tmp/out" -type f | wc -l)
archived=$("$PYTHON" -c 'import sys, tarfile
members = tarfile.open(sys.argv[1]).getmembers()
print(len(members), max(m.size for m in members))' "$tmp/out/results.tar.gz" 2>&1)
if ((left_in_out > 8)) || [[ $archived != "${#results[@]} "[0-9]* ]] || ((${archived#* } > 7 << 20)); then
    printf 'gpu_check: FAIL: archive: %s files left in OUT; archived (files, largest): %s\n' \
        "$left_in_out" "$archived"
    failed=1
fi
mkdir -p "$tmp/out/logs"
touch "$tmp/out/"{junit.xml,bench.md,probe.json,nvidia-smi.txt} "$tmp/out/logs/"rank{0,1}.log
expect 1 "9 files under OUT, 2 of them in a subfolder" -- archive "$tmp/results" "$tmp/out"

expect 2 "misuse" -- junit "$tmp/all-passed" 2
expect 2 "misuse" -- mode "$tmp/all-passed" 2 staged

((failed)) && { echo "gpu_check: FAILED"; exit 1; }
echo "gpu_check: passed"
