#!/usr/bin/env bash
# py.typed ships: the public API's annotations are checked (configuration:
# python/pyproject.toml).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT/python" && "$ROOT/.venvs/mpich/bin/mypy" --python-executable "$ROOT/.venvs/mpich/bin/python"
