"""Where an MPI op may run in a program over several devices (jax.distributed, shard_map),
checked when the op is lowered: on one process's block, one local device per process, one
process per MPI rank, and in a program every rank of its communicator runs. Anything else
would have several threads call MPI on one communicator, or wait forever for ranks that
never run the program; each refusal says what to do instead."""

from __future__ import annotations

import jax

from .. import _native
from .._runtime.library import loaded_mpi4py

ONE_PROCESS_PER_DEVICE = (
    "Pass comm=jaxmpi.MeshComm(mesh), a communicator whose ranks are the mesh's devices, or "
    "run one process per device"
)


def is_mesh_comm(comm: int) -> bool:
    """Whether a program's communicator id names a MeshComm (negative; an MPI
    communicator's is positive): the one place of the rule in Python, as
    `core/src/xla/mesh/mesh_comms.rs::is_mesh_comm` is in Rust."""
    return comm < 0


def check_sharded(
    op: str, comm: int | None, devices: int, shared_by: int, named: tuple | None
) -> None:
    """Refuses, at lowering, an MPI op in a program over several devices (`devices`) unless
    it acts on one process's block: inside a shard_map manual over every mesh axis
    (`shared_by` == 1), one local device per process, one process per MPI rank; and an op
    on `comm` in a program that some of the communicator's ranks run and others never do
    (`named`: the program's devices, if known). On a MeshComm, one block per device, and
    the communicator's devices are the program's."""
    if comm is not None and is_mesh_comm(comm):  # its ranks are the devices
        _check_one_block_per_device(op, devices, shared_by)
        _check_mesh_comm_devices(op, comm, devices, named)
        return
    processes = None if named is None else frozenset(d.process_index for d in named)
    if devices > 1:
        _check_one_block_per_process(op, devices, shared_by)
    if processes is None or comm is None or processes == {jax.process_index()}:
        return  # this process's own program, as every program is without jax.distributed
    _check_program_runs_on_every_rank(op, comm, processes)


def _check_one_block_per_device(op: str, devices: int, shared_by: int) -> None:
    if shared_by > 1:
        raise ValueError(
            f"jaxmpi.{op}: its operand is a global array spread over {shared_by} of the "
            f"program's {devices} devices (a jitted program over sharded arrays, or a "
            "shard_map that leaves a mesh axis automatic); an MPI op acts on one process's "
            "local block. Call it inside jax.shard_map, manual over every mesh axis "
            "(the default), so that it sees each process's block."
        )


def _check_one_block_per_process(op: str, devices: int, shared_by: int) -> None:
    _check_one_block_per_device(op, devices, shared_by)
    local = jax.local_device_count()
    if local != 1:
        raise ValueError(
            f"jaxmpi.{op}: inside a program over {devices} devices with {local} local "
            "devices in this process: each device would call MPI on the same communicator "
            f"from its own thread, in no agreed order. {ONE_PROCESS_PER_DEVICE}."
        )
    processes, ranks = jax.process_count(), _native.comm_size(_native.world())
    if processes != ranks:
        raise ValueError(
            f"jaxmpi.{op}: inside a program over {devices} devices, but JAX has "
            f"{processes} processes and MPI's world {ranks} ranks: start jax.distributed "
            "with one process per MPI rank (jaxmpi.distributed.initialize() does)."
        )


# Every MeshComm's devices (global ids), by its id: set when it is made.
MESH_COMM_DEVICES: dict[int, frozenset[int]] = {}


def _check_mesh_comm_devices(op: str, comm: int, devices: int, named: tuple | None) -> None:
    """A MeshComm's ranks are devices: every one of them must run the program (`devices`
    of them, `named` where the lowering names them), and every device of the program must
    be one of them."""
    ranks = MESH_COMM_DEVICES.get(comm)
    if ranks is None:
        return
    program = frozenset(d.id for d in named) if named is not None else None
    left_out = len(ranks) - devices if program is None else len(ranks - program)
    if left_out > 0:
        which = "" if program is None else f" (ids {_listed(ranks - program)})"
        raise ValueError(
            f"jaxmpi.{op}: its MeshComm's ranks are {len(ranks)} devices, of which "
            f"{left_out}{which} never run this program (over {devices} devices), and the op "
            "would wait for them forever: call it inside jax.shard_map over the "
            "communicator's mesh"
        )
    if program is None or program <= ranks:
        return
    raise ValueError(
        f"jaxmpi.{op}: devices {_listed(program - ranks)} run this program but are no rank "
        f"of its MeshComm ({len(ranks)} devices): make the MeshComm from the mesh the "
        "shard_map runs on"
    )


# Set by jaxmpi.distributed.initialize: every process's JAX process index is its MPI world
# rank, so a mesh's processes can be compared with a communicator's members. Started by
# hand, jax.distributed may number its processes otherwise (README says how to map them).
process_index_is_world_rank = False


def _check_program_runs_on_every_rank(op: str, comm: int, processes: frozenset[int]) -> None:
    """A program over the devices of some processes runs only there: an op in it waits for
    the ranks of `comm` whose process owns none of those devices."""
    mesh = f"the devices of processes {_listed(processes)} only"
    size, world_size = _native.comm_size(comm), _native.comm_size(_native.world())
    if size == world_size:  # every process holds a rank of it, whatever their numbering
        left_out = frozenset(range(jax.process_count())) - processes
        if left_out:
            raise ValueError(
                f"jaxmpi.{op}: in a program over {mesh}, but its communicator has all "
                f"{size} ranks of MPI's world: processes {_listed(left_out)} never run "
                f"the program, and the op would wait for them forever. {_MESH_OVER_THE_COMM}."
            )
        return
    members = _world_ranks(comm, size) if process_index_is_world_rank else None
    if members is None:  # only the count of its ranks is known, and that this one is in
        if jax.process_index() in processes and size > len(processes):
            raise ValueError(
                f"jaxmpi.{op}: in a program over {mesh}, but its communicator has {size} "
                f"ranks: at least {size - len(processes)} of them never run the program, and "
                f"the op would wait for them forever. {_MESH_OVER_THE_COMM}."
            )
        return
    left_out = members - processes
    if left_out and members & processes:
        raise ValueError(
            f"jaxmpi.{op}: in a program over {mesh}, but its communicator has {size} "
            f"ranks (world ranks {_listed(members)}): world ranks {_listed(left_out)} "
            "never run the program, and the op would wait for them forever. "
            f"{_MESH_OVER_THE_COMM}."
        )


def _listed(ranks) -> str:
    """Ranks for a message: all of a short list, the ends of a long one."""
    ordered = sorted(ranks)
    if len(ordered) <= 8:
        return str(ordered)
    return f"[{', '.join(map(str, ordered[:4]))}, ..., {ordered[-1]}] ({len(ordered)} in all)"


_MESH_OVER_THE_COMM = (
    "Build the mesh over a device of every rank of the communicator (e.g. "
    "Mesh(jax.devices(), ...)), or pass a communicator of the mesh's processes only "
    "(comm.Split)"
)


def _world_ranks(comm: int, size: int) -> frozenset[int] | None:
    """The world ranks of `comm`'s members through mpi4py's groups, if mpi4py (4.0 or
    later) is loaded; None if unknown."""
    mpi = loaded_mpi4py()
    if mpi is None or not hasattr(mpi.Comm, "fromhandle"):
        return None
    group, world = mpi.Comm.fromhandle(comm).Get_group(), mpi.COMM_WORLD.Get_group()
    try:
        return frozenset(mpi.Group.Translate_ranks(group, list(range(size)), world))
    finally:
        group.Free()
        world.Free()
