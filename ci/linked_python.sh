#!/usr/bin/env bash
# ci/linked_python.sh -- the Python suite as another MPI's cells run it (2 ranks) on a
# jaxmpi built with the `linked` backend against Debian's MPICH, run with JAXMPI_MPI=linked.
#
# Builds the wheel with the documented source-build command (maturin --features linked,
# MPICC=mpicc.mpich) into target/linked-mpich/wheel, unpacks it into
# target/linked-mpich/site (never into the shared venvs, never into dist/), and runs
# the debian-mpich-4.0 cell of ci/matrix.sh with that directory first on PYTHONPATH.
# Exit status: 0 when every rank passed. Needs: ci/setup.sh (the venvs, Debian MPICH,
# libclang-dev).
set -u -o pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
[[ -d $HOME/.cargo/bin ]] && PATH="$HOME/.cargo/bin:$PATH"
t0=$SECONDS
out="$root/target/linked-mpich"
rm -rf "$out/wheel" "$out/site"
# --auditwheel skip: a repaired wheel would carry its own copy of libmpich.
if ! MPICC=mpicc.mpich CARGO_TARGET_DIR="$out" "$root/.venvs/mpich/bin/maturin" build --quiet \
    --release --features linked --auditwheel skip --manifest-path python/Cargo.toml -o "$out/wheel"; then
    echo "linked_python: FAIL building the linked wheel"
    exit 1
fi
"$root/.venvs/system/bin/python" -m zipfile -e "$out"/wheel/jaxmpi-*.whl "$out/site" || exit 1
echo "linked_python: built $(basename "$out"/wheel/jaxmpi-*.whl) ($((SECONDS - t0))s)"

# shellcheck source=matrix.sh source-path=SCRIPTDIR
source "$root/ci/matrix.sh"
# The suite must really have run on the linked backend.
read -r -a pyenv <<<"${JAXMPI_MATRIX_PYENV[debian-mpich-4.0]//\{root\}/$root}"
chosen=$(matrix_exec debian-mpich-4.0 1 "${pyenv[@]}" JAXMPI_MPI=linked "PYTHONPATH=$out/site" -- \
    python -m jaxmpi info 2>&1 | grep 'chosen')
echo "linked_python: $chosen"
if [[ $chosen != *"because JAXMPI_MPI=linked (built with mpicc.mpich)"* ]]; then
    echo "linked_python: FAIL the linked build did not choose its linked backend"
    exit 1
fi
log="$out/pytest.log"
t=$SECONDS
# The kind of cell another MPI gets (tests/python/selection.py): the linked backend differs
# from the loaded one in how it reaches the library, not in what the rest tests.
PYTEST_CELL=other-mpi run_pytest_cell debian-mpich-4.0 2 "$log" JAXMPI_MPI=linked "PYTHONPATH=$out/site"
tail -n 3 "$log"
echo "linked_python: $CELL_RESULT ($CELL_NOTE) pytest $((SECONDS - t))s, total $((SECONDS - t0))s"
[[ $CELL_RESULT == pass ]]
