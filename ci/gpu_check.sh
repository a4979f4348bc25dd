#!/usr/bin/env bash
# ci/gpu_check.sh -- keeps the GPU run's scripts working where there is no GPU (CI): they
# parse, shellcheck finds no warning (where it is installed), gpu_run.sh neither builds
# Rust nor installs from an index, and gpu_verdict.py, which
# decides whether a GPU run passed, judges canned reports right: a CUDA test skipped, failed
# or missing fails the run, only all passed passes it. About a second.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPTS=("$ROOT/ci/gpu_pack.sh" "$ROOT/ci/gpu_run.sh" "$ROOT/ci/gpu_check.sh")
PYTHON=${PYTHON:-python3}
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for script in "${SCRIPTS[@]}"; do
    bash -n "$script" || failed=1
done
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
expect 0 "all passed on both ranks" -- junit "$tmp/all-passed" 2
report "$tmp/skip-on-one" 0 ppp && report "$tmp/skip-on-one" 1 pps
expect 1 "one test skipped on rank 1" -- junit "$tmp/skip-on-one" 2
expect 0 "the same, skips allowed" -- junit "$tmp/skip-on-one" 2 --allow-skips
report "$tmp/all-skipped" 0 sss && report "$tmp/all-skipped" 1 sss
expect 1 "all skipped (no GPU)" -- junit "$tmp/all-skipped" 2
expect 1 "all skipped, skips allowed" -- junit "$tmp/all-skipped" 2 --allow-skips
report "$tmp/one-failed" 0 pfp && report "$tmp/one-failed" 1 ppp
expect 1 "a test failed on rank 0" -- junit "$tmp/one-failed" 2
expect 1 "rank 1's report missing" -- junit "$tmp/one-failed/../all-passed-one" 2
report "$tmp/one-rank" 0 ppp
expect 1 "one report for 2 ranks" -- junit "$tmp/one-rank" 2

cuda_line() { # NODE_RANK MODE: the CUDA line of `python -m jaxmpi info`
    echo "CUDA            driver loaded, 1 GPU(s), this rank: GPU 0 (node-local rank $1 of 2)," \
        "mode: $2"
}
staged="staged (pinned host copies)"
{ cuda_line 0 "$staged" && cuda_line 1 "$staged"; } >"$tmp/staged.txt"
expect 0 "info: staged, asked staged" -- mode "$tmp/staged.txt" 2 staged
expect 1 "info: staged, asked direct" -- mode "$tmp/staged.txt" 2 direct
echo "CUDA            not used (this jaxlib has no CUDA plugin)" >"$tmp/none.txt"
expect 1 "info: no CUDA" -- mode "$tmp/none.txt" 1 staged
cuda_line 0 "direct (CUDA-aware MPI)" >"$tmp/direct-one.txt"
expect 1 "info: one rank's line for 2 ranks" -- mode "$tmp/direct-one.txt" 2 direct
expect 2 "misuse" -- mode "$tmp/staged.txt" 2 sideways

((failed)) && { echo "gpu_check: FAILED"; exit 1; }
echo "gpu_check: passed"
