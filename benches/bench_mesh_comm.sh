#!/usr/bin/env bash
# benches/bench_mesh_comm.py at 4 processes x 1 device, 2 x 2 and 1 x 4, on PyPI MPICH (or
# the build named), the layouts taken in turn --repeats times; a table of the best time
# per step of each case, and the ratios the MeshComm issue asks about: 2 x 2 against
# 4 x 1 (MeshComm, and jaxmpi.sendrecv on the MPI communicator), and ppermute over gloo
# (a job of its own) against MeshComm in the same layout. The layouts are separate jobs:
# their ratios are across runs, on the same idle machine, alternating. A job that fails
# is named with its output's end, and the script exits 1. BEFORE=REV runs REV's build too
# (built in a worktree, builds.sh), alternating with the working tree's in every repeat,
# and adds their ratios.
# Usage: [BEFORE=REV] benches/bench_mesh_comm.sh [--build pypi-mpich-5] [--repeats 3]
#        [--layouts "4x1 2x2 1x4"] [BENCH ARGS...]
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh
source "$ROOT/ci/matrix.sh"
build=pypi-mpich-5 repeats=3 layouts="4x1 2x2 1x4"
while (($#)); do
    case $1 in
    --build) build=$2 && shift 2 ;;
    --repeats) repeats=$2 && shift 2 ;;
    --layouts) layouts=$2 && shift 2 ;;
    *) break ;;
    esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=$work/results
status=0
# shellcheck source=builds.sh
source "$ROOT/benches/builds.sh"
# label=site pairs: the installed build alone, or REV's and the working tree's.
declare -A sites=([installed]=)
if [[ -n ${BEFORE:-} ]]; then
    sites=([before]=$(site "$(extension "$BEFORE")" before) [after]=$(site "$(extension "")" after))
fi
for ((i = 0; i < repeats; i++)); do
    for layout in $layouts; do
        # gloo's ppermute in a job of its own: jaxmpi refuses a MeshComm beside gloo.
        routes=jaxmpi
        ((${layout%x*} > 1)) && routes="jaxmpi gloo"
        for label in "${!sites[@]}"; do
            site=${sites[$label]}
            for route in $routes; do
                if ! JAXMPI_CELL_TIMEOUT=600 matrix_exec "$build" "${layout%x*}" JAX_PLATFORMS=cpu \
                    "XLA_FLAGS=--xla_force_host_platform_device_count=${layout#*x}" \
                    ${site:+"PYTHONPATH=$site"} -- \
                    "$ROOT/.venvs/${JAXMPI_MATRIX_VENV[$build]}/bin/python" \
                    "$ROOT/benches/bench_mesh_comm.py" --collectives "$route" "$@" >"$work/job" 2>&1
                then
                    echo "bench_mesh_comm: $label $layout --collectives $route failed:" >&2
                    tail -n 15 "$work/job" >&2
                    status=1
                fi
                grep '^RESULT' "$work/job" | sed "s/^/$label /" >>"$results"
            done
        done
    done
done
"$ROOT/.venvs/mpich/bin/python" - "$results" "$build" "$repeats" "${BEFORE:-}" <<'PY'
import collections, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, _, layout, halo, *case, micros = line.split()
    runs[(label, int(halo), layout, " ".join(case))].append(float(micros))
if sys.argv[4]:
    print(f"{sys.argv[4]} (before) and the working tree (after), alternating: µs per step, each run")
    print("| halo bytes | layout | case | before | after | after / before (best) |")
    print("|---:|---|---|---|---|---:|")
    for (label, halo, layout, case) in sorted(k for k in runs if k[0] == "after"):
        b, a = runs[("before", halo, layout, case)], runs[("after", halo, layout, case)]
        show = lambda xs: ", ".join(f"{x:.1f}" for x in xs)
        print(f"| {halo} | {layout} | {case} | {show(b)} | {show(a)} | {min(a) / min(b):.2f}x |")
    print()
label = "after" if sys.argv[4] else "installed"
best = {k[1:]: min(v) for k, v in runs.items() if k[0] == label}
if not {"4x1", "2x2", "1x4"} <= {k[1] for k in best}:
    sys.exit(0)  # the layout ratios need all three layouts
print(f"{sys.argv[2]}, best of {sys.argv[3]} runs per layout, µs per halo-exchange step")
print("| halo bytes | layout | case | µs per step |")
print("|---:|---|---|---:|")
for (halo, layout, case), micros in sorted(best.items()):
    print(f"| {halo} | {layout} | {case} | {micros:.1f} |")
print()
print("| halo bytes | 2x2 MeshComm / 4x1 MeshComm | 2x2 MeshComm / 4x1 MPI comm | 2x2 gloo / 2x2 MeshComm | 1x4 MeshComm / 4x1 MeshComm |")
print("|---:|---:|---:|---:|---:|")
for halo in sorted({k[0] for k in best if k[2] == "MeshComm sendrecv"}):
    m22, m41 = best[(halo, "2x2", "MeshComm sendrecv")], best[(halo, "4x1", "MeshComm sendrecv")]
    c41, g22 = best[(halo, "4x1", "MPI comm sendrecv")], best[(halo, "2x2", "ppermute over gloo")]
    m14 = best[(halo, "1x4", "MeshComm sendrecv")]
    print(f"| {halo} | {m22 / m41:.2f}x | {m22 / c41:.2f}x | {g22 / m22:.1f}x | {m14 / m41:.2f}x |")
print()
print("| allreduce bytes per device | 4x1 MeshComm / 4x1 MPI comm | 2x2 MeshComm / 4x1 MPI comm | 1x4 MeshComm / 4x1 MPI comm |")
print("|---:|---:|---:|---:|")
for size in sorted({k[0] for k in best if k[2] == "MeshComm allreduce"}):
    ref = best[(size, "4x1", "MPI comm allreduce")]
    ratios = [best[(size, layout, "MeshComm allreduce")] / ref for layout in ("4x1", "2x2", "1x4")]
    print(f"| {size} | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |")
PY
exit "$status"
