#!/usr/bin/env bash
# Whole-job reliability checks that pytest inside one job cannot make: a receive that is
# never matched ends the job under JAXMPI_TIMEOUT with a diagnostic (MPICH and Open MPI);
# concurrent calls under MPI_THREAD_SERIALIZED are refused clearly; JAXMPI_DEBUG prints a
# line per call from inside jit; bad values of the variables are refused at import.
# Usage: tests/reliability_errors.sh   (from anywhere; uses .venvs/mpich and .venvs/openmpi
# with the jaxmpi they have installed, or the one on PYTHONPATH). About 40 s.
set -u -o pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cases="$root/tests/reliability_errors_cases.py"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
failed=0

# expect NAME "TEXT|TEXT..." CMD...: CMD must end within 90 s and print every TEXT
# (fixed strings) on stdout or stderr.
expect() {
    local name=$1 texts=$2 out rc t0=$SECONDS missing=()
    shift 2
    local log
    log=$(mktemp)
    timeout -k 5 90 "$@" >"$log" 2>&1
    rc=$?
    out=$(tr -d '\0' <"$log")
    rm -f "$log"
    IFS='|' read -r -a wanted <<<"$texts"
    for text in "${wanted[@]}"; do
        grep -qF -- "$text" <<<"$out" || missing+=("$text")
    done
    grep -qF UNEXPECTED <<<"$out" && missing+=("(no UNEXPECTED line)")
    if ((rc == 124 || rc == 137)); then
        missing+=("(the job did not end within 90 s)")
    fi
    if ((${#missing[@]} == 0)); then
        echo "pass  $name ($((SECONDS - t0)) s, exit $rc)"
    else
        echo "FAIL  $name (exit $rc) lacks: ${missing[*]}"
        sed 's/^/      | /' <<<"$out" | tail -n 15
        failed=$((failed + 1))
    fi
}

if [[ ${1:-} == --job ]]; then # --job VENV RANKS CASE [ENV...]: one job of a case
    venv="$root/.venvs/$2" ranks=$3 case=$4
    shift 4
    exec env "$@" PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" \
        "$venv/bin/mpiexec" -n "$ranks" "$venv/bin/python" "$cases" "$case"
fi
run="${BASH_SOURCE[0]} --job"

stuck="rank 0: recv (comm |source 1, tag 42, 20 bytes) has been waiting|longer than JAXMPI_TIMEOUT=3 s|Aborting the job"
for venv in mpich openmpi; do
    expect "never-matched receive ends the job ($venv)" "$stuck|the last 1 calls|allreduce (comm" \
        $run "$venv" 2 never_sent JAXMPI_TIMEOUT=3 JAXMPI_DEBUG=1
done
expect "concurrent calls under MPI_THREAD_SERIALIZED are refused" \
    "REFUSED jaxmpi.allreduce: rank 0: another thread is inside an MPI call|MPI_THREAD_SERIALIZED|MPI_THREAD_MULTIPLE|RECEIVED [0.0, 1.0, 2.0]|STILL USABLE 2.0" \
    $run mpich 2 serialized_threads
expect "JAXMPI_DEBUG=1 logs every call from inside jit" \
    "rank 0: sendrecv (comm |dest 1, source 1, sendtag 7, recvtag 7, 16 bytes)|rank 1: bcast (comm |root 0, 16 bytes)| us|DONE" \
    $run mpich 2 debug_lines JAXMPI_DEBUG=1
waited="rank 0: wait for irecv (comm |source 1, tag 42, 20 bytes)|longer than JAXMPI_TIMEOUT=3 s|Aborting the job"
for venv in mpich openmpi; do
    expect "a never-matched irecv's wait ends the job ($venv)" "$waited" \
        $run "$venv" 2 never_sent_nonblocking JAXMPI_TIMEOUT=3 JAXMPI_PROGRESS=thread
done
expect "JAXMPI_DEBUG shows requests start and complete; unwaited ones are reported at exit" \
    "rank 0: isend (comm |dest 1, tag 7, 16 bytes)|rank 1: irecv (comm |source 0, tag 7, 16 bytes) completed after|at exit, irecv (comm |source 1, tag 99, 8 bytes): never waited for; cancelled|DONE" \
    $run mpich 2 nonblocking_lines_and_exit JAXMPI_DEBUG=1 JAXMPI_PROGRESS=thread
expect "below MPI_THREAD_MULTIPLE, waits block with the same values" \
    "PROGRESS at-start: MPI runs at MPI_THREAD_SERIALIZED: only MPI_THREAD_MULTIPLE allows a progress thread|VALUES right" \
    $run mpich 2 serialized_nonblocking
py="$root/.venvs/mpich/bin/python"
expect "a bad JAXMPI_TIMEOUT is refused at import" "ValueError: JAXMPI_TIMEOUT='soon'" \
    env JAXMPI_TIMEOUT=soon "$py" -c "import jaxmpi"
expect "a bad JAXMPI_DEBUG is refused at import" "ValueError: JAXMPI_DEBUG='yes'" \
    env JAXMPI_DEBUG=yes "$py" -c "import jaxmpi"
expect "a bad JAXMPI_PROGRESS is refused at import" "ValueError: JAXMPI_PROGRESS='fast'" \
    env JAXMPI_PROGRESS=fast "$py" -c "import jaxmpi"
expect "a bad JAXMPI_MESH_REDUCTIONS is refused at import" \
    "ValueError: JAXMPI_MESH_REDUCTIONS='exact'" \
    env JAXMPI_MESH_REDUCTIONS=exact "$py" -c "import jaxmpi"
expect "a bad JAXMPI_MAX_COMMUNICATORS is refused at import" \
    "ValueError: JAXMPI_MAX_COMMUNICATORS='0'" \
    env JAXMPI_MAX_COMMUNICATORS=0 "$py" -c "import jaxmpi"
echo "$failed failed"
((failed == 0))
