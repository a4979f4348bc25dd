#!/usr/bin/env bash
# mpi4jax's own test suite, of release VERSION (its sdist from PyPI), against jaxmpi
# presenting that release (JAXMPI_AS_MPI4JAX=VERSION), at 2 ranks on PyPI MPICH
# (.venvs/mpich with the jaxmpi it has installed). By hand, not in ./ci/test.sh: the README
# says what it gave for 0.7.2 and why the rest fails.
# Usage: tests/mpi4jax_suite.sh VERSION [PYTEST ARGS...]     e.g. tests/mpi4jax_suite.sh 0.7.2
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version=${1:?usage: tests/mpi4jax_suite.sh VERSION [PYTEST ARGS...]}
shift
venv="$ROOT/.venvs/mpich"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The sdist itself (pip download would build it): its link on PyPI's simple index.
"$venv/bin/python" - "$version" "$work" <<'PY'
import re, sys, tarfile, urllib.request
version, work = sys.argv[1], sys.argv[2]
index = urllib.request.urlopen("https://pypi.org/simple/mpi4jax/", timeout=60).read().decode()
links = dict((name, url) for url, name in re.findall(r'href="([^"#]+)[^"]*"[^>]*>([^<]+)<', index))
name = f"mpi4jax-{version}.tar.gz"
if name not in links:
    sys.exit(f"no sdist {name} on PyPI")
path, _ = urllib.request.urlretrieve(links[name], f"{work}/{name}")
tarfile.open(path).extractall(work)
PY
cd "$work/mpi4jax-$version"
# Files that import mpi4jax's internals (mpi4jax._src) at the top cannot be collected:
# reported as errors, the rest runs.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 JAXMPI_AS_MPI4JAX=$version \
    JAX_PLATFORMS=cpu "$venv/bin/mpiexec" -n 2 "$venv/bin/python" -m pytest -q -rfE \
    -p no:cacheprovider --continue-on-collection-errors tests "$@"
