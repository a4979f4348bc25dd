"""Communicators, reduction ops and peers: what users pass in (mpi4py objects or jaxmpi's
own), checked at trace time and turned into the raw values the handlers read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from . import _native
from ._binding import jax_shim
from ._errors import raise_mpi_errors
from ._mesh_comm import MeshComm
from ._runtime.encodings import OP_USER, PREDEFINED_OPS
from ._runtime.library import info, loaded_mpi4py

# The loaded library's own values, so they equal mpi4py's MPI.ANY_SOURCE etc. (the handlers
# read the portable encodings instead, `_runtime/encodings.py`).
ANY_SOURCE: int = info["any_source"]
PROC_NULL: int = info["proc_null"]
ANY_TAG: int = info["any_tag"]


#: What the public API accepts as `comm`: a `jaxmpi.Comm`, an `mpi4py.MPI.Intracomm`, or
#: None (the default communicator). Any: mpi4py is optional.
CommArg: TypeAlias = Any
#: What it accepts as a reduction: `jaxmpi.SUM` etc. or an `mpi4py.MPI.Op`.
OpArg: TypeAlias = Any
#: What receives accept as `status`: an `mpi4py.MPI.Status`, or None.
StatusArg: TypeAlias = Any


class Comm:
    """An MPI intracommunicator, for programs without mpi4py.

    jaxmpi's own handle on an MPI_Comm, with the few mpi4py methods jaxmpi programs use,
    under mpi4py's names. Get one from `jaxmpi.COMM_WORLD`, `Dup` or `Split`; pass it as
    `comm=` to any op. mpi4py's communicators work wherever this one does. The methods run
    at once, on the host: inside `jax.jit` they run while tracing, not in the program.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            world = jaxmpi.COMM_WORLD
            own = world.Dup()  # same ranks, messages of its own
            total = jaxmpi.allreduce(jnp.ones(2), jaxmpi.SUM, comm=own)
            print(world.Get_rank(), world.Get_size(), total)
            own.Free()

        .. output::

            0 2 [2. 2.]
            1 2 [2. 2.]
    """

    def __init__(self, handle: int):
        self._handle = handle
        self._freed = False

    @property
    def handle(self) -> int:
        """The MPI_Comm handle as an int, as mpi4py's `Comm.handle` gives it (raises
        ValueError once the communicator is freed)."""
        if self._freed:
            raise ValueError(
                f"{self!r} was freed (Comm.Free()); use a communicator that is still alive"
            )
        return self._handle

    @raise_mpi_errors()
    def Get_rank(self) -> int:
        """This process's rank in the communicator (MPI_Comm_rank).

        Returns:
            An int from 0 to `Get_size() - 1`.

        Raises:
            ValueError: The communicator was freed.
            MPIError: MPI failed.

        Example:
            .. mpirun::

                import jaxmpi

                print(jaxmpi.COMM_WORLD.Get_rank())

            .. output::

                0
                1
        """
        return _native.comm_rank(self.handle)

    @raise_mpi_errors()
    def Get_size(self) -> int:
        """The number of ranks in the communicator (MPI_Comm_size).

        Returns:
            A positive int.

        Raises:
            ValueError: The communicator was freed.
            MPIError: MPI failed.

        Example:
            .. mpirun::

                import jaxmpi

                print(jaxmpi.COMM_WORLD.Get_size())

            .. output::

                2
                2
        """
        return _native.comm_size(self.handle)

    @raise_mpi_errors()
    def Dup(self) -> Comm:
        """A new communicator of the same ranks, with a message space of its own.

        MPI_Comm_dup, collective: every rank of the communicator calls it. Messages on the
        copy never match messages on the original, so a library or a thread can have its
        own. `Clone` is the same method (mpi4py's other name for it). Free it when done.

        Returns:
            The new `Comm`.

        Raises:
            ValueError: The communicator was freed.
            MPIError: MPI failed.

        Example:
            .. mpirun::

                import jaxmpi

                copy = jaxmpi.COMM_WORLD.Dup()
                print(copy.Get_rank(), copy == jaxmpi.COMM_WORLD)
                copy.Free()

            .. output::

                0 False
                1 False
        """
        return Comm(_native.comm_dup(self.handle))

    Clone = Dup

    @raise_mpi_errors()
    def Split(self, color: int | None = 0, key: int = 0) -> Comm | None:
        """Splits the communicator into one new communicator per `color`.

        MPI_Comm_split, collective: every rank calls it. Ranks passing the same `color`
        form a communicator, ranked by `key` (ties by their rank here), as mpi4py's
        `Split(color=0, key=0)`.

        Args:
            color: A non-negative int; ranks with the same one end up together. None
                (MPI_UNDEFINED) leaves this rank out.
            key: Orders the ranks of the new communicator (default 0: as they are here).

        Returns:
            This rank's new `Comm`, or None where `color` is None.

        Raises:
            TypeError: `color` or `key` is not an int (or None for `color`).
            ValueError: `color` is negative, or the communicator was freed.
            MPIError: MPI failed.

        Example:
            .. mpirun::

                import jaxmpi

                rank = jaxmpi.COMM_WORLD.Get_rank()
                alone = jaxmpi.COMM_WORLD.Split(color=rank)  # one communicator per rank
                print(rank, alone.Get_rank(), alone.Get_size())
                alone.Free()

            .. output::

                0 0 1
                1 0 1
        """
        handle = _native.comm_split(self.handle, color, key)
        return None if handle is None else Comm(handle)

    @raise_mpi_errors()
    def Free(self) -> None:
        """Frees the communicator (MPI_Comm_free, collective: every rank calls it).

        Afterwards every use of it, by an op or a method, raises ValueError. Free the
        communicators you made (`Dup`, `Split`), not `COMM_WORLD`.

        Raises:
            ValueError: It was freed already.
            MPIError: MPI failed.

        Example:
            .. mpirun::

                import jaxmpi

                comm = jaxmpi.COMM_WORLD.Dup()
                comm.Free()
                try:
                    comm.Get_rank()
                except ValueError:
                    print("freed")

            .. output::

                freed
                freed
        """
        _native.comm_free(self.handle)
        self._freed = True

    @raise_mpi_errors()
    def Barrier(self) -> None:
        """Waits until every rank of the communicator has called it (MPI_Barrier).

        Runs at once, on the host; inside `jax.jit` use `jaxmpi.barrier`, which runs in
        the program.

        Raises:
            ValueError: The communicator was freed.
            MPIError: MPI failed.

        Example:
            .. mpirun::

                import jaxmpi

                jaxmpi.COMM_WORLD.Barrier()
                print("everyone is here")

            .. output::

                everyone is here
                everyone is here
        """
        _native.barrier(self.handle)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Comm) and other._handle == self._handle

    def __hash__(self) -> int:
        return hash(self._handle)

    def __repr__(self) -> str:
        return f"jaxmpi.Comm({self._handle:#x})"


COMM_WORLD = Comm(_native.world())


@dataclass(frozen=True)
class Op:
    """One of MPI's predefined reductions, for programs without mpi4py.

    The values are `jaxmpi.SUM`, `PROD`, `MIN`, `MAX`, `LAND`, `LOR`, `LXOR`, `BAND`,
    `BOR` and `BXOR` (see each for its dtypes and derivative); pass one as the `op` of
    `allreduce`, `reduce`, `scan`, `exscan` or `reduce_scatter`. mpi4py's `MPI.SUM`, ...,
    and user-defined `MPI.Op.Create` ops are accepted too.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            print(jaxmpi.MAX, jaxmpi.allreduce(jnp.array([rank, -rank]), jaxmpi.MAX))

        .. output::

            jaxmpi.MAX [1 0]
            jaxmpi.MAX [1 0]
    """

    name: str

    def __repr__(self) -> str:
        return f"jaxmpi.{self.name}"


OPS = {name: Op(name) for name in PREDEFINED_OPS}


def _clone_world() -> CommArg:
    mpi = loaded_mpi4py()
    return mpi.COMM_WORLD.Clone() if mpi is not None else COMM_WORLD.Clone()


# A clone of the world communicator, so jaxmpi's traffic never matches the user's own
# messages on COMM_WORLD (mpi4jax's convention). Made at import, which every rank does:
# made lazily, the first op would have to be a collective, or a program starting with a
# send on some ranks only would hang in the clone.
_default_comm = _clone_world()


def default_comm() -> CommArg:
    return _default_comm


@dataclass(frozen=True)
class CommInfo:
    """A communicator as an op sees it at trace time; `rank` is None on a MeshComm, where
    one trace serves every device (each its own rank)."""

    handle: int
    rank: int | None
    size: int
    #: A MeshComm's mesh axes, along which `jax.lax.axis_index` is the rank.
    axes: tuple[str, ...] | None = None

    def rank_value(self) -> Any:
        """This rank: an int, or on a MeshComm the traced rank of the device."""
        if self.rank is not None:
            return self.rank
        import jax

        return jax.lax.axis_index(self.axes)


def at_root(c: CommInfo, root: int) -> bool | None:
    """Whether this rank is `root`; None where one program must serve every rank: on a
    MeshComm, and inside shard_map on any communicator (the rooted ops' shape rules then
    bind the root's result on every rank, so that JAX's collectives beside them see the
    same program everywhere)."""
    if c.rank is None or jax_shim.in_shard_map():
        return None
    return c.rank == root


def trace_rank(c: CommInfo, op: str) -> int:
    """This rank, for ops whose shapes depend on it at trace time."""
    if c.rank is None:
        raise ValueError(
            f"jaxmpi.{op}: with static counts its shapes depend on the rank, which on a "
            "MeshComm differs per device of one trace: give the counts as an array and "
            "recv_capacity= (the form whose counts are read at run time)"
        )
    return c.rank


def resolve_comm(comm: CommArg, op: str) -> CommInfo:
    if comm is None:
        comm = default_comm()
    if isinstance(comm, MeshComm):
        return CommInfo(comm.handle, None, comm.size, comm.axis_names)
    mpi = loaded_mpi4py()
    if isinstance(comm, Comm):
        try:
            handle = comm.handle
        except ValueError as err:
            raise ValueError(f"jaxmpi.{op}: {err}") from None
    elif mpi is not None and isinstance(comm, mpi.Comm):
        if comm == mpi.COMM_NULL:
            raise ValueError(
                f"jaxmpi.{op}: comm is MPI.COMM_NULL (a freed or never-created communicator)"
            )
        try:
            inter = comm.Is_inter()
        except mpi.Exception as err:
            raise ValueError(
                f"jaxmpi.{op}: MPI does not accept the communicator (was it freed?): {err}"
            ) from None
        if inter:
            raise ValueError(
                f"jaxmpi.{op}: comm is an intercommunicator; jaxmpi ops need an intracommunicator"
            )
        handle = comm.handle
    else:
        raise TypeError(
            f"jaxmpi.{op}: comm must be an mpi4py.MPI.Intracomm or a jaxmpi.Comm, got {type(comm).__name__}"
        )
    handle &= (1 << 64) - 1  # mpi4py may give MPICH's negative handles as negative ints
    try:
        rank, size = _native.comm_info(handle)
    except ValueError as err:
        raise ValueError(f"jaxmpi.{op}: {err}") from None
    return CommInfo(handle, rank, size)


def resolve_op(op: OpArg, dtype: Any, opname: str) -> tuple[int, int]:
    """(op code, raw user-op handle) for the handlers; refuses ops undefined on dtype."""
    name = None
    if isinstance(op, Op):
        name = op.name
    else:
        mpi = loaded_mpi4py()
        if mpi is None or not isinstance(op, mpi.Op):
            raise TypeError(
                f"jaxmpi.{opname}: op must be an mpi4py.MPI.Op or jaxmpi.SUM etc., got {op!r}"
            )
        if op == mpi.OP_NULL:
            raise ValueError(f"jaxmpi.{opname}: op is MPI.OP_NULL")
        name = next((n for n in PREDEFINED_OPS if op == getattr(mpi, n)), None)
        if name is None:
            if op.is_predefined:
                raise ValueError(
                    f"jaxmpi.{opname}: the predefined op {op!r} is not supported; use one of {PREDEFINED_OPS}"
                )
            return OP_USER, op.handle & ((1 << 64) - 1)
    if not _native.op_supports(name, dtype.name):
        raise TypeError(f"jaxmpi.{opname}: MPI.{name} is not defined on {dtype.name} arrays")
    return PREDEFINED_OPS.index(name), 0
