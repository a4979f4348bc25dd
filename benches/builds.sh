# Sourced by the benchmarks that compare builds of jaxmpi in one run (bench_callgrind.sh,
# bench_mesh_bytes.sh): a revision's extension, built in a worktree of its own, and a
# site folder that loads it in place of the installed package.
# Needs ROOT (the checkout) and work (a scratch folder) set by the caller. A revision's
# tree stays in $TMPDIR/jaxmpi-trees, built once for every benchmark that asks for it.

# extension REV: the folder of REV's tree, its extension built ("" for the working tree;
# a folder: that tree as it is, e.g. a copy of the working tree with a change taken out).
extension() {
    local rev=$1 tree=$ROOT
    if [[ -d $rev ]]; then
        tree=$(cd "$rev" && pwd)
    elif [[ -n $rev ]]; then
        tree=${TMPDIR:-/tmp}/jaxmpi-trees/tree-$(git -C "$ROOT" rev-parse --short "$rev")
        mkdir -p "$(dirname "$tree")"
        [[ -d $tree ]] || git -C "$ROOT" worktree add --detach "$tree" "$rev" >/dev/null 2>&1
    fi
    (cd "$tree" && CARGO_TARGET_DIR=$tree/target cargo build --release -p jaxmpi-python -q) >&2
    echo "$tree"
}

# site TREE NAME: a folder to put first on PYTHONPATH, holding TREE's Python package and
# extension; NAME tells sites of one tree apart.
site() {
    local tree=$1 site=$work/site-$(basename "$1")-$2
    rm -rf "$site" && mkdir -p "$site"
    cp -r "$tree/python/jaxmpi" "$site/"
    cp "$tree/target/release/lib_native.so" "$site/jaxmpi/_native.abi3.so"
    echo "$site"
}
