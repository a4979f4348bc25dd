#!/usr/bin/env bash
# benches/bench_mesh_comm.py at 4 processes x 1 device, 2 x 2 and 1 x 4, on PyPI MPICH (or
# the build named), the layouts taken in turn --repeats times; a table of the best time
# per step of each case, and the ratios the MeshComm issue asks about: 2 x 2 against
# 4 x 1 (MeshComm, and jaxmpi.sendrecv on the MPI communicator), and ppermute over gloo
# against MeshComm in the same layout. The layouts are separate jobs: their ratios are
# across runs, on the same idle machine, alternating.
# Usage: benches/bench_mesh_comm.sh [--build pypi-mpich-5] [--repeats 3] [BENCH ARGS...]
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../ci/matrix.sh
source "$ROOT/ci/matrix.sh"
build=pypi-mpich-5 repeats=3
while (($#)); do
    case $1 in
    --build) build=$2 && shift 2 ;;
    --repeats) repeats=$2 && shift 2 ;;
    *) break ;;
    esac
done
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ((i = 0; i < repeats; i++)); do
    for layout in 4x1 2x2 1x4; do
        JAXMPI_CELL_TIMEOUT=600 matrix_exec "$build" "${layout%x*}" JAX_PLATFORMS=cpu \
            "XLA_FLAGS=--xla_force_host_platform_device_count=${layout#*x}" -- \
            "$ROOT/.venvs/${JAXMPI_MATRIX_VENV[$build]}/bin/python" \
            "$ROOT/benches/bench_mesh_comm.py" "$@" 2>&1 | grep '^RESULT' >>"$results"
    done
done
"$ROOT/.venvs/mpich/bin/python" - "$results" "$build" "$repeats" <<'PY'
import collections, sys
best = collections.defaultdict(lambda: float("inf"))
for line in open(sys.argv[1]):
    _, layout, halo, *case, micros = line.split()
    key = (int(halo), layout, " ".join(case))
    best[key] = min(best[key], float(micros))
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
