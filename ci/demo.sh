#!/usr/bin/env bash
# ci/demo.sh -- the shallow-water demo (examples/shallow_water.py) on 2 ranks, from a
# fresh machine: sets everything up (ci/setup.sh), adds the demo's plotting and progress
# bar packages, runs 10 model days and says where the picture is.
#
#   ./ci/demo.sh                      # extra arguments go to the example, e.g.
#   ./ci/demo.sh --days 3 --nx 200 --ny 100
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$ROOT/.venvs/mpich"

bash "$ROOT/ci/setup.sh"
# shellcheck source=setup.sh source-path=SCRIPTDIR
source "$ROOT/ci/setup.sh" # the pins; sourcing runs nothing
# The example needs them only for the bar and the PNG; pip does nothing if they are there.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    "tqdm==4.70.1" "$JAXMPI_PIN_MATPLOTLIB"

mkdir -p "$ROOT/target/demo"
png="$ROOT/target/demo/shallow_water.png"
VIRTUAL_ENV=$venv PATH="$venv/bin:$PATH" JAX_PLATFORMS=cpu \
    timeout 1200 "$venv/bin/mpiexec" -n 2 "$venv/bin/python" \
    "$ROOT/examples/shallow_water.py" --out "$png" "$@"
echo "demo: the final surface height and currents are in $png"
