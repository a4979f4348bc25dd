#!/usr/bin/env bash
# The plug-in through which XLA's MPI backend runs JAX's collectives over jaxmpi's MPI
# (backends/src/xla_plugin): every name each jaxlib of the matrix resolves is in the
# generated contract, with the values it was generated with, and the extension module the
# wheel installed exports all of them.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bad=0
module=$(echo "$ROOT"/.venvs/mpich/lib/python3.*/site-packages/jaxmpi/_native.abi3.so)
for venv in mpich jax-oldest py3.13-jax-0.11 py3.13-jax-0.12; do
    jaxlib=$(echo "$ROOT/.venvs/$venv"/lib/python3.*/site-packages/jaxlib)
    python3 "$ROOT/ci/xla_plugin_contract.py" --jaxlib "$jaxlib" --check \
        --abi-header "$ROOT/.venvs/mpich/include/mpi_abi.h" --exports "$module" || bad=$((bad + 1))
done
((bad == 0))
