#!/usr/bin/env bash
# Instructions one jaxmpi call costs inside its handler, before and after a change, in one
# run: `valgrind --tool=callgrind` counting only inside the op's exported handler
# (--toggle-collect), over a jitted fori_loop of 1-element calls of the op on 1 rank of
# PyPI MPICH, at 1,000 and 11,000 calls; the slope is the cost per call. OP: allreduce
# (the default), bcast or gather (root 0). Each revision's extension is built in a
# worktree of its own (benches/builds.sh) and loaded in place of the installed one.
# Usage: [OP=allreduce] benches/bench_callgrind.sh BEFORE [AFTER]
#        (revisions; AFTER: the working tree)
set -eu -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
before=$1 after=${2:-} op=${OP:-allreduce}
work=${TMPDIR:-/tmp}/jaxmpi-callgrind
mkdir -p "$work"
py=$ROOT/.venvs/mpich/bin/python

# shellcheck source=builds.sh
source "$ROOT/benches/builds.sh"

cat >"$work/loop.py" <<'PY'
import sys
import jax
import jax.numpy as jnp
import jaxmpi
calls = int(sys.argv[1])
op = {
    "allreduce": lambda y: jaxmpi.allreduce(y, jaxmpi.SUM),
    "bcast": lambda y: jaxmpi.bcast(y, 0),
    "gather": lambda y: jaxmpi.gather(y, 0)[0],
}[sys.argv[2]]
run = jax.jit(lambda x: jax.lax.fori_loop(0, calls, lambda _, y: op(y), x))
print(float(run(jnp.ones(1))))
PY

# count TREE CALLS: instructions inside the handler for CALLS calls, with TREE's extension
# and Python package in place of the installed ones.
count() {
    local tree=$1 calls=$2 site
    site=$(site "$tree" "$calls")
    (cd "$work" && env -i HOME="$HOME" PATH="$ROOT/.venvs/mpich/bin:$PATH" JAX_PLATFORMS=cpu \
        PYTHONPATH="$site" valgrind --tool=callgrind --callgrind-out-file="$work/out.$$" \
        --toggle-collect="jaxmpi_core::xla::handlers::exported::$op*" \
        "$py" "$work/loop.py" "$calls" "$op" >/dev/null 2>&1)
    callgrind_annotate "$work/out.$$" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
    rm -f "$work/out.$$"
}

echo "$op:"
echo "| build | 1,000 calls | 11,000 calls | per call (slope) |"
echo "|---|---:|---:|---:|"
for rev in "$before" "$after"; do
    tree=$(extension "$rev")
    small=$(count "$tree" 1000)
    large=$(count "$tree" 11000)
    echo "| ${rev:-working tree} | $small | $large | $(python3 -c "print(f'{($large - $small) / 10000:.1f}')") |"
done
