"""The MPI ops users call: each checks its arguments at trace time, then binds its
primitive (declared in `_binding/primitives.py`, with every other op's)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from . import _native
from ._binding import primitives as prim
from ._comm import (
    ANY_SOURCE,
    ANY_TAG,
    CommArg,
    OpArg,
    check_rank,
    encode_dest,
    encode_source,
    encode_tag,
    resolve_comm,
    resolve_op,
    status_address,
)
from ._errors import raise_mpi_errors
from ._token import refuses_token

SUPPORTED_DTYPES: list[str] = _native.dtypes()


def array_arg(x: ArrayLike, op: str) -> jax.Array:
    """Any array-like as a JAX array of a dtype jaxmpi can move."""
    try:
        x = jnp.asarray(x)
    except TypeError:
        raise TypeError(
            f"jaxmpi.{op}: expected an array or a scalar, got {type(x).__name__}"
        ) from None
    if x.dtype.name not in SUPPORTED_DTYPES:
        raise TypeError(
            f"jaxmpi.{op}: dtype {x.dtype.name} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}"
        )
    return x


def leading_axis_is_size(x: jax.Array, size: int, op: str, name: str) -> None:
    if x.ndim == 0 or x.shape[0] != size:
        raise ValueError(
            f"jaxmpi.{op}: {name} input must have shape (nproc, ...) = ({size}, ...) for "
            f"a communicator of {size} ranks, got shape {x.shape}"
        )


def _reduction(
    primitive: Any,
    name: str,
    x: ArrayLike,
    op: OpArg,
    comm: CommArg,
    root: int | None = None,
    **params: Any,
) -> jax.Array:
    """The shared front of the elementwise reductions: checks, then one bind."""
    x = array_arg(x, name)
    c = resolve_comm(comm, name)
    if root is not None:
        params["root"] = check_rank(root, c.size, "root", name)
        params["at_root"] = c.rank == params["root"]
    code, user_op = resolve_op(op, x.dtype, name)
    outs = primitive.bind(x, comm=c.handle, op=code, user_op=user_op, **params)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def allreduce(x: ArrayLike, op: OpArg, *, comm: CommArg = None) -> jax.Array:
    """Reduces `x` over all ranks with `op`; every rank gets the result."""
    return _reduction(prim.allreduce, "allreduce", x, op, comm)


@refuses_token
@raise_mpi_errors()
def reduce(x: ArrayLike, op: OpArg, root: int, *, comm: CommArg = None) -> jax.Array:
    """Reduces `x` over all ranks to `root`; other ranks get `x` back unchanged."""
    return _reduction(prim.reduce, "reduce", x, op, comm, root=root)


@refuses_token
@raise_mpi_errors()
def scan(x: ArrayLike, op: OpArg, *, comm: CommArg = None) -> jax.Array:
    """Inclusive prefix reduction: rank r gets `op` over ranks 0..r."""
    return _reduction(prim.scan, "scan", x, op, comm)


@refuses_token
@raise_mpi_errors()
def exscan(x: ArrayLike, op: OpArg, *, comm: CommArg = None) -> jax.Array:
    """Exclusive prefix reduction: rank r gets `op` over ranks 0..r-1; rank 0 gets zeros."""
    return _reduction(prim.exscan, "exscan", x, op, comm)


@refuses_token
@raise_mpi_errors()
def reduce_scatter(x: ArrayLike, op: OpArg, *, comm: CommArg = None) -> jax.Array:
    """`x` has shape `(size, ...)`; rank r gets the reduction over all ranks of slice r."""
    x = array_arg(x, "reduce_scatter")
    c = resolve_comm(comm, "reduce_scatter")
    leading_axis_is_size(x, c.size, "reduce_scatter", "Reduce_scatter")
    code, user_op = resolve_op(op, x.dtype, "reduce_scatter")
    (y,) = prim.reduce_scatter.bind(x, comm=c.handle, op=code, user_op=user_op)
    return y


@refuses_token
@raise_mpi_errors()
def bcast(x: ArrayLike, root: int, *, comm: CommArg = None) -> jax.Array:
    """Sends `x` from `root` to all ranks; others pass an array of the same shape and
    dtype (its values are ignored)."""
    x = array_arg(x, "bcast")
    c = resolve_comm(comm, "bcast")
    root = check_rank(root, c.size, "root", "bcast")
    outs = prim.bcast.bind(x, comm=c.handle, root=root, at_root=c.rank == root)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def gather(x: ArrayLike, root: int, *, comm: CommArg = None) -> jax.Array:
    """`root` gets every rank's `x` stacked, shape `(size, *x.shape)`; others get `x`."""
    x = array_arg(x, "gather")
    c = resolve_comm(comm, "gather")
    root = check_rank(root, c.size, "root", "gather")
    outs = prim.gather.bind(x, comm=c.handle, root=root, size=c.size, at_root=c.rank == root)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def allgather(x: ArrayLike, *, comm: CommArg = None) -> jax.Array:
    """Every rank gets every rank's `x` stacked, shape `(size, *x.shape)`."""
    x = array_arg(x, "allgather")
    c = resolve_comm(comm, "allgather")
    (y,) = prim.allgather.bind(x, comm=c.handle, size=c.size)
    return y


@refuses_token
@raise_mpi_errors()
def scatter(x: ArrayLike, root: int, *, comm: CommArg = None) -> jax.Array:
    """`root` holds `x` of shape `(size, ...)` and sends slice i to rank i; other ranks
    pass an array shaped like one slice (values ignored)."""
    x = array_arg(x, "scatter")
    c = resolve_comm(comm, "scatter")
    root = check_rank(root, c.size, "root", "scatter")
    if c.rank == root:
        leading_axis_is_size(x, c.size, "scatter", "Scatter")
    (y,) = prim.scatter.bind(x, comm=c.handle, root=root, at_root=c.rank == root)
    return y


@refuses_token
@raise_mpi_errors()
def alltoall(x: ArrayLike, *, comm: CommArg = None) -> jax.Array:
    """`x` has shape `(size, ...)`; rank r sends slice i to rank i and receives slice r of
    every rank, in rank order."""
    x = array_arg(x, "alltoall")
    c = resolve_comm(comm, "alltoall")
    leading_axis_is_size(x, c.size, "alltoall", "Alltoall")
    (y,) = prim.alltoall.bind(x, comm=c.handle)
    return y


def send_args(x: ArrayLike, dest: int, tag: int, comm: CommArg, op: str) -> tuple:
    """A send's arguments checked and encoded: (array, communicator, dest, tag)."""
    x = array_arg(x, op)
    c = resolve_comm(comm, op)
    return x, c, encode_dest(dest, c.size, op), encode_tag(tag, op, allow_any=False)


def recv_args(
    x: ArrayLike, source: int | None, tag: int | None, comm: CommArg, status: Any, op: str
) -> tuple:
    """A receive's arguments checked and encoded: (template, communicator, source, tag,
    status address); no source or tag means any."""
    x = array_arg(x, op)
    c = resolve_comm(comm, op)
    source = encode_source(ANY_SOURCE if source is None else source, c.size, op)
    tag = encode_tag(ANY_TAG if tag is None else tag, op, allow_any=True)
    return x, c, source, tag, status_address(status, op)


@refuses_token
@raise_mpi_errors()
def send(x: ArrayLike, dest: int, *, tag: int = 0, comm: CommArg = None) -> list:
    """Sends `x` to rank `dest`."""
    x, c, dest, tag = send_args(x, dest, tag, comm, "send")
    return prim.send.bind(x, comm=c.handle, dest=dest, tag=tag)


@refuses_token
@raise_mpi_errors()
def recv(
    x: ArrayLike,
    source: int | None = None,
    *,
    tag: int | None = None,
    comm: CommArg = None,
    status: Any = None,
) -> jax.Array:
    """Receives an array shaped like `x` (a template; its values are ignored) from
    `source` (default: any) with `tag` (default: any); fills `status` if given."""
    x, c, source, tag, address = recv_args(x, source, tag, comm, status, "recv")
    (y,) = prim.recv.bind(x, comm=c.handle, source=source, tag=tag, status=address)
    return y


@refuses_token
@raise_mpi_errors()
def sendrecv(
    sendbuf: ArrayLike,
    recvbuf: ArrayLike,
    source: int,
    dest: int,
    *,
    sendtag: int = 0,
    recvtag: int | None = None,
    comm: CommArg = None,
    status: Any = None,
) -> jax.Array:
    """Sends `sendbuf` to `dest` while receiving an array shaped like `recvbuf` (a
    template; its values are ignored) from `source`, deadlock-free. The same array as both
    (`a = sendrecv(a, a, ...)`) is exchanged in place."""
    replace = sendbuf is recvbuf
    sendbuf, recvbuf = array_arg(sendbuf, "sendrecv"), array_arg(recvbuf, "sendrecv")
    c = resolve_comm(comm, "sendrecv")
    (y,) = prim.sendrecv.bind(
        sendbuf,
        recvbuf,
        replace=replace,
        comm=c.handle,
        source=encode_source(source, c.size, "sendrecv"),
        dest=encode_dest(dest, c.size, "sendrecv"),
        sendtag=encode_tag(sendtag, "sendrecv", allow_any=False),
        recvtag=encode_tag(ANY_TAG if recvtag is None else recvtag, "sendrecv", allow_any=True),
        status=status_address(status, "sendrecv"),
    )
    return y


@refuses_token
@raise_mpi_errors()
def barrier(*, comm: CommArg = None) -> list:
    """Waits until every rank of `comm` has reached the barrier."""
    c = resolve_comm(comm, "barrier")
    return prim.barrier.bind(comm=c.handle)
