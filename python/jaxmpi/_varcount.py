"""The variable-count collectives: gatherv, allgatherv, scatterv, alltoallv.

Counts are per rank and static (known at trace time), in rows: entries of the leading
axis. Rank r's block has `counts[r]` rows; blocks lie back to back in rank order. The
handlers get the same row counts and compute element counts and displacements from the
row size of the buffers they have, so a batched (vmapped) row is just a longer row.
"""

from __future__ import annotations

import numpy as np

from ._comm import check_rank, resolve_comm
from ._errors import raise_mpi_errors
from ._jax_shim import ShapedArray
from ._ops import _array, _at_root_only, _define, _template_away_from_root
from ._token import refuses_token


def _rows_like(x, rows: int):
    return ShapedArray((rows, *x.shape[1:]), x.dtype)


# Like gather and scatter (see _ops.py): no result away from gatherv's root; scatterv's
# operand there is a template, never read.
_gatherv_p = _define(
    "gatherv",
    _at_root_only(lambda x, *, counts, **_: _rows_like(x, sum(counts))),
    shape_params=("at_root",),
)
_allgatherv_p = _define("allgatherv", lambda x, *, counts, **_: [_rows_like(x, sum(counts))])
_scatterv_p = _define(
    "scatterv",
    lambda x, *, counts, rank, at_root, **_: [_rows_like(x, counts[rank]) if at_root else x],
    unread=_template_away_from_root,
    shape_params=("rank", "at_root"),
)
_alltoallv_p = _define(
    "alltoallv", lambda x, *, recv_counts, **_: [_rows_like(x, sum(recv_counts))]
)


def _static_counts(counts, size: int, what: str, op: str) -> tuple[int, ...]:
    """Counts as a tuple of non-negative ints, one per rank, or a clear error."""
    try:
        values = np.asarray(counts)
    except Exception:  # noqa: BLE001 - a tracer refuses conversion in several ways
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
            f"at trace time (one per rank), got {counts!r}"
        )
    if len(values) != size:
        raise ValueError(
            f"jaxmpi.{op}: {what} has {len(values)} entries, but the communicator has {size} ranks"
        )
    if (values < 0).any():
        raise ValueError(f"jaxmpi.{op}: {what} must not be negative, got {tuple(values.tolist())}")
    return tuple(int(v) for v in values)


def _leading_rows(x, rows: int, what: str, op: str) -> None:
    if x.ndim == 0 or x.shape[0] != rows:
        raise ValueError(
            f"jaxmpi.{op}: {what} must have {rows} rows along its leading axis, got shape {x.shape}"
        )


@refuses_token
@raise_mpi_errors()
def gatherv(x, counts, root, *, comm=None):
    """`root` gets every rank's rows stacked in rank order, `sum(counts)` rows; rank r
    contributes `x` with `counts[r]` rows. Other ranks get `x` back."""
    x = _array(x, "gatherv")
    c = resolve_comm(comm, "gatherv")
    root = check_rank(root, c.size, "root", "gatherv")
    counts = _static_counts(counts, c.size, "counts", "gatherv")
    _leading_rows(x, counts[c.rank], "x", "gatherv")
    outs = _gatherv_p.bind(x, comm=c.handle, root=root, counts=counts, at_root=c.rank == root)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def allgatherv(x, counts, *, comm=None):
    """Every rank gets every rank's rows stacked in rank order (`sum(counts)` rows)."""
    x = _array(x, "allgatherv")
    c = resolve_comm(comm, "allgatherv")
    counts = _static_counts(counts, c.size, "counts", "allgatherv")
    _leading_rows(x, counts[c.rank], "x", "allgatherv")
    (y,) = _allgatherv_p.bind(x, comm=c.handle, counts=counts)
    return y


@refuses_token
@raise_mpi_errors()
def scatterv(x, counts, root, *, comm=None):
    """`root` holds `sum(counts)` rows and sends rows of block r to rank r (`counts[r]`
    rows); other ranks pass a template of their block (values ignored)."""
    x = _array(x, "scatterv")
    c = resolve_comm(comm, "scatterv")
    root = check_rank(root, c.size, "root", "scatterv")
    counts = _static_counts(counts, c.size, "counts", "scatterv")
    at_root = c.rank == root
    _leading_rows(x, sum(counts) if at_root else counts[c.rank], "x", "scatterv")
    (y,) = _scatterv_p.bind(
        x, comm=c.handle, root=root, counts=counts, rank=c.rank, at_root=at_root
    )
    return y


@refuses_token
@raise_mpi_errors()
def alltoallv(x, send_counts, recv_counts, *, comm=None):
    """Rank r sends `send_counts[s]` rows of `x` to each rank s (blocks in rank order) and
    receives `recv_counts[s]` rows from each, stacked in rank order."""
    x = _array(x, "alltoallv")
    c = resolve_comm(comm, "alltoallv")
    send_counts = _static_counts(send_counts, c.size, "send_counts", "alltoallv")
    recv_counts = _static_counts(recv_counts, c.size, "recv_counts", "alltoallv")
    _leading_rows(x, sum(send_counts), "x", "alltoallv")
    (y,) = _alltoallv_p.bind(x, comm=c.handle, send_counts=send_counts, recv_counts=recv_counts)
    return y
