#!/usr/bin/env bash
# Bytes a rank receives while jaxmpi starts (`import jaxmpi`, then
# `jaxmpi.distributed.initialize()`), at 4, 8 and 16 ranks of PyPI Open MPI, as Open MPI's
# own monitoring counts them (every byte its point-to-point layer delivers, collectives'
# included), with the working tree's build and, where BEFORE=REV is given, REV's, in the
# same run (builds.sh). What jaxmpi's start-up exchanges must not grow with the ranks.
# Usage: [BEFORE=REV] benches/bench_startup_bytes.sh [RANKS...]
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh
source "$ROOT/ci/matrix.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=builds.sh
source "$ROOT/benches/builds.sh"
# shellcheck source=monitored.sh
source "$ROOT/benches/monitored.sh"
sizes=("$@")
((${#sizes[@]})) || sizes=(4 8 16)
labels=(after) sites=("$(site "$(extension "")" after)")
if [[ -n ${BEFORE:-} ]]; then
    labels+=("$BEFORE (before)") sites+=("$(site "$(extension "$BEFORE")" before)")
fi

# received RANKS SITE: bytes per rank.
received() {
    monitored_bytes "$1" "PYTHONPATH=$2" -- "$ROOT/.venvs/openmpi/bin/python" -c \
        "import jaxmpi, jaxmpi.distributed; jaxmpi.distributed.initialize()" |
        awk -v n="$1" '{ print int($1 / n) }'
}

printf '| ranks |'; printf ' %s |' "${labels[@]}"; echo
printf '|---:|'; printf -- '---:|%.0s' "${labels[@]}"; echo
for n in "${sizes[@]}"; do
    row="| $n |"
    for site in "${sites[@]}"; do
        row="$row $(received "$n" "$site") |"
    done
    echo "$row"
done
