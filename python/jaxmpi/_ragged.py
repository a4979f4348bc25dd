"""Exchanges whose counts are computed inside `jit`: every one is `ragged_alltoallv`
(MPI_Alltoallv whose row counts and offsets are operands, read by the handler at run
time; core/src/xla/handlers/ragged.rs checks them on every rank before any data moves).

The v-collectives take this path when the caller gives `recv_capacity` (rows): the
result has that many rows, the received rows packed in rank order from row 0, the rest
zeros. A count that does not fit fails every rank with an `MPIError` naming the op, the
ranks and the numbers.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from . import _native
from ._binding import primitives as prim
from ._comm import CommArg, CommInfo, resolve_comm
from ._errors import raise_mpi_errors
from ._requests import apply
from ._token import refuses_token
from ._trees import PyTree, Tree, pack, unpack

# The public op each exchange is built for, as the handler's errors name it: its `origin`
# attribute is an index into the handler's own list.
ORIGINS: tuple[str, ...] = tuple(_native.ragged_origins())


def counts_arg(counts, size: int, what: str, op: str) -> jax.Array:
    """Counts or offsets as an int32/int64 array of one entry per rank (may be traced)."""
    try:
        values = jnp.asarray(counts)
    except TypeError:
        raise TypeError(f"jaxmpi.{op}: {what} must be an integer array, got {counts!r}") from None
    if not jnp.issubdtype(values.dtype, jnp.integer):
        raise TypeError(f"jaxmpi.{op}: {what} must be integers, got dtype {values.dtype}")
    if values.shape != (size,):
        raise ValueError(f"jaxmpi.{op}: {what} must have shape ({size},), got {values.shape}")
    return values if values.dtype in (jnp.int32, jnp.int64) else values.astype(jnp.int32)


def capacity_arg(recv_capacity, op: str) -> int:
    try:
        rows = operator.index(recv_capacity)
    except TypeError:
        raise TypeError(
            f"jaxmpi.{op}: recv_capacity must be a static int (rows of the result), "
            f"got {recv_capacity!r}"
        ) from None
    if rows < 0:
        raise ValueError(f"jaxmpi.{op}: recv_capacity must not be negative, got {rows}")
    return rows


def _starts(counts: jax.Array) -> jax.Array:
    """Blocks back to back: each starts where the one before ends."""
    return jnp.cumsum(counts) - counts


def _rows(x: jax.Array, rows: int) -> jax.Array:
    return jnp.zeros((rows, *x.shape[1:]), x.dtype)


def exchange(x, output, send, recv, c: CommInfo, op: str, tree: int = 0) -> jax.Array:
    """`send`, `recv`: (offsets, counts) of each rank's block, in rows, on this rank;
    `tree`: the fingerprint of the pytree `x` packs (`_trees.py`)."""
    if x.ndim == 0:
        raise ValueError(f"jaxmpi.{op}: x must have a leading axis of rows, got a scalar")
    (y,) = apply(
        prim.ragged_alltoallv,
        x,
        output,
        *send,
        *recv,
        comm=c.handle,
        origin=ORIGINS.index(op),
        tree=tree,
    )
    return y


def _one_hot(rank: int, value, like: jax.Array) -> jax.Array:
    return jnp.where(jnp.arange(like.shape[0]) == rank, value, jnp.zeros_like(like))


# The v-ops with counts computed inside jit, on one array (a packed group of a pytree's
# leaves, whose fingerprint is `tree`).


def alltoallv(x, send_counts, recv_counts, capacity: int, c: CommInfo, tree: int) -> jax.Array:
    sc = counts_arg(send_counts, c.size, "send_counts", "alltoallv")
    rc = counts_arg(recv_counts, c.size, "recv_counts", "alltoallv")
    send, recv = (_starts(sc), sc), (_starts(rc), rc)
    return exchange(x, _rows(x, capacity), send, recv, c, "alltoallv", tree)


def allgatherv(x: jax.Array, counts, capacity: int, c: CommInfo, tree: int) -> jax.Array:
    """Rank r's first counts[r] rows go to every rank (its blocks overlap: all start at 0)."""
    n = counts_arg(counts, c.size, "counts", "allgatherv")
    send = (jnp.zeros_like(n), jnp.full_like(n, n[c.rank_value()]))
    return exchange(x, _rows(x, capacity), send, (_starts(n), n), c, "allgatherv", tree)


def _at_root(c: CommInfo, root: int, blocks: tuple, none: tuple) -> tuple:
    """`blocks` at the root, `none` elsewhere: chosen at run time on a MeshComm."""
    if c.rank is not None:
        return blocks if c.rank == root else none
    here = c.rank_value() == root
    return tuple(jnp.where(here, b, z) for b, z in zip(blocks, none))


def gatherv(x: jax.Array, counts, root: int, capacity: int, c: CommInfo, tree: int):
    """The root's result; None elsewhere, where the op returns `x` (on a MeshComm, every
    device has a result: zeros away from the root)."""
    n = counts_arg(counts, c.size, "counts", "gatherv")
    none = jnp.zeros_like(n)
    send = (none, _one_hot(root, n[c.rank_value()], n))
    recv = _at_root(c, root, (_starts(n), n), (none, none))
    away = c.rank is not None and c.rank != root
    y = exchange(x, _rows(x, 0 if away else capacity), send, recv, c, "gatherv", tree)
    return None if away else y


def scatterv(x: jax.Array, counts, root: int, capacity: int, c: CommInfo, tree: int) -> jax.Array:
    n = counts_arg(counts, c.size, "counts", "scatterv")
    none = jnp.zeros_like(n)
    send = _at_root(c, root, (_starts(n), n), (none, none))
    recv = (none, _one_hot(root, n[c.rank_value()], n))
    return exchange(x, _rows(x, capacity), send, recv, c, "scatterv", tree)


@refuses_token
@raise_mpi_errors()
def ragged_all_to_all(
    operand: PyTree,
    output: PyTree,
    input_offsets: ArrayLike,
    send_sizes: ArrayLike,
    output_offsets: ArrayLike,
    recv_sizes: ArrayLike,
    *,
    comm: CommArg = None,
) -> PyTree:
    """`jax.lax.ragged_all_to_all` over the ranks of `comm`, also on the CPU.

    Each rank sends slices of rows of `operand` to the other ranks (peer index = rank) and
    writes the slices it receives into `output`, at offsets the senders choose; sizes and
    offsets may be computed inside `jit`. The four index arrays have `k * size` entries, k
    slices per rank: entry `i` describes the slice for (and from) rank `i // k`. One MPI
    exchange per slice index (MPI_Alltoallv with counts read at run time, checked on every
    rank before data moves), plus one alltoall of the output offsets.

    Args:
        operand: The rows to send, any shape with a leading axis. Or a pytree of them.
        output: The result before anything arrives: the same dtype and shape after the
            leading axis as `operand`; its rows nobody writes are kept. Or a pytree of
            `operand`'s structure.
        input_offsets: Int array, `k * size` entries: where slice `i` starts in `operand`.
        send_sizes: Int array: rows of slice `i`, sent to rank `i // k`.
        output_offsets: Int array: the row of the receiver's `output` where slice `i` lands.
        recv_sizes: Int array: rows of the slice received from rank `i // k`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        `output` with the received slices written in. Slices of different indices landing on
        the same rows are written in index order: the last one stays. For a pytree, the same
        structure, each leaf's result in its place.

    Derivative:
        Linear in `operand` and `output`; the offsets and sizes carry no derivative.
        Reverse mode runs the reverse exchange: each received row's cotangent goes back to
        the row it came from, and `output` keeps the cotangent of the rows nobody wrote.
        `vmap`: one exchange for the batch (one per entry where the sizes differ along it).

    Raises:
        TypeError: `operand` or `output` is not an array of a supported dtype; an index
            array is not integers; `comm` is no communicator.
        ValueError: `operand` and `output` differ in dtype or shape after the leading axis;
            the index arrays do not have `k * size` entries (k >= 1); `comm` is freed,
            `COMM_NULL` or an intercommunicator; or the op is in a program over several
            devices outside `shard_map`.
        NotImplementedError: GPU arrays (the sizes are read by the CPU at run time).
        RuntimeError: `token` was passed.
        MPIError: MPI failed, or a slice does not fit its source or destination (named on
            every rank). Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            x = jnp.arange(3) + 10 * rank  # 1 row to rank 0, 2 rows to rank 1
            y = jaxmpi.ragged_all_to_all(
                x,
                jnp.full(4, -1),
                input_offsets=jnp.array([0, 1]),
                send_sizes=jnp.array([1, 2]),
                output_offsets=jnp.array([rank, 2 * rank]),  # where they land there
                recv_sizes=jnp.array([1, 1]) * (rank + 1),
            )
            print(rank, y)

        .. output::

            0 [ 0 10 -1 -1]
            1 [ 1  2 11 12]
    """
    op = "ragged_all_to_all"
    c = resolve_comm(comm, op)
    operands, outputs = Tree(operand, op, "operand"), Tree(output, op, "output")
    if not operands.same_structure(outputs):
        raise ValueError(
            f"jaxmpi.{op}: operand and output must be pytrees of the same structure, got "
            f"{jax.tree_util.tree_structure(operand)} and {jax.tree_util.tree_structure(output)}"
        )
    for x, out, leaf in zip(operands.leaves, outputs.leaves, operands.paths):
        if x.ndim == 0 or out.shape[1:] != x.shape[1:] or out.dtype != x.dtype:
            raise ValueError(
                f"jaxmpi.{op}: {leaf + ': ' if leaf else ''}operand and output must be arrays "
                "of the same dtype and the same shape after the leading axis, got "
                f"{x.dtype}{list(x.shape)} and {out.dtype}{list(out.shape)}"
            )
    arrays = (input_offsets, send_sizes, output_offsets, recv_sizes)
    names = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")
    length = jnp.shape(input_offsets)[0] if jnp.ndim(input_offsets) == 1 else 0
    if length == 0 or length % c.size:
        raise ValueError(
            f"jaxmpi.{op}: input_offsets must have k * {c.size} entries (k slices per rank, "
            f"k >= 1), got shape {jnp.shape(input_offsets)}"
        )
    k = length // c.size
    io, ss, oo, rs = (
        counts_arg(a, length, n, op).reshape(c.size, k) for a, n in zip(arrays, names)
    )
    # Where this rank's slices land is what their senders say: one alltoall of the offsets.
    (landing,) = prim.alltoall.bind(oo, comm=c.handle)
    fingerprint, result = operands.fingerprint(1), list(outputs.leaves)
    # The groups of the operands and of the outputs are the same: same dtypes and rows.
    for group in operands.groups(1):
        x = pack([operands.leaves[i] for i in group], 1)
        landed = [outputs.leaves[i] for i in group]
        out = pack(landed, 1)
        for j in range(k):
            send, recv = (io[:, j], ss[:, j]), (landing[:, j], rs[:, j])
            out = exchange(x, out, send, recv, c, op, fingerprint)
        for i, piece in zip(group, unpack(out, landed, 1)):
            result[i] = piece
    return outputs.rebuild(result)
