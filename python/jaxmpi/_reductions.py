"""The reductions users call: allreduce, reduce, scan, exscan, reduce_scatter. Each checks
its arguments at trace time (`_args.py`, `_comm.py`), then binds its primitive (declared in
`_binding/primitives.py`, with every other op's)."""

from __future__ import annotations

from typing import Any

import jax

from ._args import check_rank, leading_axis_is_size
from ._binding import primitives as prim
from ._comm import CommArg, OpArg, at_root, resolve_comm, resolve_op
from ._errors import raise_mpi_errors
from ._requests import apply
from ._token import refuses_token
from ._trees import PyTree, Tree, each_group


def _reduction(
    primitive: Any,
    name: str,
    x: PyTree,
    op: OpArg,
    comm: CommArg,
    root: int | None = None,
    keep: int = 0,
    **params: Any,
) -> PyTree:
    """The shared body of the reductions: checks, then one bind per group of leaves
    (`keep`: 1 where the leading axis is the ranks', which every leaf keeps)."""
    tree = Tree(x, name)
    c = resolve_comm(comm, name)
    if root is not None:
        params["root"] = check_rank(root, c.size, "root", name)
        params["at_root"] = at_root(c, params["root"])
    if keep:
        tree.check(
            lambda leaf, path: leading_axis_is_size(leaf, c.size, name, "Reduce_scatter", path)
        )

    def call(packed: jax.Array, fingerprint: int) -> jax.Array | None:
        code, user_op = resolve_op(op, packed.dtype, name)
        outs = apply(
            primitive, packed, comm=c.handle, op=code, user_op=user_op, tree=fingerprint, **params
        )
        return outs[0] if outs else None

    return each_group(tree, keep, call)


@refuses_token
@raise_mpi_errors()
def allreduce(x: PyTree, op: OpArg, *, comm: CommArg = None) -> PyTree:
    """Reduces `x` over all ranks with `op`; every rank gets the result.

    MPI_Allreduce, collective: every rank of `comm` calls it with an `x` of the same shape
    and dtype, and the same `op`. Works in place on `x` (no copy).

    Args:
        x: This rank's array, any shape and supported dtype. Or a pytree of them, moved as
            one: one MPI call per dtype.
        op: The reduction: `jaxmpi.SUM`, `PROD`, `MIN`, `MAX`, `LAND`, `LOR`, `LXOR`,
            `BAND`, `BOR`, `BXOR`, or an mpi4py `MPI.Op`. MIN and MAX on floats give NaN
            where any rank's element is NaN, as `jnp.minimum`/`jnp.maximum` do.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The elementwise reduction over the ranks, shaped like `x`, on every rank. For a
        pytree, the same structure, each leaf's result in its place.

    Derivative:
        SUM is linear: the tangent is reduced like the value. Its transpose is the identity
        on each rank (mpi4jax's convention: a loss reduced with allreduce is the same on
        every rank, and `jax.grad` gives each rank the gradient of that one loss). MIN and
        MAX differentiate through the selected elements (ties share equally), PROD through
        the product of the other ranks' values; a user-defined op raises
        NotImplementedError. `vmap`: one MPI call for the whole batch.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; `op` is no reduction, or one not defined on `x`'s dtype.
        ValueError: `comm` is freed, `COMM_NULL` or an intercommunicator; or the op
            is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls
            differ. Inside your own jitted function JAX raises its own error instead;
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
def reduce(x: PyTree, op: OpArg, root: int, *, comm: CommArg = None) -> PyTree:
    """Reduces `x` over all ranks with `op` to `root`; the other ranks get `x` back.

    MPI_Reduce, collective: every rank calls it with the same shape, dtype, `op` and
    `root`. In place at the root; elsewhere `x` itself is returned, without a copy.

    Args:
        x: This rank's array, any shape and supported dtype. Or a pytree of them, moved as
            one: one MPI call per dtype.
        op: The reduction, as for `allreduce`.
        root: The rank that gets the result: a static int in `[0, size)`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        At `root`, the reduction over the ranks, shaped like `x`; elsewhere `x`. For a
        pytree, the same structure, each leaf's result in its place.

    Derivative:
        As `allreduce`'s for SUM, MIN, MAX and PROD (a user-defined op raises
        NotImplementedError). Reverse mode sends the root's cotangent to every rank (a
        bcast), added to each rank's own cotangent of the `x` it got back. `vmap`: one MPI
        call.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; `op` is no reduction, or one not defined on `x`'s dtype; `root` is
            not a static int.
        ValueError: `root` is not a rank of `comm`; `comm` is freed, `COMM_NULL` or an
            intercommunicator; or the op is in a program over several devices outside
            `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls
            differ. Inside your own jitted function JAX raises its own error instead;
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
def scan(x: PyTree, op: OpArg, *, comm: CommArg = None) -> PyTree:
    """Inclusive prefix reduction: rank r gets `op` over the `x` of ranks 0 to r.

    MPI_Scan, collective: every rank calls it with the same shape, dtype and `op`. In place
    on `x`.

    Args:
        x: This rank's array, any shape and supported dtype. Or a pytree of them, moved as
            one: one MPI call per dtype.
        op: The reduction, as for `allreduce`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The reduction over ranks 0 to this one, shaped like `x`. For a pytree, the same
        structure, each leaf's result in its place.

    Derivative:
        For SUM only (other ops raise NotImplementedError): linear; reverse mode gives rank
        s the sum of the cotangents of ranks s and after (an allreduce minus an exscan).
        `vmap`: one MPI call.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; `op` is no reduction, or one not defined on `x`'s dtype.
        ValueError: `comm` is freed, `COMM_NULL` or an intercommunicator; or the op
            is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls
            differ. Inside your own jitted function JAX raises its own error instead;
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
def exscan(x: PyTree, op: OpArg, *, comm: CommArg = None) -> PyTree:
    """Exclusive prefix reduction: rank r gets `op` over the `x` of ranks 0 to r-1.

    MPI_Exscan, collective: every rank calls it with the same shape, dtype and `op`. MPI
    leaves rank 0's result undefined; jaxmpi gives it zeros. In place on `x`.

    Args:
        x: This rank's array, any shape and supported dtype. Or a pytree of them, moved as
            one: one MPI call per dtype.
        op: The reduction, as for `allreduce`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The reduction over the ranks before this one, shaped like `x` (zeros on rank 0). For
        a pytree, the same structure, each leaf's result in its place.

    Derivative:
        For SUM only (other ops raise NotImplementedError): linear; reverse mode gives rank
        s the sum of the cotangents of the ranks after it (an allreduce minus a scan).
        `vmap`: one MPI call.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; `op` is no reduction, or one not defined on `x`'s dtype.
        ValueError: `comm` is freed, `COMM_NULL` or an intercommunicator; or the op
            is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls
            differ. Inside your own jitted function JAX raises its own error instead;
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
def reduce_scatter(x: PyTree, op: OpArg, *, comm: CommArg = None) -> PyTree:
    """Reduces slice r of every rank's `x` with `op` and gives it to rank r.

    MPI_Reduce_scatter_block, collective: every rank calls it with the same shape, dtype and
    `op`.

    Args:
        x: Shape `(size, ...)`: one slice per rank of `comm`, along the leading axis. Or a
            pytree of them, moved as one: one MPI call per dtype.
        op: The reduction, as for `allreduce`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The reduction over the ranks of slice `rank`, shaped like `x[0]`. For a pytree, the
        same structure, each leaf's result in its place.

    Derivative:
        For SUM only (other ops raise NotImplementedError): linear; its transpose is an
        allgather of the cotangents. `vmap`: one MPI call, the batch axis behind the rank
        axis.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; `op` is no reduction, or one not defined on `x`'s dtype.
        ValueError: `x`'s leading axis is not the size of `comm`; `comm` is freed,
            `COMM_NULL` or an intercommunicator; or the op is in a program over several
            devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls
            differ. Inside your own jitted function JAX raises its own error instead;
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
    return _reduction(prim.reduce_scatter, "reduce_scatter", x, op, comm, keep=1)
