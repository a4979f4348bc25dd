#!/usr/bin/env bash
# The startup hook where jaxmpi and jax live in different site directories, the one holding
# jaxmpi processed first: Python runs jaxmpi's .pth file before jax's folder is on sys.path,
# so the hook must decide at `import jax`, not then. Each layout is built for real in a
# temporary folder, jaxmpi installed into it by pip from the wheel:
#   user     `pip install --user` (PYTHONUSERBASE), jax in the interpreter's site-packages
#   venv     a venv made with --system-site-packages, jax in the interpreter's site-packages
#   layered  a venv whose .pth file (after jaxmpi's) adds another site directory holding jax
# The interpreter is "a Python installation with jax": a copy of .venvs/mpich's base Python
# with its standard library and a site-packages of its own (.venvs/mpich's packages, less
# jaxmpi and mpi4py), as a cluster's Python module is. In each, tests/jax_collectives_jobs.py
# jax_first (jax imported first) at 2 ranks on PyPI MPICH must show JAX's collectives
# running over MPI: chosen, and XLA's MPI_Allreduce in JAXMPI_DEBUG's lines.
# Usage: tests/startup_layouts.sh [WHEEL]   (default: dist/'s x86_64 wheel, as ci/setup.sh
#        builds it)
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MPICH="$ROOT/.venvs/mpich"
wheel=${1:-$(compgen -G "$ROOT/dist/jaxmpi-*_$(uname -m).whl" | head -n 1)}
[[ -f $wheel ]] || { echo "FAIL  no jaxmpi wheel (${wheel:-dist/ holds none}): run ci/setup.sh"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/jaxmpi-layouts.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
failed=0

# The interpreter: the base Python's binary copied (a link would make Python find its
# prefix where the link points), its standard library linked, and an empty site-packages.
base=$("$MPICH/bin/python" -c 'import os, sys; print(os.path.realpath(sys._base_executable))')
read -r xy stdlib < <("$base" -c 'import sys, sysconfig; print("%d.%d" % sys.version_info[:2], sysconfig.get_paths()["stdlib"])')
prefix=$work/python
mkdir -p "$prefix/bin" "$prefix/lib/python$xy"
cp "$base" "$prefix/bin/python$xy"
for entry in "$stdlib"/*; do
    case ${entry##*/} in site-packages | dist-packages) ;; *) ln -s "$entry" "$prefix/lib/python$xy/" ;; esac
done
python=$prefix/bin/python$xy
site=$(env -i "$python" -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$site"
for entry in "$MPICH"/lib/python"$xy"/site-packages/*; do
    case ${entry##*/} in jaxmpi | jaxmpi-* | _jaxmpi_startup.* | mpi4py | mpi4py-* | __pycache__) ;;
    *) ln -s "$entry" "$site/" ;;
    esac
done
pip() { env -i HOME="$work" PATH=/usr/bin:/bin "$@" --quiet --disable-pip-version-check --root-user-action=ignore --no-input --no-deps \
    --no-index "$wheel"; }

# check LAYOUT PYTHON [VAR=VALUE...]: where jax and jaxmpi are found, then the job.
check() {
    local layout=$1 py=$2 out rc t0=$SECONDS missing=() text
    shift 2
    local -a env=(env -i "HOME=$work" "PATH=$MPICH/bin:/usr/bin:/bin" "$@")
    # jaxmpi's site directory comes before jax's on sys.path: its .pth ran first.
    out=$("${env[@]}" "$py" -c '
import importlib.util as u, os, sys
def entry(name):
    folder = os.path.dirname(os.path.dirname(u.find_spec(name).origin))
    return sys.path.index(folder), folder
(j, jax), (m, jaxmpi) = entry("jaxlib"), entry("jaxmpi")
print("ORDER", "jaxmpi first" if m < j else "jax first", "| jaxmpi", jaxmpi, "| jaxlib", jax)' 2>&1)
    echo "info  $layout: $out"
    [[ $out == "ORDER jaxmpi first"* ]] || missing+=("(jaxmpi's site directory before jax's)")
    out=$(JAXMPI_CELL_TIMEOUT=90 timeout -k 5 120 "${env[@]}" JAX_PLATFORMS=cpu JAXMPI_DEBUG=1 \
        "JAXMPI_MPI=$MPICH/lib/libmpi.so.12" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        "$MPICH/bin/mpiexec" -n 2 "$py" "$ROOT/tests/jax_collectives_jobs.py" jax_first 2>&1)
    rc=$?
    for text in "RESULT rank 0 right" "RESULT rank 1 right" "COLLECTIVES rank 0 ('mpi'" \
        "COLLECTIVES rank 1 ('mpi'" "rank 0: MPI_Allreduce for XLA (comm " \
        "rank 1: MPI_Allreduce for XLA (comm " "DONE rank 0" "DONE rank 1"; do
        grep -qF -- "$text" <<<"$out" || missing+=("$text")
    done
    ((rc == 0)) || missing+=("(exit 0, not $rc)")
    if ((${#missing[@]} == 0)); then
        echo "pass  $layout: JAX's collectives over MPI ($((SECONDS - t0)) s)"
    else
        echo "FAIL  $layout (exit $rc) lacks: ${missing[*]}"
        grep -v ': MPI_\|: allreduce' <<<"$out" | sed 's/^/      | /' | tail -n 25
        failed=$((failed + 1))
    fi
}

userbase=$work/userbase
pip env "PYTHONUSERBASE=$userbase" "$python" -m pip install --user
check user "$python" "PYTHONUSERBASE=$userbase"

env -i "$python" -m venv --without-pip --system-site-packages "$work/venv"
pip "$work/venv/bin/python" -m pip install # pip itself from the interpreter's site-packages
check venv "$work/venv/bin/python"

env -i "$python" -m venv --without-pip "$work/layered"
pip "$python" -m pip --python "$work/layered/bin/python" install
layered_site=$(env -i "$work/layered/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "$site" >"$layered_site/layer.pth" # after _jaxmpi_startup.pth: '_' sorts before 'l'
check layered "$work/layered/bin/python"

echo "$failed failed"
((failed == 0))
