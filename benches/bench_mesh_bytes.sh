#!/usr/bin/env bash
# Bytes a device rank receives per reduction of 1 MiB (262,144 float32), JAX's psum and
# psum_scatter through jaxmpi's pass and jaxmpi.allreduce on a MeshComm, at 4, 8 and 16
# device ranks in two layouts each, as Open MPI's own monitoring counts them (OMPI_MCA_pml_monitoring_enable=2:
# every byte its point-to-point layer delivers, the collectives' included; per process,
# divided here by its devices). Each case runs 1 and 1 + 4 calls: the difference, over 4,
# is one call's, without the start (communicators made at the first call). The MeshComm in
# both reduction modes (JAXMPI_MESH_REDUCTIONS; the pass's ordered mode is the same code),
# and its scan (route meshcomm_scan). The goal: no growth with the device ranks.
# BEFORE=REV adds a column: the same cases with REV's extension (built in a worktree,
# builds.sh), in the same run.
# Usage: [CASES='psum fast;...'] [BEFORE=REV] benches/bench_mesh_bytes.sh [LAYOUT...]
#        (default layouts: 4x1 2x2 4x2 2x4 8x2 4x4)
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh
source "$ROOT/ci/matrix.sh"
layouts=("$@")
((${#layouts[@]})) || layouts=(4x1 2x2 4x2 2x4 8x2 4x4)
# CASES: "route mode" pairs, ;-separated.
IFS=';' read -r -a cases <<<"${CASES:-psum fast;psum_scatter fast;meshcomm fast;meshcomm ordered}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=builds.sh
source "$ROOT/benches/builds.sh"
# shellcheck source=monitored.sh
source "$ROOT/benches/monitored.sh"
# With BEFORE, both columns load their builds the same way: the working tree's and REV's.
before_site= after_site=
if [[ -n ${BEFORE:-} ]]; then
    before_site=$(site "$(extension "$BEFORE")" before)
    after_site=$(site "$(extension "")" after)
fi

# received LAYOUT ROUTE MODE CALLS [SITE]: bytes the processes received in all, with
# SITE's jaxmpi in place of the installed one where given.
received() {
    local layout=$1 route=$2 mode=$3 calls=$4 site=${5:-}
    monitored_bytes "${layout%x*}" ${site:+"PYTHONPATH=$site"} \
        "XLA_FLAGS=--xla_force_host_platform_device_count=${layout#*x}" \
        JAXMPI_MESH_REDUCTIONS="$mode" -- \
        "$ROOT/.venvs/openmpi/bin/python" "$ROOT/benches/bench_mesh_bytes.py" "$route" "$calls"
}

# per_call LAYOUT ROUTE MODE [SITE]: bytes a device rank receives per call.
per_call() {
    local ranks=$((${1%x*} * ${1#*x})) once five
    once=$(received "$1" "$2" "$3" 1 "${4:-}")
    five=$(received "$1" "$2" "$3" 5 "${4:-}")
    echo $(((five - once) / 4 / ranks))
}

head="| device ranks | layout | route | reductions | bytes received per device rank and call |"
[[ -n $before_site ]] && head="| device ranks | layout | route | reductions | working tree |"
rule="|---:|---|---|---|---:|"
if [[ -n $before_site ]]; then
    head="$head $BEFORE (before) |"
    rule="$rule---:|"
fi
echo "$head"
echo "$rule"
for layout in "${layouts[@]}"; do
    ranks=$((${layout%x*} * ${layout#*x}))
    for case in "${cases[@]}"; do
        read -r route mode <<<"$case"
        row="| $ranks | $layout | $route | $mode | $(per_call "$layout" "$route" "$mode" "$after_site") |"
        if [[ -n $before_site ]]; then
            row="$row $(per_call "$layout" "$route" "$mode" "$before_site") |"
        fi
        echo "$row"
    done
done
