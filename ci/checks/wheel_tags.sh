#!/usr/bin/env bash
# The wheels of dist/ (ci/wheels.sh), one for x86_64 and one for aarch64, and the sdist.
# Each wheel: named abi3 for CPython >= 3.10; the manylinux tags in its name (legacy
# aliases such as manylinux2014 = manylinux_2_17 included) all name the glibc that
# `auditwheel show` finds it needs, given its versioned symbols and the libraries it
# links (a library outside the manylinux policy makes that "linux_<arch>": fails). A
# lower claim would let pip install it where it cannot load, a higher one refuse
# machines it runs on. Its size printed, and below WHEEL_MAX_BYTES.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Today's wheels are ~0.5 MB (a ~1.2 MB extension); a build that kept its debug info (the
# release profile's debug = 1, an extension of ~15 MB) packs to ~3.3 MB (measured). The
# bound leaves room to grow.
WHEEL_MAX_BYTES=$((2 * 1024 * 1024))
bad=0
for arch in x86_64 aarch64; do
    n=$(compgen -G "$ROOT/dist/jaxmpi-*_$arch.whl" | wc -l)
    ((n == 1)) || { echo "BAD  dist/ holds $n $arch wheels, not 1"; bad=$((bad + 1)); }
done
compgen -G "$ROOT/dist/jaxmpi-*.tar.gz" >/dev/null || { echo "BAD  no sdist in dist/"; bad=$((bad + 1)); }
for f in "$ROOT"/dist/*.whl; do
    [[ -e $f ]] || continue
    name=$(basename "$f")
    if ! shown=$("$ROOT/.venvs/wheels/bin/auditwheel" show "$f"); then
        echo "BAD  $name: auditwheel show failed"
        bad=$((bad + 1))
        continue
    fi
    echo "$shown"
    possible=$(tr -s ' \n' ' ' <<<"$shown" |
        sed -n 's/.*consistent with the following platform tag: "\([^"]*\)".*/\1/p')
    if [[ $name != jaxmpi-*-cp310-abi3-*.whl ]]; then
        echo "BAD  $name: not tagged cp310-abi3"
        bad=$((bad + 1))
    fi
    plat=${name%.whl}
    for tag in $(tr . ' ' <<<"${plat##*-}"); do
        tag=$(sed -e 's/^manylinux2014_/manylinux_2_17_/' -e 's/^manylinux2010_/manylinux_2_12_/' \
            -e 's/^manylinux1_/manylinux_2_5_/' <<<"$tag")
        if [[ $tag != "$possible" ]]; then
            echo "BAD  $name: claims $tag, auditwheel says it can have ${possible:-nothing}"
            bad=$((bad + 1))
        fi
    done
    size=$(stat -c %s "$f")
    echo "$name: auditwheel's tag ${possible:-none}, $size bytes (bound $WHEEL_MAX_BYTES)"
    if ((size > WHEEL_MAX_BYTES)); then
        echo "BAD  $name: $size bytes, above the bound"
        bad=$((bad + 1))
    fi
done
echo "$bad problem(s)"
((bad == 0))
