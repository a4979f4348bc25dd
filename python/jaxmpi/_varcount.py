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
from jax.typing import ArrayLike

from . import _ragged
from ._binding import primitives as prim
from ._comm import CommArg, CommInfo, check_rank, resolve_comm
from ._errors import raise_mpi_errors
from ._ops import array_arg
from ._token import refuses_token

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
    op: str, x: ArrayLike, comm: CommArg, recv_capacity: int | None, root: Any = _UNROOTED
) -> tuple[jax.Array, CommInfo, Any, int | None]:
    """What every v-collective checks first, in this order: (the array, the communicator,
    the root if the op has one, the rows of the result where counts may be computed inside
    jit, else None)."""
    x = array_arg(x, op)
    c = resolve_comm(comm, op)
    if root is not _UNROOTED:
        root = check_rank(root, c.size, "root", op)
    rows = None if recv_capacity is None else _ragged.capacity_arg(recv_capacity, op)
    return x, c, root, rows


def _leading_rows(x: jax.Array, rows: int, what: str, op: str) -> None:
    if x.ndim == 0 or x.shape[0] != rows:
        raise ValueError(
            f"jaxmpi.{op}: {what} must have {rows} rows along its leading axis, got shape {x.shape}"
        )


@refuses_token
@raise_mpi_errors()
def gatherv(
    x: ArrayLike,
    counts: Counts,
    root: int,
    *,
    recv_capacity: int | None = None,
    comm: CommArg = None,
) -> jax.Array:
    """`root` gets every rank's rows stacked in rank order, `sum(counts)` rows; rank r
    contributes `x` with `counts[r]` rows. Other ranks get `x` back. With
    `recv_capacity`, counts may be computed inside jit (see the module's doc)."""
    x, c, root, rows = _front("gatherv", x, comm, recv_capacity, root)
    if rows is not None:
        return _ragged.gatherv(x, counts, root, rows, c)
    counts = _static_counts(counts, c.size, "counts", "gatherv")
    _leading_rows(x, counts[c.rank], "x", "gatherv")
    outs = prim.gatherv.bind(x, comm=c.handle, root=root, counts=counts, at_root=c.rank == root)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def allgatherv(
    x: ArrayLike, counts: Counts, *, recv_capacity: int | None = None, comm: CommArg = None
) -> jax.Array:
    """Every rank gets every rank's rows stacked in rank order (`sum(counts)` rows). With
    `recv_capacity`, counts may be computed inside jit (see the module's doc)."""
    x, c, _, rows = _front("allgatherv", x, comm, recv_capacity)
    if rows is not None:
        return _ragged.allgatherv(x, counts, rows, c)
    counts = _static_counts(counts, c.size, "counts", "allgatherv")
    _leading_rows(x, counts[c.rank], "x", "allgatherv")
    (y,) = prim.allgatherv.bind(x, comm=c.handle, counts=counts)
    return y


@refuses_token
@raise_mpi_errors()
def scatterv(
    x: ArrayLike,
    counts: Counts,
    root: int,
    *,
    recv_capacity: int | None = None,
    comm: CommArg = None,
) -> jax.Array:
    """`root` holds `sum(counts)` rows and sends rows of block r to rank r (`counts[r]`
    rows); other ranks pass a template of their block (values ignored). With
    `recv_capacity`, counts may be computed inside jit (see the module's doc); other
    ranks' `x` then only needs the root's shape after the leading axis."""
    x, c, root, rows = _front("scatterv", x, comm, recv_capacity, root)
    if rows is not None:
        return _ragged.scatterv(x, counts, root, rows, c)
    counts = _static_counts(counts, c.size, "counts", "scatterv")
    at_root = c.rank == root
    _leading_rows(x, sum(counts) if at_root else counts[c.rank], "x", "scatterv")
    (y,) = prim.scatterv.bind(
        x, comm=c.handle, root=root, counts=counts, rank=c.rank, at_root=at_root
    )
    return y


@refuses_token
@raise_mpi_errors()
def alltoallv(
    x: ArrayLike,
    send_counts: Counts,
    recv_counts: Counts,
    *,
    recv_capacity: int | None = None,
    comm: CommArg = None,
) -> jax.Array:
    """Rank r sends `send_counts[s]` rows of `x` to each rank s (blocks in rank order) and
    receives `recv_counts[s]` rows from each, stacked in rank order. With `recv_capacity`,
    both may be computed inside jit (see the module's doc; `alltoall(send_counts)` gives
    `recv_counts`), and must agree with what the senders send."""
    x, c, _, rows = _front("alltoallv", x, comm, recv_capacity)
    if rows is not None:
        return _ragged.alltoallv(x, send_counts, recv_counts, rows, c)
    send_counts = _static_counts(send_counts, c.size, "send_counts", "alltoallv")
    recv_counts = _static_counts(recv_counts, c.size, "recv_counts", "alltoallv")
    _leading_rows(x, sum(send_counts), "x", "alltoallv")
    (y,) = prim.alltoallv.bind(x, comm=c.handle, send_counts=send_counts, recv_counts=recv_counts)
    return y
