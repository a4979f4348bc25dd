# shellcheck shell=bash
# tests/expect.sh -- sourced by the job scripts whose checks are whole commands
# (tests/gpu_startup.sh, tests/jax_distributed_jobs.sh): one command, its exit status and
# the lines it must print, a PASS or FAIL line, and the closing count.

EXPECT_PASSED=0 EXPECT_FAILED=0
EXPECT_OUT=$(mktemp)
trap 'rm -f "$EXPECT_OUT"' EXIT

# expect NAME STATUS WANTS CMD...: runs CMD; passes when its exit status is STATUS (0, or
# "fail": any other) and its output has a line matching each ";"-separated pattern of
# WANTS (grep -E); else prints what was missing and the output's last lines.
expect() {
    local name=$1 status=$2 wants=$3 rc want
    local -a missing=() patterns=()
    shift 3
    "$@" >"$EXPECT_OUT" 2>&1
    rc=$?
    IFS=';' read -r -a patterns <<<"$wants"
    for want in "${patterns[@]}"; do grep -qE -- "$want" "$EXPECT_OUT" || missing+=("/$want/"); done
    if ((${#missing[@]} == 0)) && { [[ $status == 0 && $rc == 0 ]] || [[ $status == fail && $rc != 0 ]]; }; then
        EXPECT_PASSED=$((EXPECT_PASSED + 1))
        echo "PASS $name"
        return 0
    fi
    EXPECT_FAILED=$((EXPECT_FAILED + 1))
    echo "FAIL $name: exit status $rc (wanted $status), lines missing: ${missing[*]:-none}"
    grep -v -e '^$' -e 'cudart_stub.cc' "$EXPECT_OUT" | tail -n 20 | sed 's/^/    /'
    return 1
}

# The closing line ./ci/test.sh reads, and the script's exit status.
expect_summary() {
    echo "$EXPECT_PASSED passed, $EXPECT_FAILED failed"
    ((EXPECT_FAILED == 0))
}
