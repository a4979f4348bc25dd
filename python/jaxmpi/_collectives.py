"""The collectives users call that move data without reducing it: bcast, gather, allgather,
scatter, alltoall, and barrier. Each checks its arguments at trace time (`_args.py`,
`_comm.py`), then binds its primitive (declared in `_binding/primitives.py`)."""

from __future__ import annotations

import jax

from ._args import check_rank, leading_axis_is_size
from ._binding import primitives as prim
from ._comm import CommArg, at_root, resolve_comm
from ._errors import raise_mpi_errors
from ._requests import apply
from ._token import refuses_token
from ._trees import PyTree, Tree, each_group


@refuses_token
@raise_mpi_errors()
def bcast(x: PyTree, root: int, *, comm: CommArg = None) -> PyTree:
    """Sends `root`'s `x` to every rank.

    MPI_Bcast, collective: every rank calls it with the same shape, dtype and `root`. Away
    from the root `x` is a template: only its shape and dtype matter, its values are never
    read (nor computed, if nothing else uses them).

    Args:
        x: At `root`, the array to send; elsewhere, an array of the same shape and dtype. Or
            a pytree of them, moved as one: one MPI call per dtype.
        root: The sending rank: a static int in `[0, size)`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        `root`'s `x`, on every rank (at the root, `x` itself). For a pytree, the same
        structure, each leaf's result in its place.

    Derivative:
        Linear: the tangent is broadcast too. Reverse mode sums every rank's cotangent at
        the root (a reduce). `vmap`: one MPI call.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; `root` is not a static int.
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
            x = jnp.arange(3.0) if rank == 0 else jnp.zeros(3)
            print(rank, jaxmpi.bcast(x, root=0))

        .. output::

            0 [0. 1. 2.]
            1 [0. 1. 2.]
    """
    tree = Tree(x, "bcast")
    c = resolve_comm(comm, "bcast")
    root = check_rank(root, c.size, "root", "bcast")

    def call(x: jax.Array, fingerprint: int) -> jax.Array | None:
        outs = apply(
            prim.bcast, x, comm=c.handle, root=root, at_root=at_root(c, root), tree=fingerprint
        )
        return outs[0] if outs else None

    return each_group(tree, 0, call)


@refuses_token
@raise_mpi_errors()
def gather(x: PyTree, root: int, *, comm: CommArg = None) -> PyTree:
    """Stacks every rank's `x` at `root`, in rank order.

    MPI_Gather, collective: every rank calls it with the same shape, dtype and `root`.

    Args:
        x: This rank's array, any shape and supported dtype. Or a pytree of them, moved as
            one: one MPI call per dtype.
        root: The rank that gets the stack: a static int in `[0, size)`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        At `root`, shape `(size, *x.shape)`, row r from rank r; elsewhere `x` itself, or,
        inside `shard_map` and on a MeshComm (one program for every rank), zeros of the
        root's shape. For a pytree, the same structure, each leaf's result in its place.

    Derivative:
        Linear; reverse mode sends row r of the root's cotangent back to rank r (a scatter).
        `vmap`: one MPI call.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; `root` is not a static int.
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
            print(rank, jaxmpi.gather(jnp.array(10 * rank), root=0).tolist())

        .. output::

            0 [0, 10]
            1 10
    """
    tree = Tree(x, "gather")
    c = resolve_comm(comm, "gather")
    root = check_rank(root, c.size, "root", "gather")

    def call(x: jax.Array, fingerprint: int) -> jax.Array | None:
        outs = apply(
            prim.gather,
            x,
            comm=c.handle,
            root=root,
            size=c.size,
            at_root=at_root(c, root),
            tree=fingerprint,
        )
        return outs[0] if outs else None

    return each_group(tree, 0, call)


@refuses_token
@raise_mpi_errors()
def allgather(x: PyTree, *, comm: CommArg = None) -> PyTree:
    """Stacks every rank's `x` on every rank, in rank order.

    MPI_Allgather, collective: every rank calls it with the same shape and dtype.

    Args:
        x: This rank's array, any shape and supported dtype. Or a pytree of them, moved as
            one: one MPI call per dtype.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        Every rank's `x` stacked along a new leading axis, row r from rank r (shape `(size,
        *x.shape)`). For a pytree, the same structure, each leaf's result in its place.

    Derivative:
        Linear; its transpose sums the cotangents of row r over the ranks and gives them to
        rank r (a reduce_scatter). `vmap`: one MPI call.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator.
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
            print(rank, jaxmpi.allgather(jnp.array([rank, -rank])).tolist())

        .. output::

            0 [[0, 0], [1, -1]]
            1 [[0, 0], [1, -1]]
    """
    tree = Tree(x, "allgather")
    c = resolve_comm(comm, "allgather")

    def call(x: jax.Array, fingerprint: int) -> jax.Array:
        (y,) = apply(prim.allgather, x, comm=c.handle, size=c.size, tree=fingerprint)
        return y

    return each_group(tree, 0, call)


@refuses_token
@raise_mpi_errors()
def scatter(x: PyTree, root: int, *, comm: CommArg = None) -> PyTree:
    """Sends row r of `root`'s `x` to rank r.

    MPI_Scatter, collective: every rank calls it with the same dtype and `root`.

    Args:
        x: At `root`, shape `(size, ...)`: one row per rank. Elsewhere a template shaped
            like one row (`x.shape[1:]` of the root's), or, inside `shard_map` and on a
            MeshComm (one program for every rank), shaped like the root's: its values are
            never read. Or a pytree of them, moved as one: one MPI call per dtype.
        root: The sending rank: a static int in `[0, size)`.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        This rank's row of the root's `x`. For a pytree, the same structure, each leaf's
        result in its place.

    Derivative:
        Linear; reverse mode gathers the cotangents at the root (a gather). `vmap`: one MPI
        call.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; `root` is not a static int.
        ValueError: At the root, `x`'s leading axis is not the size of `comm`; `root` is not
            a rank of `comm`; `comm` is freed, `COMM_NULL` or an intercommunicator; or the
            op is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time, or, with `JAXMPI_CHECK=1`, the ranks' calls
            differ. Inside your own jitted function JAX raises its own error instead;
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
    tree = Tree(x, "scatter")
    c = resolve_comm(comm, "scatter")
    root = check_rank(root, c.size, "root", "scatter")
    root_here = at_root(c, root)
    if root_here is not False:
        tree.check(
            lambda leaf, path: leading_axis_is_size(leaf, c.size, "scatter", "Scatter", path)
        )

    def call(x: jax.Array, fingerprint: int) -> jax.Array:
        (y,) = apply(prim.scatter, x, comm=c.handle, root=root, at_root=root_here, tree=fingerprint)
        return y

    # The root's leaves have the rank axis in front, the others' are the slice's shape.
    return each_group(tree, 0 if root_here is False else 1, call)


@refuses_token
@raise_mpi_errors()
def alltoall(x: PyTree, *, comm: CommArg = None) -> PyTree:
    """Every rank sends row r of its `x` to rank r and gets one row from each rank.

    MPI_Alltoall, collective: every rank calls it with the same shape and dtype.

    Args:
        x: Shape `(size, ...)`: row r goes to rank r. Or a pytree of them, moved as one: one
            MPI call per dtype.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        Shaped like `x`, row r being what rank r sent to this rank. For a pytree, the same
        structure, each leaf's result in its place.

    Derivative:
        Linear; its transpose is an alltoall of the cotangents. `vmap`: one MPI call, the
        batch axis behind the rank axis.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator.
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
            print(rank, jaxmpi.alltoall(jnp.array([0, 1]) + 10 * rank))

        .. output::

            0 [ 0 10]
            1 [ 1 11]
    """
    tree = Tree(x, "alltoall")
    c = resolve_comm(comm, "alltoall")
    tree.check(lambda leaf, path: leading_axis_is_size(leaf, c.size, "alltoall", "Alltoall", path))

    def call(x: jax.Array, fingerprint: int) -> jax.Array:
        (y,) = apply(prim.alltoall, x, comm=c.handle, tree=fingerprint)
        return y

    return each_group(tree, 1, call)


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
