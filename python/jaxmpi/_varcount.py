"""The variable-count collectives: gatherv, allgatherv, scatterv, alltoallv.

Counts are per rank, in rows: entries of the leading axis. Without `recv_capacity` they
are static (known at trace time) and set the result's shape; with it they may be computed
inside jit (`_ragged.py`): the result has `recv_capacity` rows, the received rows packed
in rank order from row 0, the rest zeros, and the operand's first `counts` rows are sent. Rank r's block has `counts[r]` rows; blocks lie back to back in rank order. The
handlers get the same row counts and compute element counts and displacements from the
row size of the buffers they have, so a batched (vmapped) row is just a longer row.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import _ragged
from ._args import check_rank
from ._binding import primitives as prim
from ._comm import CommArg, CommInfo, resolve_comm, trace_rank
from ._errors import raise_mpi_errors
from ._requests import apply
from ._token import refuses_token
from ._trees import PyTree, Tree, each_group

#: Per-rank row counts: a tuple, list or numpy array of ints known at trace time.
Counts = Any


def _static_counts(counts: Any, size: int, what: str, op: str) -> tuple[int, ...]:
    """Counts as a tuple of non-negative ints, one per rank, or a clear error."""
    try:
        values = np.asarray(counts)
    except Exception:
        values = None
    if values is not None and values.size == 0:  # () would come out as float64
        values = values.astype(np.int64)
    if (
        values is None
        or values.dtype == object
        or not (values.ndim == 1 and np.issubdtype(values.dtype, np.integer))
    ):
        raise TypeError(
            f"jaxmpi.{op}: {what} must be static: a tuple, list or numpy array of ints known "
            f"at trace time (one per rank), got {counts!r}; for counts computed inside jit, "
            "give recv_capacity= (rows of the result)"
        )
    if len(values) != size:
        raise ValueError(
            f"jaxmpi.{op}: {what} has {len(values)} entries, but the communicator has {size} ranks"
        )
    if (values < 0).any():
        raise ValueError(f"jaxmpi.{op}: {what} must not be negative, got {tuple(values.tolist())}")
    return tuple(int(v) for v in values)


# The root of an op that has none: the op's own, not a value a user can pass.
_UNROOTED: Any = object()


def _front(
    op: str, x: PyTree, comm: CommArg, recv_capacity: int | None, root: Any = _UNROOTED
) -> tuple[Tree, CommInfo, Any, int | None]:
    """What every v-collective checks first, in this order: (the pytree, the
    communicator, the root if the op has one, the rows of the result where counts may be
    computed inside jit, else None)."""
    tree = Tree(x, op)
    c = resolve_comm(comm, op)
    if root is not _UNROOTED:
        root = check_rank(root, c.size, "root", op)
    rows = None if recv_capacity is None else _ragged.capacity_arg(recv_capacity, op)
    return tree, c, root, rows


def _leading_rows(tree: Tree, rows: int, op: str) -> None:
    """Every leaf has `rows` rows: its blocks are counted in rows of its leading axis."""

    def check(x: jax.Array, leaf: str) -> None:
        if x.ndim == 0 or x.shape[0] != rows:
            raise ValueError(
                f"jaxmpi.{op}: {leaf or 'x'} must have {rows} rows along its leading axis, "
                f"got shape {x.shape}"
            )

    tree.check(check)


@refuses_token
@raise_mpi_errors()
def gatherv(
    x: PyTree,
    counts: Counts,
    root: int,
    *,
    recv_capacity: int | None = None,
    comm: CommArg = None,
) -> PyTree:
    """Stacks every rank's rows at `root`, in rank order; rank r gives `counts[r]` rows.

    MPI_Gatherv, collective: every rank calls it with the same counts, `root` and dtype,
    and the same shape after the leading axis.

    Args:
        x: This rank's rows: `counts[rank]` along the leading axis (with `recv_capacity`: at
            least that many, the first are sent). Or a pytree of them, moved as one: one MPI
            call per dtype.
        counts: Rows from each rank, one int per rank of `comm`: a tuple, list or numpy
            array known at trace time, or (with `recv_capacity`) an int array computed
            inside `jit`.
        root: The rank that gets the stack: a static int in `[0, size)`.
        recv_capacity: None (default): static counts, which set the result's rows.
            An int: rows of the result, so that the counts may be computed inside `jit`
            (int arrays); the rows received are packed from row 0, the rest are zeros.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        At `root`, the `sum(counts)` rows (or `recv_capacity` rows) of every rank in rank
        order; elsewhere `x` itself. For a pytree, the same structure, each leaf's result in
        its place.

    Derivative:
        Linear in `x`; the counts carry no derivative. Reverse mode runs the adjoint exchange with
        the same counts: each rank gets the root's cotangent of its rows (a scatterv). `vmap`: one
        MPI call, the batch axis inside each row (with `recv_capacity` and counts that differ along
        the batch: one call per entry).

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; counts are not integers or, without `recv_capacity`, not known at
            trace time (for counts computed inside `jit`, pass it); `root` is not a static
            int; `recv_capacity` is not an int.
        ValueError: `x` has not `counts[rank]` rows; counts of the wrong length or negative;
            a negative `recv_capacity`; `root` is not a rank of `comm`; `comm` is freed,
            `COMM_NULL` or an intercommunicator; or the op is in a program over several
            devices outside `shard_map`.
        NotImplementedError: `recv_capacity` with GPU arrays (counts computed inside `jit`
            are read by the CPU; use static counts).
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time; with `recv_capacity`, counts that do not fit the
            result or disagree between ranks (named on every rank); with `JAXMPI_CHECK=1`,
            ranks whose calls differ. Inside your own jitted function JAX raises its own
            error instead; `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            counts = (1, 2)
            x = jnp.full(counts[rank], rank)
            print(rank, jaxmpi.gatherv(x, counts, root=0))

        .. output::

            0 [0 1 1]
            1 [1 1]
    """
    tree, c, root, rows = _front("gatherv", x, comm, recv_capacity, root)
    if rows is not None:
        return each_group(tree, 1, lambda x, t: _ragged.gatherv(x, counts, root, rows, c, t))
    counts = _static_counts(counts, c.size, "counts", "gatherv")
    _leading_rows(tree, counts[trace_rank(c, "gatherv")], "gatherv")

    def call(x: jax.Array, fingerprint: int) -> jax.Array | None:
        at_root = c.rank == root
        outs = apply(
            prim.gatherv,
            x,
            comm=c.handle,
            root=root,
            counts=counts,
            at_root=at_root,
            tree=fingerprint,
        )
        return outs[0] if outs else None

    return each_group(tree, 1, call)


@refuses_token
@raise_mpi_errors()
def allgatherv(
    x: PyTree, counts: Counts, *, recv_capacity: int | None = None, comm: CommArg = None
) -> PyTree:
    """Stacks every rank's rows on every rank, in rank order; rank r gives `counts[r]` rows.

    MPI_Allgatherv, collective: every rank calls it with the same counts and dtype, and the
    same shape after the leading axis.

    Args:
        x: This rank's rows: `counts[rank]` along the leading axis (with `recv_capacity`: at
            least that many, the first are sent). Or a pytree of them, moved as one: one MPI
            call per dtype.
        counts: Rows from each rank, one int per rank of `comm`: a tuple, list or numpy
            array known at trace time, or (with `recv_capacity`) an int array computed
            inside `jit`.
        recv_capacity: None (default): static counts, which set the result's rows.
            An int: rows of the result, so that the counts may be computed inside `jit`
            (int arrays); the rows received are packed from row 0, the rest are zeros.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The `sum(counts)` rows (or `recv_capacity` rows) of every rank, in rank order. For a
        pytree, the same structure, each leaf's result in its place.

    Derivative:
        Linear in `x`; the counts carry no derivative. Reverse mode runs the adjoint exchange with
        the same counts: rank r gets the sum over ranks of their cotangents of its rows. `vmap`: one
        MPI call, the batch axis inside each row (with `recv_capacity` and counts that differ along
        the batch: one call per entry).

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; counts are not integers or, without `recv_capacity`, not known at
            trace time (for counts computed inside `jit`, pass it); `recv_capacity` is not
            an int.
        ValueError: `x` has not `counts[rank]` rows; counts of the wrong length or negative;
            a negative `recv_capacity`; `comm` is freed, `COMM_NULL` or an
            intercommunicator; or the op is in a program over several devices outside
            `shard_map`.
        NotImplementedError: `recv_capacity` with GPU arrays (counts computed inside `jit`
            are read by the CPU; use static counts).
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time; with `recv_capacity`, counts that do not fit the
            result or disagree between ranks (named on every rank); with `JAXMPI_CHECK=1`,
            ranks whose calls differ. Inside your own jitted function JAX raises its own
            error instead; `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax
            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            x = jnp.full(rank + 1, rank)  # rank 0: 1 row, rank 1: 2 rows
            print(rank, jaxmpi.allgatherv(x, (1, 2)))
            # Counts known only inside jit: a fixed number of rows, zeros after the data.
            rows = jax.jit(lambda x, n: jaxmpi.allgatherv(x, n, recv_capacity=4))
            print(rank, rows(x, jnp.array([1, 2])))

        .. output::

            0 [0 1 1]
            0 [0 1 1 0]
            1 [0 1 1]
            1 [0 1 1 0]
    """
    tree, c, _, rows = _front("allgatherv", x, comm, recv_capacity)
    if rows is not None:
        return each_group(tree, 1, lambda x, t: _ragged.allgatherv(x, counts, rows, c, t))
    counts = _static_counts(counts, c.size, "counts", "allgatherv")
    _leading_rows(tree, counts[trace_rank(c, "allgatherv")], "allgatherv")

    def call(x: jax.Array, fingerprint: int) -> jax.Array:
        (y,) = apply(prim.allgatherv, x, comm=c.handle, counts=counts, tree=fingerprint)
        return y

    return each_group(tree, 1, call)


@refuses_token
@raise_mpi_errors()
def scatterv(
    x: PyTree,
    counts: Counts,
    root: int,
    *,
    recv_capacity: int | None = None,
    comm: CommArg = None,
) -> PyTree:
    """Sends block r of `root`'s rows to rank r, `counts[r]` rows each, in rank order.

    MPI_Scatterv, collective: every rank calls it with the same counts, `root` and dtype.

    Args:
        x: At `root`, the `sum(counts)` rows (with `recv_capacity`: at least that many).
            Elsewhere a template of this rank's block, `counts[rank]` rows (with
            `recv_capacity`: any rows, the root's shape after the leading axis); its values
            are never read. Or a pytree of them, moved as one: one MPI call per dtype.
        counts: Rows for each rank, one int per rank of `comm`: a tuple, list or numpy
            array known at trace time, or (with `recv_capacity`) an int array computed
            inside `jit`.
        root: The sending rank: a static int in `[0, size)`.
        recv_capacity: None (default): static counts, which set the result's rows.
            An int: rows of the result, so that the counts may be computed inside `jit`
            (int arrays); the rows received are packed from row 0, the rest are zeros.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        This rank's `counts[rank]` rows (or `recv_capacity` rows, its block first). For a
        pytree, the same structure, each leaf's result in its place.

    Derivative:
        Linear in `x`; the counts carry no derivative. Reverse mode runs the adjoint exchange with
        the same counts: the root gathers the cotangents (a gatherv). `vmap`: one MPI call, the
        batch axis inside each row (with `recv_capacity` and counts that differ along the batch: one
        call per entry).

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; counts are not integers or, without `recv_capacity`, not known at
            trace time (for counts computed inside `jit`, pass it); `root` is not a static
            int; `recv_capacity` is not an int.
        ValueError: `x` has not the rows the counts say; counts of the wrong length or
            negative; a negative `recv_capacity`; `root` is not a rank of `comm`; `comm` is
            freed, `COMM_NULL` or an intercommunicator; or the op is in a program over
            several devices outside `shard_map`.
        NotImplementedError: `recv_capacity` with GPU arrays (counts computed inside `jit`
            are read by the CPU; use static counts).
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time; with `recv_capacity`, counts that do not fit the
            result or disagree between ranks (named on every rank); with `JAXMPI_CHECK=1`,
            ranks whose calls differ. Inside your own jitted function JAX raises its own
            error instead; `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            counts = (1, 2)
            x = jnp.arange(3) if rank == 0 else jnp.zeros(2, jnp.int32)
            print(rank, jaxmpi.scatterv(x, counts, root=0))

        .. output::

            0 [0]
            1 [1 2]
    """
    tree, c, root, rows = _front("scatterv", x, comm, recv_capacity, root)
    if rows is not None:
        return each_group(tree, 1, lambda x, t: _ragged.scatterv(x, counts, root, rows, c, t))
    counts = _static_counts(counts, c.size, "counts", "scatterv")
    at_root = trace_rank(c, "scatterv") == root
    _leading_rows(tree, sum(counts) if at_root else counts[c.rank], "scatterv")

    def call(x: jax.Array, fingerprint: int) -> jax.Array:
        (y,) = apply(
            prim.scatterv, x, comm=c.handle, root=root, counts=counts, rank=c.rank,
            at_root=at_root, tree=fingerprint,
        )  # fmt: skip
        return y

    return each_group(tree, 1, call)


@refuses_token
@raise_mpi_errors()
def alltoallv(
    x: PyTree,
    send_counts: Counts,
    recv_counts: Counts,
    *,
    recv_capacity: int | None = None,
    comm: CommArg = None,
) -> PyTree:
    """Every rank sends `send_counts[s]` rows to each rank s and receives `recv_counts[s]` from it.

    MPI_Alltoallv, collective: every rank calls it with the same dtype and the same shape
    after the leading axis. `x` holds the blocks for ranks 0, 1, ... back to back; the
    result holds the blocks received, in rank order. `recv_counts` must be what the
    senders send: `alltoall(send_counts)` gives it.

    Args:
        x: The `sum(send_counts)` rows to send (with `recv_capacity`: at least that many).
            Or a pytree of them, moved as one: one MPI call per dtype.
        send_counts: Rows to each rank, one int per rank of `comm`: a tuple, list or numpy
            array known at trace time, or (with `recv_capacity`) an int array computed
            inside `jit`.
        recv_counts: Rows from each rank, in the same form.
        recv_capacity: None (default): static counts, which set the result's rows.
            An int: rows of the result, so that the counts may be computed inside `jit`
            (int arrays); the rows received are packed from row 0, the rest are zeros.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The `sum(recv_counts)` rows (or `recv_capacity` rows) received, in rank order. For a
        pytree, the same structure, each leaf's result in its place.

    Derivative:
        Linear in `x`; the counts carry no derivative. Reverse mode runs the adjoint exchange with
        the same counts: the reverse alltoallv, counts swapped. `vmap`: one MPI call, the batch axis
        inside each row (with `recv_capacity` and counts that differ along the batch: one call per
        entry).

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; counts are not integers or, without `recv_capacity`, not known at
            trace time (for counts computed inside `jit`, pass it); `recv_capacity` is not
            an int.
        ValueError: `x` has not `sum(send_counts)` rows; counts of the wrong length or
            negative; a negative `recv_capacity`; `comm` is freed, `COMM_NULL` or an
            intercommunicator; or the op is in a program over several devices outside
            `shard_map`.
        NotImplementedError: `recv_capacity` with GPU arrays (counts computed inside `jit`
            are read by the CPU; use static counts).
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time; with `recv_capacity`, counts that do not fit the
            result or disagree between ranks (named on every rank); with `JAXMPI_CHECK=1`,
            ranks whose calls differ. Inside your own jitted function JAX raises its own
            error instead; `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            counts = (1, 2) if rank == 0 else (2, 1)  # the same for sending and receiving
            x = jnp.arange(3) + 10 * rank
            print(rank, jaxmpi.alltoallv(x, counts, counts))

        .. output::

            0 [ 0 10 11]
            1 [ 1  2 12]
    """
    tree, c, _, rows = _front("alltoallv", x, comm, recv_capacity)
    if rows is not None:
        return each_group(
            tree, 1, lambda x, t: _ragged.alltoallv(x, send_counts, recv_counts, rows, c, t)
        )
    send_counts = _static_counts(send_counts, c.size, "send_counts", "alltoallv")
    recv_counts = _static_counts(recv_counts, c.size, "recv_counts", "alltoallv")
    _leading_rows(tree, sum(send_counts), "alltoallv")

    def call(x: jax.Array, fingerprint: int) -> jax.Array:
        (y,) = apply(
            prim.alltoallv,
            x,
            comm=c.handle,
            send_counts=send_counts,
            recv_counts=recv_counts,
            tree=fingerprint,
        )
        return y

    return each_group(tree, 1, call)
