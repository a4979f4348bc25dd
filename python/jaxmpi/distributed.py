"""Starting `jax.distributed` from the MPI job itself: one JAX process per MPI rank, JAX's
process index equal to the rank in `jaxmpi.COMM_WORLD`, whatever launcher started the
job (no SLURM or launcher variables read, by jaxmpi or by JAX's cluster detection; no
mpi4py needed)."""

from __future__ import annotations

import socket
from typing import Any

import jax

from . import _native
from ._binding import hlo_pass, jax_collectives, placement

# What `initialize` decides itself, from the MPI job.
_SET_HERE = ("coordinator_address", "num_processes", "process_id")
# Room for a host name (at most 253 bytes) and a port: the address travels padded to it.
_ADDRESS_BYTES = 300


def _free_port() -> int:
    """A port nobody listens on now, for JAX's coordinator (started moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def _coordinator_address(one_host: bool) -> str:
    host = "127.0.0.1" if one_host else socket.getfqdn()
    return f"{host}:{_free_port()}"


def initialize(collectives: str = "auto", **kwargs: Any) -> None:
    """Starts `jax.distributed` from the MPI job: one JAX process per MPI rank.

    Process id = this rank in MPI's world, process count = the world's size, and a
    coordinator on rank 0: a free port on loopback when every rank is on one host, else
    on rank 0's host name, its address sent to the other ranks over MPI. No launcher or
    Slurm variables are read, and no mpi4py is needed. Collective over the world: every
    rank calls it, before any JAX computation.

    Args:
        collectives: What JAX's own collectives on the CPU run over (psum, all_gather,
            ppermute, ragged_all_to_all in `shard_map`, and those XLA inserts into sharded
            programs): "jaxmpi", jaxmpi's own calls over the job's MPI, put in place of
            every collective of a program by a pass over it (JAX >= 0.10.2; any number of
            CPU devices per process); "mpi", XLA's MPI backend over jaxmpi's library (one
            CPU device per process); "gloo", JAX's TCP default; "auto" (the default), the
            first of those that works here. `python -m jaxmpi info` says which is used and
            why.
        **kwargs: Passed to `jax.distributed.initialize` unchanged (e.g.
            `initialization_timeout`, `local_device_ids`); not `coordinator_address`,
            `num_processes` or `process_id`, which come from the MPI job.

    Raises:
        TypeError: `coordinator_address`, `num_processes` or `process_id` was passed.
        ValueError: `collectives` is not "auto", "jaxmpi", "mpi" or "gloo".
        RuntimeError: `collectives="mpi"` where MPI cannot serve JAX's collectives (the
            message says why); JAX's process index or count does not match MPI's; or
            what `jax.distributed.initialize` raises (started twice, say).

    Example:
        .. mpirun::
            :process: own

            import jax
            import jaxmpi

            jaxmpi.distributed.initialize()
            print(jax.process_index(), jax.process_count())

        .. output::

            0 2
            1 2
    """
    taken = [name for name in _SET_HERE if name in kwargs]
    if taken:
        raise TypeError(
            f"jaxmpi.distributed.initialize: {', '.join(taken)} is set from the MPI job "
            "(rank 0's host, the world's size, this rank); leave it out, or call "
            "jax.distributed.initialize yourself"
        )
    route, why = jax_collectives.choose(collectives, kwargs.get("local_device_ids"))
    implementation = jax_collectives.UNDER_THE_PASS if route == "jaxmpi" else route
    jax.config.update("jax_cpu_collectives_implementation", implementation)
    world = _native.world()
    rank, size = _native.comm_rank(world), _native.comm_size(world)
    _, node_size = _native.node_local_rank(world)  # collective: every rank asks
    address = _coordinator_address(node_size == size) if rank == 0 else ""
    sent = _native.bcast_bytes(world, address.encode().ljust(_ADDRESS_BYTES, b"\0"), 0)
    chosen = sent.rstrip(b"\0").decode()
    # Else JAX's cluster detection fills in local_device_ids from SLURM_LOCALID, which
    # ranks that mpirun/mpiexec started under salloc inherit from the launcher's daemons (0
    # for every rank of a node): every rank of a node would get GPU 0, over jaxmpi's choice.
    kwargs.setdefault("cluster_detection_method", "deactivate")
    jax.distributed.initialize(
        coordinator_address=chosen, num_processes=size, process_id=rank, **kwargs
    )
    if (jax.process_index(), jax.process_count()) != (rank, size):
        raise RuntimeError(
            f"jaxmpi.distributed.initialize: JAX reports process {jax.process_index()} of "
            f"{jax.process_count()}, MPI rank {rank} of {size}"
        )
    placement.process_index_is_world_rank = True
    if route == "jaxmpi":
        hlo_pass.install()
    elif route == "mpi":
        jax_collectives.refuse_programs_over_some_processes()
    jax_collectives.chosen = (route, why)


def collectives() -> str:
    """The route JAX's own collectives take in this process.

    "jaxmpi" (jaxmpi's pass hands every collective of a program to jaxmpi's calls),
    "mpi" (XLA's MPI backend over jaxmpi's library) or "gloo", as `initialize` chose it;
    before `initialize`, the route its default would take here. `python -m jaxmpi info`
    says why.

    Returns:
        "jaxmpi", "mpi" or "gloo".

    Example:
        .. mpirun::
            :process: own

            import jaxmpi.distributed

            print(jaxmpi.distributed.collectives())  # before initialize: what it would take

        .. output::

            jaxmpi
            jaxmpi
    """
    return jax_collectives.explain()[0]


__all__ = ["collectives", "initialize"]
