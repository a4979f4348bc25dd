#!/usr/bin/env bash
# The Python suite's selection is declared where the tests are (tests/python/selection.py):
# a test file added to tests/python runs on every build of the matrix with no list to
# touch. Checked on a copy of the checkout (its files as git sees them) with two files
# added: one that declares nothing, which every build's suite cell must run (and the
# first build's at 1 and 3 ranks), and one marked same_on_every_mpi, which only the
# builds running the whole suite may run (so the machinery is seen to leave out what a file
# declares). And every test file of the checkout must have tests some cell runs: markers
# that leave a file out of every kind of cell fail here. ci/suite_cells.sh answers (~20 s).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
copy=$(mktemp -d "${TMPDIR:-/tmp}/jaxmpi-selection.XXXXXX") || exit 1
trap 'rm -rf "$copy"' EXIT
git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
    (cd "$ROOT" && tar --null -T - -cf -) | tar -C "$copy" -xf - || exit 1
ln -s "$ROOT/.venvs" "$copy/.venvs"
cat >"$copy/tests/python/test_added.py" <<'EOF'
import numpy as np
import pytest

from helpers import ALL_DTYPES, SIZE


def test_size():
    assert SIZE >= 1


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_dtype(dtype):
    assert np.zeros(2, dtype=dtype).shape == (2,)
EOF
cat >"$copy/tests/python/test_added_blind.py" <<'EOF'
import pytest

pytestmark = pytest.mark.same_on_every_mpi


def test_nothing_an_mpi_changes():
    assert True
EOF
mapfile -t existing < <(cd "$ROOT" && git ls-files 'tests/python/test_*.py')
"$copy/ci/suite_cells.sh" which tests/python/test_added.py tests/python/test_added_blind.py \
    "${existing[@]}" >"$copy/cells" || exit 1

# shellcheck source=../matrix.sh
source "$copy/ci/matrix.sh"
bad=0
fail() { echo "BAD  $*"; bad=$((bad + 1)); }
count() { # GROUP BUILD N FILE: the tests of FILE that cell runs ("" if no such cell)
    awk -v g="$1" -v b="$2" -v n="$3" -v f="$4" '$1 == g && $2 == b && $3 == n && $5 == f {print $6}' "$copy/cells"
}
# The build whose pytest cell stands for BUILD: its own, or that of a side build of the
# same MPI that took it (Intel MPI's standard-ABI library, ci/matrix.sh).
suite_build() {
    local side
    if [[ -z $(count pytest "$1" 2 tests/python/test_added.py) ]]; then
        for side in "${JAXMPI_MATRIX_SIDE_BUILDS[@]}"; do
            [[ ${JAXMPI_MATRIX_VENV[$side]} == "${JAXMPI_MATRIX_VENV[$1]}" ]] && echo "$side" && return
        done
    fi
    echo "$1"
}
for build in "${JAXMPI_MATRIX_BUILDS[@]}"; do
    build=$(suite_build "$build")
    got=$(count pytest "$build" 2 tests/python/test_added.py)
    [[ -n $got && $got -ge 2 ]] || fail "the added file: ${got:-no} tests on $build at 2 ranks"
    got=$(count pytest "$build" 2 tests/python/test_added_blind.py)
    if [[ ${JAXMPI_MATRIX_SUITE[$build]} == other-mpi || ${JAXMPI_MATRIX_SUITE[$build]} == family ]]; then
        [[ $got == 0 ]] || fail "the file marked same_on_every_mpi: $got tests on $build, another MPI"
    else
        [[ $got == 1 ]] || fail "the file marked same_on_every_mpi: ${got:-no} tests on $build"
    fi
done
first=${JAXMPI_MATRIX_BUILDS[0]}
for n in 1 3; do
    got=$(count "$([[ $n == 1 ]] && echo pytest || echo pytest-ranks)" "$first" "$n" tests/python/test_added.py)
    [[ -n $got && $got -ge 2 ]] || fail "the added file: ${got:-no} tests on $first at $n ranks"
done
echo "the cells that run the added file:"
awk '$5 == "tests/python/test_added.py" && $6 > 0 {print "  " $1, $2, "n=" $3, $4 ": " $6 " tests"}' "$copy/cells"
for file in "${existing[@]}"; do
    awk -v f="$file" '$5 == f && $6 > 0 {found = 1} END {exit !found}' "$copy/cells" ||
        fail "$file: no cell runs any of its tests (selection.py's KINDS say which cell would)"
done
echo "${#JAXMPI_MATRIX_BUILDS[@]} builds, ${#existing[@]} test files: $bad problem(s)"
((bad == 0))
