#!/usr/bin/env bash
# ci/suite_cells.sh -- the Python suite's cells that ./ci/test.sh runs, and which tests each
# runs, as the cells themselves select them (tests/python/selection.py).
#
# usage: ci/suite_cells.sh                 every cell: GROUP BUILD N KIND [K=V...]
#        ci/suite_cells.sh which FILE...   every cell and FILE: GROUP BUILD N KIND FILE COUNT,
#                                          COUNT the tests of FILE the cell runs (0: none)
#
# `which` collects the suite once per kind of cell (pytest --collect-only, in one process
# of .venvs/mpich's Python with the cell's environment: ~2 s each, two at a time), not
# under the build's launcher: a test parametrized by the number of ranks counts as at 1
# rank. JAXMPI_MATRIX_ONLY selects builds as for ./ci/test.sh; PYTHONPATH, if set, is
# passed on.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=matrix.sh source-path=SCRIPTDIR
source "$ROOT/ci/matrix.sh"

if (($# == 0)); then
    matrix_suite_cells
    exit
fi
[[ $1 == which && $# -gt 1 ]] || {
    sed -n '5,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
shift
files=("$@")

# collect OUT KIND [K=V...]: the node ids a cell of KIND runs, into OUT (OUT.failed if not).
collect() {
    local out=$1 kind=$2 rc
    shift 2
    local -a env=(env -i "HOME=$HOME" "PATH=$ROOT/.venvs/mpich/bin:/usr/bin:/bin" JAX_PLATFORMS=cpu
        "XLA_FLAGS=--xla_force_host_platform_device_count=1" PYTHONDONTWRITEBYTECODE=1)
    [[ -n ${PYTHONPATH:-} ]] && env+=("PYTHONPATH=$PYTHONPATH")
    (cd "$ROOT" && "${env[@]}" "$@" python -m pytest -p no:cacheprovider --collect-only -q \
        "--jaxmpi-cell=$kind" tests/python) >"$out.log" 2>&1
    rc=$?
    if ((rc != 0 && rc != 5)); then
        {
            echo "suite_cells: collecting the cells of kind $kind failed (pytest exit $rc):"
            tail -n 30 "$out.log"
        } >"$out.failed"
    fi
    grep -a '::' "$out.log" >"$out"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/jaxmpi-cells.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
mapfile -t cells < <(matrix_suite_cells)
# Each distinct kind (with its settings) once, two at a time: ~2 s each, most of it
# importing JAX, 16 kinds.
declare -A collection=()
for cell in "${cells[@]}"; do
    read -r _ _ _ kind rest <<<"$cell"
    key="$kind $rest"
    [[ -v collection[$key] ]] && continue
    collection[$key]=$work/${#collection[@]}
    (($(jobs -rp | wc -l) >= 2)) && wait -n
    # shellcheck disable=SC2086  # rest: K=V words
    collect "${collection[$key]}" "$kind" $rest &
done
wait
status=0
for out in "${collection[@]}"; do
    [[ -e $out.failed ]] && cat "$out.failed" >&2 && status=1
done
listed=$(printf '%s\n' "${files[@]}")
for cell in "${cells[@]}"; do
    read -r group build n kind rest <<<"$cell"
    # One pass over the node ids for every file (a grep per file and cell took ~5 s).
    awk -v cell="$group $build $n $kind" -v listed="$listed" '
        BEGIN { n = split(listed, file, "\n") }
        { split($0, id, "::"); tests[id[1]]++ }
        END { for (i = 1; i <= n; i++) { f = file[i]; sub(/^\.\//, "", f); print cell, file[i], tests[f] + 0 } }
    ' "${collection[$kind $rest]}"
done
exit "$status"
