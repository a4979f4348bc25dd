#!/usr/bin/env bash
# jaxmpi must load MPI (and CUDA) only at run time via dlopen, so no artifact may have a
# DT_NEEDED entry on them; otherwise it would only start where that exact soname is
# installed. Nor on libpython: the abi3 extension takes its symbols from the interpreter
# that loads it, whatever its version. Checked: every ELF file directly in target/release
# (the probe, any cdylib *.so) and the extension module as shipped, unpacked from each
# wheel in dist/ (ci/wheels.sh).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
unpacked=$(mktemp -d "${TMPDIR:-/tmp}/jaxmpi-needed.XXXXXX") || exit 1
trap 'rm -rf "$unpacked"' EXIT
n=0 bad=0 files=()
for f in "$ROOT"/dist/*.whl; do
    [[ -e $f ]] && "$ROOT/.venvs/mpich/bin/python" -m zipfile -e "$f" "$unpacked/$(basename "$f")"
done
while IFS= read -r -d '' f; do
    # Only ELF files (target/release also holds *.d dep-info files).
    [[ $(head -c 4 "$f" | od -An -c | tr -d ' ') == '177ELF' ]] && files+=("$f")
done < <(
    find "$ROOT/target/release" -maxdepth 1 -type f \( -perm -u+x -o -name '*.so' \) -print0 2>/dev/null
    find "$unpacked" -type f -name '*.so' -print0
)
if ((${#files[@]} == 0)); then
    echo "no ELF artifacts found under target/release (did the build fail?)"
    exit 1
fi
for f in "${files[@]}"; do
    n=$((n + 1))
    needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | tr '\n' ' ')
    shown=${f#"$ROOT"/}
    shown=${shown#"$unpacked"/}
    # libmpi* also covers libmpi_abi; libcuda* also covers libcudart.
    if grep -qE '(^| )lib(mpi|mpich|cuda|cudart|python)[^ ]*' <<<"$needed"; then
        echo "BAD  $shown: NEEDED $needed"
        bad=$((bad + 1))
    else
        echo "ok   $shown: NEEDED $needed"
    fi
done
echo "$n artifact(s) checked, $bad linked against MPI/CUDA/Python"
((bad == 0))
