"""Pytrees in every op: the leaves of a tree travel packed, one MPI call per group.

A group is the leaves of one dtype, in the order the tree lists them; each leaf is
flattened (after its leading axis, for the ops whose leading axis is the ranks' or the
rows') and the group's leaves are concatenated into one buffer: one call moves them all,
and the result is sliced back into leaves of the op's result shapes. The packing and the
slicing are XLA's copies, fused into the kernels that make the leaves and read the
results; a leaf of `ALONE` bytes or more (per row, for the row-packed ops) is its own
group instead, moved where it lies, as a single array is: its copies would cost more than
the call they save; and a group closes at `GROUP` bytes (measured in benches/bench_trees.py,
benches/RESULTS.md, "Pytrees").

Everything that makes the grouping is the same on every rank that passes the same
structure (dtypes, and the shapes every rank shares), so the ranks make the same calls.
Each call carries the tree's fingerprint (`signature::Tree` in the core), which checked
mode compares between ranks: two trees that pack into buffers of the same size and dtype
are told apart.

A single array is not packed at all: it is its own group, with fingerprint 0, the call
it always was.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

from ._args import array_arg
from ._requests import Pending, finish, is_starting

#: A JAX pytree: an array, or (nested) lists, tuples and dicts of arrays, or any registered
#: pytree node. Every op takes one wherever it takes an array.
PyTree: TypeAlias = Any

#: Bytes (per row, for row-packed ops) from which a leaf travels alone, where it lies.
ALONE = 1 << 18
#: Bytes (likewise) a group of packed leaves grows to at most: past it, packing more saves
#: no call's cost worth its copies, and a buffer beyond the caches reduces slower.
GROUP = 1 << 20


# What is always one array, never a pytree node.
_ARRAYS = (jax.Array, np.ndarray, int, float, complex)


def _leaf_name(path) -> str:
    return jax.tree_util.keystr(tuple(path))


class Tree:
    """A pytree an op was given, checked: its leaves as JAX arrays of supported dtypes,
    their paths (for errors) and how to rebuild the structure from new leaves."""

    def __init__(self, x: Any, op: str, what: str = "x") -> None:
        if isinstance(x, _ARRAYS):  # the common case, without flattening
            self.treedef, self.bare, self.paths = None, True, [""]
            self.leaves = [array_arg(x, op)]
            return
        flat, self.treedef = jax.tree_util.tree_flatten_with_path(x)
        self.bare = len(flat) == 1 and jax.tree_util.treedef_is_leaf(self.treedef)
        self.paths = ["" if self.bare else f"{what}{_leaf_name(p)}" for p, _ in flat]
        self.leaves = [array_arg(leaf, op, name) for (_, leaf), name in zip(flat, self.paths)]

    def fingerprint(self, keep: int) -> int:
        """The same on every rank passing this structure, 0 for a single array: the leaves'
        paths, dtypes and shapes after the first `keep` axes (those may differ between
        ranks: a v-op's rows, a scatter's rank axis at the root)."""
        if self.bare:
            return 0
        text = ";".join(
            f"{path}:{leaf.dtype.name}{list(leaf.shape[keep:])}"
            for path, leaf in zip(self.paths, self.leaves)
        )
        digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little", signed=True) or 1

    def groups(self, keep: int) -> list[list[int]]:
        """The leaves' indices by call: one list per dtype in order of first appearance,
        a new one once a dtype's reaches GROUP bytes, and a leaf of ALONE bytes or more
        alone (bytes after the first `keep` axes: the same on every rank)."""
        groups: list[list[int]] = []
        open_: dict[Any, tuple[list[int], int]] = {}  # dtype -> (its group, its bytes)
        for i, leaf in enumerate(self.leaves):
            size = _trailing(leaf, keep) * leaf.dtype.itemsize
            if size >= ALONE:
                groups.append([i])
                continue
            group, total = open_.get(leaf.dtype, (None, 0))
            if group is None or total + size > GROUP:
                group, total = [], 0
                groups.append(group)
            group.append(i)
            open_[leaf.dtype] = (group, total + size)
        return groups

    def same_structure(self, other: Tree) -> bool:
        return bool(operator.eq(self.treedef, other.treedef))

    def rebuild(self, leaves: Sequence) -> Any:
        if self.treedef is None:
            return leaves[0]
        return jax.tree_util.tree_unflatten(self.treedef, list(leaves))

    def check(self, check: Callable[[jax.Array, str], None]) -> None:
        """Runs `check(leaf, name)` on every leaf (name: "" for a single array)."""
        for leaf, name in zip(self.leaves, self.paths):
            check(leaf, name)


def _trailing(leaf: jax.Array, keep: int) -> int:
    return math.prod(leaf.shape[keep:])


def pack(leaves: Sequence[jax.Array], keep: int) -> jax.Array:
    """One buffer for the leaves of a group: each flattened after its first `keep` axes
    (which the leaves share), concatenated along the flattened axis. A group of one leaf
    is the leaf itself."""
    if len(leaves) == 1:
        return leaves[0]
    flat = [leaf.reshape(leaf.shape[:keep] + (_trailing(leaf, keep),)) for leaf in leaves]
    return jnp.concatenate(flat, axis=keep)


def unpack(result: jax.Array, leaves: Sequence[jax.Array], keep: int) -> list[jax.Array]:
    """The op's result for each leaf of a group, from the result on its packed buffer:
    the result keeps its own leading axes and ends in the packed axis, which is cut at
    the leaves' sizes and reshaped to each leaf's shape after its first `keep` axes."""
    if len(leaves) == 1:
        return [result]
    lead, at, out = result.shape[:-1], 0, []
    for leaf in leaves:
        n = _trailing(leaf, keep)
        out.append(result[..., at : at + n].reshape(lead + leaf.shape[keep:]))
        at += n
    return out


def each_group(tree: Tree, keep: int, call: Callable[[jax.Array, int], Any]) -> Any:
    """The op on every group of `tree`: `call(packed, fingerprint)` gives its result on the
    packed buffer, or None where the op returns its input (a rooted op's ranks that
    receive nothing), which then gives back the leaves themselves. Returns the result
    with the tree's structure; in starting mode (`_requests.py`), where `call` gives
    `Pending` results, the request, whose wait cuts them into leaves."""
    if tree.bare:  # one array: no packing, no fingerprint
        (leaf,) = tree.leaves
        result = call(leaf, 0)
        if is_starting():
            pending = result
            return finish(lambda received: leaf if pending is None else received(pending))
        return leaf if result is None else result
    fingerprint = tree.fingerprint(keep)
    out = list(tree.leaves)
    pending = []
    for group in tree.groups(keep):
        leaves = [tree.leaves[i] for i in group]
        result = call(pack(leaves, keep), fingerprint)
        if isinstance(result, Pending):
            pending.append((group, leaves, result))
        elif result is not None:
            for i, piece in zip(group, unpack(result, leaves, keep)):
                out[i] = piece
    if not is_starting():
        return tree.rebuild(out)

    def rebuild(received: Callable[[Pending], jax.Array]) -> Any:
        final = list(out)
        for group, leaves, result in pending:
            for i, piece in zip(group, unpack(received(result), leaves, keep)):
                final[i] = piece
        return tree.rebuild(final)

    return finish(rebuild)
