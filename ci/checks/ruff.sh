#!/usr/bin/env bash
# ruff's lint and format check of every Python file (the configuration: ruff.toml, which
# extends python/pyproject.toml's).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
paths=(python tests examples benches ci docs)
"$ROOT/.venvs/mpich/bin/ruff" check "${paths[@]}" && "$ROOT/.venvs/mpich/bin/ruff" format --check "${paths[@]}"
