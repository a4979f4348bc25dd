#!/usr/bin/env bash
# ci/docs.sh -- builds the documentation site (docs/ -> docs/_build/html) and checks it:
#   1. installs what it needs, idempotently (a second run checks and moves on): the venv
#      .venvs/docs (pinned Sphinx, MyST, furo, matplotlib, and what `import jaxmpi` needs:
#      JAX, PyPI's MPICH, the jaxmpi wheel of dist/), Debian's chromium; where the wheel
#      or .venvs/mpich is missing, or the wheel is older than python/jaxmpi, ci/setup.sh
#      (without the trixie chroot) builds them;
#   2. the plots, by the benchmarks' own plotting code (benches/plots.py) from the output
#      committed in benches/results/;
#   3. sphinx-build -W --keep-going: a warning fails the build (a link or reference to a
#      page, heading or API entry that does not exist is one, and so is a public name
#      whose docstring lacks a section the reference promises: docs/_ext/jaxmpi_docs.py);
#      the API is read from the installed jaxmpi's docstrings. Not nitpicky (-n): the
#      signatures' types are JAX's (jax.Array, jax.typing.ArrayLike), whose Sphinx
#      inventory is on JAX's site, which CI cannot reach; -n fails on those alone;
#   4. every internal link and anchor of the built site resolves (ci/docs_check.py links);
#   5. every example (mpirun blocks) runs under mpirun -n 2 on .venvs/mpich, its printed
#      output compared with the page (ci/docs_examples.py);
#   6. headless Chromium renders the start page, sendrecv's API entry and the performance
#      guide (plots) to docs/_build/screenshots/*.png, checked for blank pages and build
#      errors (ci/docs_check.py screenshots);
#   7. the README's example is the start page's first, which step 5 runs (ci/docs_check.py
#      readme).
# Open docs/_build/html/index.html. Exit status: non-zero if any part failed (each part
# runs even after an earlier one failed, so one run shows every problem).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=ci/setup.sh
source ci/setup.sh # the pins and _setup_* functions; sourcing runs nothing
JAXMPI_SETUP_ROOT=$ROOT
PYTHON=${PYTHON:-python3}
BUILD="$ROOT/docs/_build"
PY="$ROOT/.venvs/docs/bin/python"
failed=()

part() { # part NAME CMD...: runs CMD, prints its wall time, remembers a failure
    local name=$1 t0=$SECONDS
    shift
    echo "docs: $name"
    if "$@"; then
        echo "docs: $name: ok ($((SECONDS - t0))s)"
    else
        echo "docs: $name: FAILED ($((SECONDS - t0))s)"
        failed+=("$name")
    fi
}

# The wheel and .venvs/mpich come from ci/setup.sh; rebuilt only where missing or where
# python/jaxmpi changed since the wheel installed in .venvs/mpich (its docstrings are
# what the reference shows).
wheel_current() {
    local site
    [[ -x .venvs/mpich/bin/mpiexec ]] && compgen -G "dist/jaxmpi-*_$(uname -m).whl" >/dev/null || return 1
    site=$(.venvs/mpich/bin/python -I -c 'import importlib.util as u; print(u.find_spec("jaxmpi").submodule_search_locations[0])' 2>/dev/null) || return 1
    diff -rq --exclude=__pycache__ --exclude='*.so' python/jaxmpi "$site" >/dev/null
}

install() {
    if ! wheel_current; then
        JAXMPI_SKIP_TRIXIE=1 bash ci/setup.sh || return 1
    fi
    local wheel
    wheel=$(compgen -G "dist/jaxmpi-*_$(uname -m).whl") || return 1
    _setup_venv docs bin/sphinx-build "${JAXMPI_DOCS_PINS[@]}" "$JAXMPI_PIN_MPICH" "${JAXMPI_PIN_JAX_NEWEST[@]}" &&
        _setup_install_wheel docs "$ROOT/$wheel" "$PY" &&
        _setup_apt "${JAXMPI_DOCS_APT_PACKAGES[@]}"
}

# Sphinx imports jaxmpi (a 1-rank MPI job of its own): the docs venv's MPICH, JAX on the CPU.
sphinx() {
    rm -rf "$BUILD/html" "$BUILD/doctrees"
    JAX_PLATFORMS=cpu "$ROOT/.venvs/docs/bin/sphinx-build" -W --keep-going -q \
        -b html -d "$BUILD/doctrees" docs "$BUILD/html"
}

t_start=$SECONDS
part "install" install
if [[ ${#failed[@]} -eq 0 ]]; then
    part "plots from benches/results" "$PY" benches/plots.py benches/results docs/_generated/plots
    part "sphinx-build -W" sphinx
    part "internal links and anchors" "$PY" ci/docs_check.py links "$BUILD/html"
    part "examples under mpirun" "$PY" ci/docs_examples.py "$BUILD/html/_examples.json" "$BUILD/examples"
    part "screenshots (headless chromium)" "$PY" ci/docs_check.py screenshots "$BUILD/html" "$BUILD/screenshots"
    part "the README's example is the start page's" "$PY" ci/docs_check.py readme README.md docs/index.md
fi
echo "docs: $((SECONDS - t_start))s in all; site: docs/_build/html/index.html"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "docs: FAILED: ${failed[*]}"
    exit 1
fi
