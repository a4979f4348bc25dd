"""Communicators whose ranks are devices: `MeshComm`, for jaxmpi's ops inside a
`shard_map` whose processes drive several devices each (the Rust side is the device-rank
layer, core/src/xla/mesh/, which JAX's own collectives take too)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from . import _native
from ._binding import jax_collectives, placement


class MeshComm:
    """A communicator whose ranks are the devices of a mesh, for jaxmpi's ops inside
    `jax.shard_map` over that mesh, whatever the number of devices per process.

    Rank r is the mesh's r-th device in mesh order (row-major over `mesh.devices`). With
    `axis_names`, the communicator is one per slice of the other axes, as `Split` would
    give: its ranks are the slice's devices, ordered along `axis_names` (so
    `MeshComm(mesh, "x")` is the ranks along axis `x`, `jax.lax.axis_index("x")`).

    Between two devices of one process a message is a copy; between processes, MPI: a
    collective is the devices of each process combining their parts, then one MPI
    collective among the processes. So a reduction's last bits follow the layout; with
    `JAXMPI_MESH_REDUCTIONS=ordered` every element is combined in rank order instead, the
    same bits on 4 processes of 1 device, 2 of 2 or 1 of 4.

    One trace serves every device of a process, so nothing rank-dependent may be decided
    at trace time: `Get_rank()` is the rank as a traced value (inside `shard_map`), peers
    are given per rank (`dest=lambda r: (r + 1) % n`, or a list with one entry per rank),
    and the rooted ops (`bcast`, `reduce`, `gather`, `scatter`) return a result on every
    device: the root's is the op's; elsewhere `reduce` returns the operand, `bcast` the
    root's data, `gather` zeros, `scatter` needs the root's shape on every device.

    Constructing one is collective over the processes of the mesh, as
    `MPI_Comm_create_group` is: each of them builds the same MeshComm, in the same order
    as the others, from one thread (it makes the communicators among them there, so that
    whatever path each device takes later, no process waits for another's).

    Args:
        mesh: A `jax.sharding.Mesh` over devices of this job (all of them for MPI's
            processes to agree: each process builds the same mesh).
        axis_names: The mesh axes the ranks run along (one name or several); None
            (default): every axis.

    Raises:
        ValueError: `axis_names` names no axis of the mesh; or several JAX processes
            that `jaxmpi.distributed.initialize` did not start (a process's index must
            be its MPI rank); or JAX's own collectives run over gloo
            (`collectives="gloo"`), which nothing orders against a MeshComm's ops (a
            program holding both could deadlock).
        jaxmpi.MPIError: a process of the mesh holds several devices and MPI was
            initialized below `MPI_THREAD_MULTIPLE` (each device calls MPI from its own
            thread); or MPI failed to make the communicators.

    Example:
        .. mpirun::
            :process: meshcomm

            import jax, numpy as np
            import jaxmpi, jaxmpi.distributed
            from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

            jax.config.update("jax_num_cpu_devices", 2)  # 2 processes x 2 devices
            jaxmpi.distributed.initialize()
            mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("p", "d"))
            comm = jaxmpi.MeshComm(mesh)  # ranks 0 to 3
            pairs = jaxmpi.MeshComm(mesh, "d")  # two of 2 ranks: each process's devices
            blocks = P(("p", "d"))

            def body(x):
                every = jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm)
                return every, jaxmpi.allreduce(x, jaxmpi.SUM, comm=pairs)

            f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=blocks, out_specs=blocks))
            local = np.arange(2.0) + 2 * jax.process_index()
            x = jax.make_array_from_process_local_data(NamedSharding(mesh, blocks), local)
            every, pair = f(x)
            print(jax.process_index(), every.addressable_data(0), pair.addressable_data(0))

        .. output::

            0 [6.] [1.]
            1 [6.] [5.]
    """

    def __init__(self, mesh: jax.sharding.Mesh, axis_names: str | Sequence[str] | None = None):
        names = tuple(mesh.axis_names)
        if axis_names is None:
            chosen = names
        elif isinstance(axis_names, str):
            chosen = (axis_names,)
        else:
            chosen = tuple(axis_names)
        unknown = [a for a in chosen if a not in names]
        if unknown or not chosen:
            raise ValueError(
                f"jaxmpi.MeshComm: axis_names {axis_names!r} must name axes of the mesh {names}"
            )
        _give_device_owners()
        ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(np.asarray(mesh.devices))
        others = [names.index(a) for a in names if a not in chosen]
        order = others + [names.index(a) for a in chosen]
        size = int(np.prod([mesh.shape[a] for a in chosen]))
        groups = np.transpose(ids, order).reshape(-1, size)
        self.mesh = mesh
        self.axis_names = chosen
        self.size = size
        self.handle = _native.mesh_comm(groups.tolist())
        placement.MESH_COMM_DEVICES[self.handle] = frozenset(ids.flat)

    def Get_size(self) -> int:
        """The number of ranks: the devices of the mesh (along `axis_names`).

        Returns:
            An int.

        Example:
            .. mpirun::
                :process: meshcomm

                print(comm.Get_size(), pairs.Get_size())

            .. output::

                4 2
                4 2
        """
        return self.size

    def Get_rank(self) -> jax.Array:
        """This device's rank, as a traced value: call it inside `shard_map` over the
        communicator's mesh (outside it, a ValueError says so).

        Returns:
            An int32 scalar, the device's index along `axis_names` (`jax.lax.axis_index`).

        Derivative:
            An integer: no tangent, and nothing to transpose; under `vmap`, the same rank
            for every element of the batch.

        Example:
            .. mpirun::
                :process: meshcomm

                ranks = jax.jit(
                    jax.shard_map(
                        lambda x: x + comm.Get_rank(), mesh=mesh, in_specs=blocks, out_specs=blocks
                    )
                )(x * 0)
                print(jax.process_index(), [s.data.tolist() for s in ranks.addressable_shards])

            .. output::

                0 [[0.0], [1.0]]
                1 [[2.0], [3.0]]
        """
        try:
            return jax.lax.axis_index(self.axis_names)
        except NameError:
            raise ValueError(
                "jaxmpi.MeshComm.Get_rank: the rank differs per device, so it is known only "
                "inside jax.shard_map over the communicator's mesh (a traced value there)"
            ) from None

    def __repr__(self) -> str:
        return f"MeshComm(axes={self.axis_names}, size={self.size}, id={self.handle})"


def _give_device_owners() -> None:
    """The handlers name a device's process by its MPI world rank: JAX's process index,
    where jaxmpi.distributed.initialize started JAX (or a single process runs). Refuses
    JAX's collectives over gloo: XLA orders them against each other, and jaxmpi's calls
    against each other, but nothing orders one against the other (a device in gloo's
    all-reduce, the other in a MeshComm's, each waiting for the other)."""
    if jax.process_count() > 1 and not placement.process_index_is_world_rank:
        raise ValueError(
            "jaxmpi.MeshComm: JAX's processes must be MPI's ranks: start JAX with "
            "jaxmpi.distributed.initialize()"
        )
    if jax_collectives.chosen is not None and jax_collectives.chosen[0] == "gloo":
        raise ValueError(
            "jaxmpi.MeshComm: JAX's own collectives run over gloo here, and nothing puts "
            "them in one order with a MeshComm's ops (a program holding both can hang): "
            'start JAX with jaxmpi.distributed.initialize(collectives="jaxmpi"), which '
            "hands JAX's collectives to jaxmpi too"
        )
    _native.set_device_owners([(d.id, d.process_index) for d in jax.devices()])
