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
    StatusArg,
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
    """Reduces `x` over all ranks with `op`; every rank gets the result.

    MPI_Allreduce, collective: every rank of `comm` calls it with an `x` of the same shape
    and dtype, and the same `op`. Works in place on `x` (no copy).

    Args:
        x: This rank's array, any shape and supported dtype.
        op: The reduction: `jaxmpi.SUM`, `PROD`, `MIN`, `MAX`, `LAND`, `LOR`, `LXOR`,
            `BAND`, `BOR`, `BXOR`, or an mpi4py `MPI.Op`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The elementwise reduction over the ranks, shaped like `x`, on every rank.

    Derivative:
        SUM is linear: the tangent is reduced like the value. Its transpose is the identity
        on each rank (mpi4jax's convention: a loss reduced with allreduce is the same on
        every rank, and `jax.grad` gives each rank the gradient of that one loss). MIN and
        MAX differentiate through the selected elements (ties share equally), PROD through
        the product of the other ranks' values; a user-defined op raises
        NotImplementedError. `vmap`: one MPI call for the whole batch.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator; `op`
            is no reduction, or one not defined on `x`'s dtype.
        ValueError: `comm` is freed, `COMM_NULL` or an intercommunicator; or the op
            is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            print(rank, jaxmpi.allreduce(jnp.array([1.0, 2.0]) * (rank + 1), jaxmpi.SUM))

        .. output::

            0 [3. 6.]
            1 [3. 6.]
    """
    return _reduction(prim.allreduce, "allreduce", x, op, comm)


@refuses_token
@raise_mpi_errors()
def reduce(x: ArrayLike, op: OpArg, root: int, *, comm: CommArg = None) -> jax.Array:
    """Reduces `x` over all ranks with `op` to `root`; the other ranks get `x` back.

    MPI_Reduce, collective: every rank calls it with the same shape, dtype, `op` and
    `root`. In place at the root; elsewhere `x` itself is returned, without a copy.

    Args:
        x: This rank's array, any shape and supported dtype.
        op: The reduction, as for `allreduce`.
        root: The rank that gets the result: a static int in `[0, size)`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        At `root`, the reduction over the ranks, shaped like `x`; elsewhere `x`.

    Derivative:
        As `allreduce`'s for SUM, MIN, MAX and PROD (a user-defined op raises
        NotImplementedError). Reverse mode sends the root's cotangent to every rank (a
        bcast), added to each rank's own cotangent of the `x` it got back. `vmap`: one MPI
        call.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator; `op`
            is no reduction, or one not defined on `x`'s dtype; `root` is not a static int.
        ValueError: `root` is not a rank of `comm`; `comm` is freed, `COMM_NULL` or an
            intercommunicator; or the op is in a program over several devices outside
            `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            x = jnp.arange(3) * (rank + 1)  # [0 1 2] and [0 2 4]
            print(rank, jaxmpi.reduce(x, jaxmpi.SUM, root=0))

        .. output::

            0 [0 3 6]
            1 [0 2 4]
    """
    return _reduction(prim.reduce, "reduce", x, op, comm, root=root)


@refuses_token
@raise_mpi_errors()
def scan(x: ArrayLike, op: OpArg, *, comm: CommArg = None) -> jax.Array:
    """Inclusive prefix reduction: rank r gets `op` over the `x` of ranks 0 to r.

    MPI_Scan, collective: every rank calls it with the same shape, dtype and `op`. In place
    on `x`.

    Args:
        x: This rank's array, any shape and supported dtype.
        op: The reduction, as for `allreduce`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The reduction over ranks 0 to this one, shaped like `x`.

    Derivative:
        For SUM only (other ops raise NotImplementedError): linear; reverse mode gives rank
        s the sum of the cotangents of ranks s and after (an allreduce minus an exscan).
        `vmap`: one MPI call.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator; `op`
            is no reduction, or one not defined on `x`'s dtype.
        ValueError: `comm` is freed, `COMM_NULL` or an intercommunicator; or the op
            is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            print(rank, jaxmpi.scan(jnp.full(2, rank + 1.0), jaxmpi.SUM))

        .. output::

            0 [1. 1.]
            1 [3. 3.]
    """
    return _reduction(prim.scan, "scan", x, op, comm)


@refuses_token
@raise_mpi_errors()
def exscan(x: ArrayLike, op: OpArg, *, comm: CommArg = None) -> jax.Array:
    """Exclusive prefix reduction: rank r gets `op` over the `x` of ranks 0 to r-1.

    MPI_Exscan, collective: every rank calls it with the same shape, dtype and `op`. MPI
    leaves rank 0's result undefined; jaxmpi gives it zeros. In place on `x`.

    Args:
        x: This rank's array, any shape and supported dtype.
        op: The reduction, as for `allreduce`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The reduction over the ranks before this one, shaped like `x` (zeros on rank 0).

    Derivative:
        For SUM only (other ops raise NotImplementedError): linear; reverse mode gives rank
        s the sum of the cotangents of the ranks after it (an allreduce minus a scan).
        `vmap`: one MPI call.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator; `op`
            is no reduction, or one not defined on `x`'s dtype.
        ValueError: `comm` is freed, `COMM_NULL` or an intercommunicator; or the op
            is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            print(rank, jaxmpi.exscan(jnp.full(2, rank + 1.0), jaxmpi.SUM))

        .. output::

            0 [0. 0.]
            1 [1. 1.]
    """
    return _reduction(prim.exscan, "exscan", x, op, comm)


@refuses_token
@raise_mpi_errors()
def reduce_scatter(x: ArrayLike, op: OpArg, *, comm: CommArg = None) -> jax.Array:
    """Reduces slice r of every rank's `x` with `op` and gives it to rank r.

    MPI_Reduce_scatter_block, collective: every rank calls it with the same shape, dtype and
    `op`.

    Args:
        x: Shape `(size, ...)`: one slice per rank of `comm`, along the leading axis.
        op: The reduction, as for `allreduce`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The reduction over the ranks of slice `rank`, shaped like `x[0]`.

    Derivative:
        For SUM only (other ops raise NotImplementedError): linear; its transpose is an
        allgather of the cotangents. `vmap`: one MPI call, the batch axis behind the rank
        axis.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator; `op`
            is no reduction, or one not defined on `x`'s dtype.
        ValueError: `x`'s leading axis is not the size of `comm`; `comm` is freed,
            `COMM_NULL` or an intercommunicator; or the op is in a program over several
            devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            x = jnp.array([[0.0, 1.0], [2.0, 3.0]]) + rank  # one row per rank
            print(rank, jaxmpi.reduce_scatter(x, jaxmpi.SUM))

        .. output::

            0 [1. 3.]
            1 [5. 7.]
    """
    x = array_arg(x, "reduce_scatter")
    c = resolve_comm(comm, "reduce_scatter")
    leading_axis_is_size(x, c.size, "reduce_scatter", "Reduce_scatter")
    code, user_op = resolve_op(op, x.dtype, "reduce_scatter")
    (y,) = prim.reduce_scatter.bind(x, comm=c.handle, op=code, user_op=user_op)
    return y


@refuses_token
@raise_mpi_errors()
def bcast(x: ArrayLike, root: int, *, comm: CommArg = None) -> jax.Array:
    """Sends `root`'s `x` to every rank.

    MPI_Bcast, collective: every rank calls it with the same shape, dtype and `root`. Away
    from the root `x` is a template: only its shape and dtype matter, its values are never
    read (nor computed, if nothing else uses them).

    Args:
        x: At `root`, the array to send; elsewhere, an array of the same shape and dtype.
        root: The sending rank: a static int in `[0, size)`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        `root`'s `x`, on every rank (at the root, `x` itself).

    Derivative:
        Linear: the tangent is broadcast too. Reverse mode sums every rank's cotangent at
        the root (a reduce). `vmap`: one MPI call.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator; `root`
            is not a static int.
        ValueError: `root` is not a rank of `comm`; `comm` is freed, `COMM_NULL` or an
            intercommunicator; or the op is in a program over several devices outside
            `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            x = jnp.arange(3.0) if rank == 0 else jnp.zeros(3)
            print(rank, jaxmpi.bcast(x, root=0))

        .. output::

            0 [0. 1. 2.]
            1 [0. 1. 2.]
    """
    x = array_arg(x, "bcast")
    c = resolve_comm(comm, "bcast")
    root = check_rank(root, c.size, "root", "bcast")
    outs = prim.bcast.bind(x, comm=c.handle, root=root, at_root=c.rank == root)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def gather(x: ArrayLike, root: int, *, comm: CommArg = None) -> jax.Array:
    """Stacks every rank's `x` at `root`, in rank order.

    MPI_Gather, collective: every rank calls it with the same shape, dtype and `root`.

    Args:
        x: This rank's array, any shape and supported dtype.
        root: The rank that gets the stack: a static int in `[0, size)`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        At `root`, shape `(size, *x.shape)`, row r from rank r; elsewhere `x` itself.

    Derivative:
        Linear; reverse mode sends row r of the root's cotangent back to rank r (a scatter).
        `vmap`: one MPI call.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator; `root`
            is not a static int.
        ValueError: `root` is not a rank of `comm`; `comm` is freed, `COMM_NULL` or an
            intercommunicator; or the op is in a program over several devices outside
            `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            print(rank, jaxmpi.gather(jnp.array(10 * rank), root=0).tolist())

        .. output::

            0 [0, 10]
            1 10
    """
    x = array_arg(x, "gather")
    c = resolve_comm(comm, "gather")
    root = check_rank(root, c.size, "root", "gather")
    outs = prim.gather.bind(x, comm=c.handle, root=root, size=c.size, at_root=c.rank == root)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def allgather(x: ArrayLike, *, comm: CommArg = None) -> jax.Array:
    """Stacks every rank's `x` on every rank, in rank order.

    MPI_Allgather, collective: every rank calls it with the same shape and dtype.

    Args:
        x: This rank's array, any shape and supported dtype.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        Every rank's `x` stacked along a new leading axis, row r from rank r (shape
        `(size, *x.shape)`).

    Derivative:
        Linear; its transpose sums the cotangents of row r over the ranks and gives them to
        rank r (a reduce_scatter). `vmap`: one MPI call.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator.
        ValueError: `comm` is freed, `COMM_NULL` or an intercommunicator; or the op
            is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            print(rank, jaxmpi.allgather(jnp.array([rank, -rank])).tolist())

        .. output::

            0 [[0, 0], [1, -1]]
            1 [[0, 0], [1, -1]]
    """
    x = array_arg(x, "allgather")
    c = resolve_comm(comm, "allgather")
    (y,) = prim.allgather.bind(x, comm=c.handle, size=c.size)
    return y


@refuses_token
@raise_mpi_errors()
def scatter(x: ArrayLike, root: int, *, comm: CommArg = None) -> jax.Array:
    """Sends row r of `root`'s `x` to rank r.

    MPI_Scatter, collective: every rank calls it with the same dtype and `root`.

    Args:
        x: At `root`, shape `(size, ...)`: one row per rank. Elsewhere a template shaped
            like one row (`x.shape[1:]` of the root's): its values are never read.
        root: The sending rank: a static int in `[0, size)`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        This rank's row of the root's `x`.

    Derivative:
        Linear; reverse mode gathers the cotangents at the root (a gather). `vmap`: one MPI
        call.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator; `root`
            is not a static int.
        ValueError: At the root, `x`'s leading axis is not the size of `comm`; `root` is not
            a rank of `comm`; `comm` is freed, `COMM_NULL` or an intercommunicator; or the op
            is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            x = jnp.arange(4).reshape(2, 2) if rank == 0 else jnp.zeros(2, jnp.int32)
            print(rank, jaxmpi.scatter(x, root=0))

        .. output::

            0 [0 1]
            1 [2 3]
    """
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
    """Every rank sends row r of its `x` to rank r and gets one row from each rank.

    MPI_Alltoall, collective: every rank calls it with the same shape and dtype.

    Args:
        x: Shape `(size, ...)`: row r goes to rank r.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        Shaped like `x`, row r being what rank r sent to this rank.

    Derivative:
        Linear; its transpose is an alltoall of the cotangents. `vmap`: one MPI call, the
        batch axis behind the rank axis.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator.
        ValueError: `x`'s leading axis is not the size of `comm`; `comm` is freed,
            `COMM_NULL` or an intercommunicator; or the op is in a program over several
            devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls differ.
            Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            print(rank, jaxmpi.alltoall(jnp.array([0, 1]) + 10 * rank))

        .. output::

            0 [ 0 10]
            1 [ 1 11]
    """
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
    """Sends `x` to rank `dest`.

    MPI_Send: returns once `x` may be reused (MPI may or may not have delivered it). The
    matching `recv` (or `sendrecv`) on `dest` names this rank, or any, and this tag, or any.
    Two ranks that both send first may deadlock: exchange with `sendrecv`.

    Args:
        x: The array to send, any shape and supported dtype.
        dest: The receiving rank, or `PROC_NULL` (nothing is sent): a static int.
        tag: The message's tag, an int in `[0, 2**31)` (default 0).
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        An empty list (mpi4jax's result).

    Derivative:
        Linear: the tangent follows as a second message to `dest`. Reverse mode receives the
        cotangent back from `dest` (whose `recv` transposes into a send). `vmap`: one message
        for the whole batch.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator;
            a rank is not a static int.
        ValueError: A rank outside `comm` (or `ANY_SOURCE` as `dest`); a tag that is not an
            int in `[0, 2**31)`; `comm` is freed, `COMM_NULL` or an intercommunicator; or the
            op is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time (a receive that does not fit the message fails
            on the receiving rank). Inside your own jitted function JAX raises its own error
            instead; `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            if rank == 0:
                jaxmpi.send(jnp.arange(3.0), dest=1, tag=7)
            else:
                print(jaxmpi.recv(jnp.zeros(3), source=0, tag=7))

        .. output::

            [0. 1. 2.]
    """
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
    status: StatusArg = None,
) -> jax.Array:
    """Receives an array shaped like `x` from rank `source`.

    MPI_Recv: waits for a message from `source` with `tag` on `comm`. `x` is a template:
    only its shape and dtype matter, its values are never read, and the message lands in a
    fresh buffer without a copy.

    Args:
        x: Template of the message: its shape and dtype.
        source: The sending rank, `ANY_SOURCE` (None, the default, means it too), or
            `PROC_NULL` (nothing arrives: the result is `x`). A static int.
        tag: The tag to match; None (default) or `ANY_TAG` match any.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        status: An mpi4py `MPI.Status` to fill in: the source, tag and element count. With
            it, a message shorter than `x` is accepted (the rest of the result is zeros).
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The array received, shaped like `x`.

    Derivative:
        Linear, for a named `source` (`ANY_SOURCE` raises NotImplementedError): the
        sender's tangent follows as a second message. JAX differentiates the receive only if
        `x` depends on the differentiated values: pass the array the result replaces (a
        halo, say), not a constant, or the sender's tangent finds no receive. Reverse mode
        sends the cotangent back to `source`. `vmap`: one message for the whole batch.

    Raises:
        TypeError: `x` is not an array of a supported dtype, or `comm` no communicator;
            a rank is not a static int; `status` is no `MPI.Status`.
        ValueError: A rank outside `comm`; a tag that is not an int in `[0, 2**31)`; `comm`
            is freed, `COMM_NULL` or an intercommunicator; or the op is in a program over
            several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time: a message longer than the receive buffer, or
            (without `status`) shorter; with `JAXMPI_CHECK=1`, a message whose dtype or shape
            differs. Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi
            from mpi4py import MPI

            rank = jaxmpi.COMM_WORLD.Get_rank()
            if rank == 1:
                jaxmpi.send(jnp.ones(2), dest=0, tag=5)
            else:
                status = MPI.Status()
                y = jaxmpi.recv(jnp.zeros(4), status=status)  # any source, any tag
                print(y, status.Get_source(), status.Get_tag(), status.Get_count(MPI.FLOAT))

        .. output::

            [1. 1. 0. 0.] 1 5 2
    """
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
    status: StatusArg = None,
) -> jax.Array:
    """Sends `sendbuf` to `dest` while receiving an array shaped like `recvbuf` from `source`.

    MPI_Sendrecv: the send and the receive proceed together, so ranks that all exchange
    at once (a ring, a halo exchange) cannot deadlock. `recvbuf` is a template: its values
    are never read. The same array as both (`a = sendrecv(a, a, ...)`) is exchanged in
    place, through one buffer (MPI_Sendrecv_replace).

    Args:
        sendbuf: The array to send, any shape and supported dtype.
        recvbuf: Template of what arrives: its shape and dtype.
        source: The sending rank, `ANY_SOURCE` or `PROC_NULL` (nothing arrives: the result
            is `recvbuf`). A static int.
        dest: The receiving rank, or `PROC_NULL` (nothing is sent). A static int.
        sendtag: The tag of the message sent, in `[0, 2**31)` (default 0).
        recvtag: The tag to match; None (default) or `ANY_TAG` match any.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        status: An mpi4py `MPI.Status` to fill in, as for `recv` (a shorter message is
            then accepted).
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The array received from `source`, shaped like `recvbuf`.

    Derivative:
        Linear, for a named `source` (`ANY_SOURCE` raises NotImplementedError): the
        tangents are exchanged right after the values. Reverse mode runs the swapped
        exchange: the cotangent of the result goes back to `source`, that of `sendbuf` comes
        from `dest`. `vmap`: one message for the whole batch.

    Raises:
        TypeError: `sendbuf` or `recvbuf` is not an array of a supported dtype, or `comm` no
            communicator; a rank is not a static int; `status` is no `MPI.Status`.
        ValueError: A rank outside `comm` (or `ANY_SOURCE` as `dest`); a tag that is not an
            int in `[0, 2**31)`; `comm` is freed, `COMM_NULL` or an intercommunicator; or the
            op is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time: a message longer than the receive buffer, or
            (without `status`) shorter; with `JAXMPI_CHECK=1`, a message whose dtype or shape
            differs. Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            other = 1 - rank
            a = jnp.full(2, float(rank))
            a = jaxmpi.sendrecv(a, a, source=other, dest=other)  # swapped in place
            print(rank, a)

        .. output::

            0 [1. 1.]
            1 [0. 0.]
    """
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
    """Waits until every rank of `comm` has reached the barrier.

    MPI_Barrier, collective, in program order: inside `jax.jit` it runs where the program
    reaches it, after the jaxmpi ops before it and before those after it.

    Args:
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        An empty list (mpi4jax's result).

    Derivative:
        None needed: it has no operands, so a function that calls it differentiates and
        batches as if it were not there (the barrier still runs, once).

    Raises:
        TypeError: `comm` is no communicator.
        ValueError: `comm` is freed, `COMM_NULL` or an intercommunicator; or the op
            is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time. Inside your own jitted function JAX raises its
            own error instead; `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jaxmpi

            jaxmpi.barrier()
            print("past the barrier")

        .. output::

            past the barrier
            past the barrier
    """
    c = resolve_comm(comm, "barrier")
    return prim.barrier.bind(comm=c.handle)
