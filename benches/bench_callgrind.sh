#!/usr/bin/env bash
# Instructions one jaxmpi call costs inside its handler, before and after a change, in one
# run: `valgrind --tool=callgrind` counting only inside the op's exported handler
# (--toggle-collect), over a jitted fori_loop of 1-element calls of the op on PyPI MPICH,
# at 1,000 and 11,000 calls; the slope is the cost per call. Each revision's extension is
# built in a worktree of its own (benches/builds.sh) and loaded in place of the installed
# one.
#
# OP: allreduce (the default), bcast, reduce, gather or scatter (the rooted ones at root 0).
# PROFILE=1: the loop runs under JAXMPI_PROFILE (jaxmpi's own profile recording every
# call): the cost of a call recorded, and, in the "own" column's allocator, whether a call
# allocates.
# RANKS: 1 (the default) or 2. At 2 ranks rank 1 shows the path away from the root, and
# the handler's total includes waiting inside MPI for the other rank, which varies from
# run to run; the "own" column counts only jaxmpi's extension and the allocator, the
# work that does not wait.
# Usage: [OP=allreduce] [RANKS=1] [PROFILE=1] benches/bench_callgrind.sh BEFORE [AFTER]
#        (revisions, or folders holding a tree; AFTER: the working tree)
set -eu -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
before=$1 after=${2:-} op=${OP:-allreduce} ranks=${RANKS:-1}
work=${TMPDIR:-/tmp}/jaxmpi-callgrind
mkdir -p "$work"
profile=()
[[ ${PROFILE:-} == 1 ]] && profile=("JAXMPI_PROFILE=$work/profile")
py=$ROOT/.venvs/mpich/bin/python

# shellcheck source=builds.sh
source "$ROOT/benches/builds.sh"

cat >"$work/loop.py" <<'PY'
import sys
import jax
import jax.numpy as jnp
import jaxmpi
calls = int(sys.argv[1])
rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
# Each keeps the loop's 1-element carry on every rank (the rooted ops return their input
# away from the root; a scatter's input is a template there).
op = {
    "allreduce": lambda y: jaxmpi.allreduce(y, jaxmpi.SUM),
    "bcast": lambda y: jaxmpi.bcast(y, 0),
    "reduce": lambda y: jaxmpi.reduce(y, jaxmpi.SUM, 0),
    "gather": lambda y: jaxmpi.gather(y, 0).reshape(-1)[:1],
    "scatter": lambda y: jaxmpi.scatter(jnp.broadcast_to(y, (size, 1)) if rank == 0 else y, 0),
}[sys.argv[2]]
run = jax.jit(lambda x: jax.lax.fori_loop(0, calls, lambda _, y: op(y), x))
print("finished", run(jnp.ones(1)))
PY

# run SITE CALLS: the loop under callgrind on every rank; true if every rank printed its
# result and left its counts. Under valgrind, Python and jaxlib sometimes crash on the way
# out (in the garbage collector, in oneDNN's static destructors), after the loop, now and
# then before callgrind has written a rank's file.
run() {
    local site=$1 calls=$2 rank
    rm -f "$work/out.$$".*
    (cd "$work" && env -i HOME="$HOME" PATH="$ROOT/.venvs/mpich/bin:$PATH" JAX_PLATFORMS=cpu \
        PYTHONPATH="$site" "${profile[@]}" mpiexec -n "$ranks" valgrind --tool=callgrind \
        --callgrind-out-file="$work/out.$$.%q{PMI_RANK}" \
        --toggle-collect="jaxmpi_core::xla::handlers::exported::$op*" \
        "$py" "$work/loop.py" "$calls" "$op" >"$work/printed.$$" 2>/dev/null) || true
    [[ $(grep -c '^finished' "$work/printed.$$") == "$ranks" ]] || return 1
    for ((rank = 0; rank < ranks; rank++)); do
        [[ -s $work/out.$$.$rank ]] || return 1
    done
}

# count TREE CALLS: for each rank, "total own" instructions inside the handler for CALLS
# calls, with TREE's extension and Python package in place of the installed ones.
count() {
    local tree=$1 calls=$2 site rank attempt
    site=$(site "$tree" "$calls")
    for attempt in 1 2 3; do
        run "$site" "$calls" && break
        if ((attempt == 3)); then
            echo "the $calls-call loop of $op failed 3 times ($tree)" >&2
            return 1
        fi
    done
    for ((rank = 0; rank < ranks; rank++)); do
        callgrind_annotate --threshold=100 "$work/out.$$.$rank" 2>/dev/null | awk '
            /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
            /_native\.abi3\.so\]$|\/malloc\.c:/ { gsub(",", "", $1); own += $1 }
            END { printf "%d %d\n", total, own }'
    done
    rm -f "$work/out.$$".*
}

slope() { python3 -c "print(f'{($2 - $1) / 10000:,.1f}')"; }

echo "$op at $ranks rank(s)${profile:+, under JAXMPI_PROFILE}, instructions a call inside the handler (slope from 1,000 to 11,000 calls):"
echo "| build | rank | total | own (extension + allocator) |"
echo "|---|---:|---:|---:|"
for rev in "$before" "$after"; do
    tree=$(extension "$rev")
    mapfile -t small < <(count "$tree" 1000)
    mapfile -t large < <(count "$tree" 11000)
    ((${#small[@]} == ranks && ${#large[@]} == ranks)) || exit 1
    for ((rank = 0; rank < ranks; rank++)); do
        read -r small_total small_own <<<"${small[rank]}"
        read -r large_total large_own <<<"${large[rank]}"
        echo "| ${rev:-working tree} | $rank | $(slope "$small_total" "$large_total") | $(slope "$small_own" "$large_own") |"
    done
done
