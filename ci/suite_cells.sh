#!/usr/bin/env bash
# ci/suite_cells.sh -- the Python suite's cells that ./ci/test.sh runs, and which tests each
# runs, as the cells themselves select them (tests/python/selection.py).
#
# usage: ci/suite_cells.sh                 every cell: GROUP BUILD N KIND [K=V...]
#        ci/suite_cells.sh which FILE...   every cell and FILE: GROUP BUILD N KIND FILE COUNT,
#                                          COUNT the tests of FILE the cell runs (0: none)
#
# `which` collects the suite once per kind of cell (pytest --collect-only, in one process
# of .venvs/mpich's Python with the cell's environment: ~2 s each), not under the build's
# launcher: a test parametrized by the number of ranks counts as at 1 rank. JAXMPI_MATRIX_ONLY
# selects builds as for ./ci/test.sh; PYTHONPATH, if set, is passed on.
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

# collect KIND [K=V...]: the node ids a cell of KIND runs.
collect() {
    local kind=$1 rc
    shift
    local -a env=(env -i "HOME=$HOME" "PATH=$ROOT/.venvs/mpich/bin:/usr/bin:/bin" JAX_PLATFORMS=cpu
        "XLA_FLAGS=--xla_force_host_platform_device_count=1" PYTHONDONTWRITEBYTECODE=1)
    [[ -n ${PYTHONPATH:-} ]] && env+=("PYTHONPATH=$PYTHONPATH")
    (cd "$ROOT" && "${env[@]}" "$@" python -m pytest -p no:cacheprovider --collect-only -q \
        "--jaxmpi-cell=$kind" tests/python) >"$work/out" 2>&1
    rc=$?
    if ((rc != 0 && rc != 5)); then
        echo "suite_cells: collecting the cells of kind $kind failed (pytest exit $rc):" >&2
        tail -n 30 "$work/out" >&2
        return 1
    fi
    grep -a '::' "$work/out"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/jaxmpi-cells.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
declare -A collected=()
status=0
while read -r group build n kind rest; do
    key="$kind $rest"
    if [[ ! -v collected[$key] ]]; then
        # shellcheck disable=SC2086  # rest: K=V words
        collected[$key]=$(collect "$kind" $rest) || status=1
    fi
    for file in "${files[@]}"; do
        count=$(grep -c -- "^${file#./}::" <<<"${collected[$key]}")
        echo "$group $build $n $kind $file $count"
    done
done < <(matrix_suite_cells)
exit "$status"
