#!/usr/bin/env bash
# benches/setup_mpiwrapper.sh -- the stock MPIwrapper plug-in: .venvs/bench-mpiwrapper.
#
# Builds eschnett/MPIwrapper, the plug-in that jaxlib's bundled MPItrampoline (5.3.1) loads
# through MPITRAMPOLINE_LIB, against PyPI's MPICH wheel in .venvs/mpich (its mpicc/mpicxx),
# so that benches/bench_jax_collectives.py can compare jaxmpi's plug-in with the stock one
# over the same libmpi. Result: .venvs/bench-mpiwrapper/lib/libmpiwrapper.so (path printed).
#
# Usage: benches/setup_mpiwrapper.sh [SOURCE]
#   SOURCE: an MPIwrapper git repository (tag $TAG is taken with `git archive`) or a plain
#   source folder (copied as is); default: the mirror below (there is no network here).
# Idempotent: a marker file records what was built; a second run only prints the path.
# cmake comes from PyPI into the same venv. Needs gcc/g++ (mpicc's "cc"/"c++") and make.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="${1:-/work/.mirror/eschnett+MPIwrapper/repo}"
VENV="$ROOT/.venvs/bench-mpiwrapper"
MPICH="$ROOT/.venvs/mpich"
LIB="$VENV/lib/libmpiwrapper.so"

# MPItrampoline 5.3.1 requires MPI ABI 2.x with x >= 9 (same major, minor at least 9).
# v2.11.0 is MPIwrapper's newest release (2024-05) and provides MPI ABI 2.10.0 (v2.10.x
# provide 2.9.0), so it has every name MPItrampoline 5.3.1 resolves.
TAG="v2.11.0"
CMAKE="cmake==4.4.5"

want="MPIwrapper $TAG from $SRC, $CMAKE, $MPICH"
if [[ -f $LIB && -f $VENV/.bench-setup && "$(cat "$VENV/.bench-setup")" == "$want" ]]; then
    echo "$LIB"
    exit 0
fi
echo "bench: building $VENV (MPIwrapper from $SRC, with mpich's mpicc)" >&2
[[ -x $MPICH/bin/mpicc ]] || { echo "bench: $MPICH/bin/mpicc not found" >&2; exit 1; }
python3 -m venv --clear "$VENV"
"$VENV/bin/python" -m pip --quiet --disable-pip-version-check --no-input install "$CMAKE"

src="$VENV/src/MPIwrapper"
mkdir -p "$src"
if [[ -f $SRC/CMakeLists.txt ]]; then
    cp -a "$SRC/." "$src/"
else
    git -C "$SRC" archive "$TAG" | tar -x -C "$src"
fi
abi() { sed -n "s/^#define MPIABI_VERSION_$1 \([0-9]*\)$/\1/p" "$src/mpiabi/mpiabi.h"; }
if [[ "$(abi MAJOR)" != 2 || "$(abi MINOR)" -lt 9 ]]; then
    echo "bench: $SRC provides MPI ABI $(abi MAJOR).$(abi MINOR); MPItrampoline needs 2.x, x >= 9" >&2
    exit 1
fi

# PyPI's MPICH has no Fortran (no mpif.h, no mpi_*_ symbols) and MPIwrapper has no option
# to leave Fortran out, so: drop the Fortran language, source and MPI component from the
# build, drop the C wrappers of MPI's Fortran functions, and define an empty
# mpiwrapper_export_fortran_constants_ (MPItrampoline calls it unconditionally; jaxlib's
# is built without Fortran and reads no Fortran constants).
patch -d "$src" -p1 --quiet <<'EOF'
--- a/CMakeLists.txt
+++ b/CMakeLists.txt
@@ -4,5 +4,5 @@
   VERSION 2.11.0
   DESCRIPTION "MPI wrapper"
-  LANGUAGES C CXX Fortran
+  LANGUAGES C CXX
   )
 
@@ -81,11 +81,4 @@
   src/mpiabi_defn_functions_c.h
   src/mpiabi_defn_functions_fortran.h
-  # *** Fortran ***
-  # source file
-  src/mpiwrapper.f
-  # header files
-  mpiabi/mpiabif.h
-  # generated source files
-  src/mpiabi_defn_constants_fortran.h
   )
 # set_target_properties(mpiwrapper PROPERTIES
@@ -95,5 +88,5 @@
   mpiwrapper
   PRIVATE mpiabi ${CMAKE_CURRENT_BINARY_DIR}/mpiabi ${CMAKE_CURRENT_BINARY_DIR}/src)
-target_link_libraries(mpiwrapper PRIVATE MPI::MPI_CXX MPI::MPI_Fortran)
+target_link_libraries(mpiwrapper PRIVATE MPI::MPI_CXX)
 
 if(APPLE)
--- a/src/mpiwrapper.cxx
+++ b/src/mpiwrapper.cxx
@@ -121,7 +121,9 @@
 #include "mpiabi_defn_constants_c.h"
 #include "mpiabi_defn_functions_c.h"
-#include "mpiabi_defn_functions_fortran.h"
 }
 
+// No Fortran: MPItrampoline calls this unconditionally.
+extern "C" void mpiwrapper_export_fortran_constants_() {}
+
 // Handle the remaining functions manually
 
EOF

build="$VENV/build"
"$VENV/bin/cmake" -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER="$MPICH/bin/mpicc" -DCMAKE_CXX_COMPILER="$MPICH/bin/mpicxx" \
    -DMPIEXEC_EXECUTABLE="$MPICH/bin/mpiexec" \
    -DCMAKE_INSTALL_PREFIX="$VENV" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
"$VENV/bin/cmake" --build "$build" --parallel "$(nproc)" >/dev/null
"$VENV/bin/cmake" --install "$build" >/dev/null

# The version/start-up names MPItrampoline reads, and the MPIABI_/MPIXABI_ names it resolves
# (634 for jaxlib's MPItrampoline 5.3.1: 631 + 3; v2.11.0 exports 631 + 4).
names=$(nm -D --defined-only "$LIB" | awk '{print $3}')
for name in mpiwrapper_version_major mpiabi_version_major mpiabi_version_minor \
    mpiabi_version_patch mpiwrapper_export_fortran_constants_; do
    grep -qx "$name" <<<"$names" || { echo "bench: $LIB lacks $name" >&2; exit 1; }
done
echo "bench: $LIB exports $(grep -c '^MPIABI_' <<<"$names") MPIABI_ and" \
    "$(grep -c '^MPIXABI_' <<<"$names") MPIXABI_ names" >&2
printf '%s' "$want" >"$VENV/.bench-setup"
echo "$LIB"
