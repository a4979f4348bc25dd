"""What the files that run under jax.distributed share (test_sharded.py, test_xla_plugin.py):
jax.distributed started once per process by `jaxmpi.distributed.initialize(collectives="mpi")`,
shard_map wherever this JAX has it, and a mesh of every process's one device with program
helpers over it.

jax.distributed must start before any JAX computation, so these files run in pytest cells
of their own (JAXMPI_TEST_SHARDED=1); elsewhere they skip.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("JAXMPI_TEST_SHARDED") != "1":
    pytest.skip("set JAXMPI_TEST_SHARDED=1 (a cell of its own)", allow_module_level=True)

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmpi.distributed

# Once per process (this module is imported once, by whichever file comes first); JAX's
# own collectives take XLA's MPI backend, the route of JAX 0.6.2 to 0.10.1 and of a program
# that asks for it (layouts.py's files take the default of JAX >= 0.10.2, jaxmpi's pass).
jaxmpi.distributed.initialize(collectives="mpi")

try:  # public from JAX 0.7 on
    from jax import shard_map

    UNCHECKED = {"check_vma": False}
except ImportError:
    from jax.experimental.shard_map import shard_map

    UNCHECKED = {"check_rep": False}

# Block i of the mesh is process i, which jaxmpi.distributed.initialize made MPI rank i.
MESH = Mesh(np.array(sorted(jax.devices(), key=lambda d: d.process_index)), ("x",))


def block_spec(mesh: Mesh) -> P:
    """The leading axis split over every axis of `mesh`: block r on rank r."""
    return P(tuple(mesh.axis_names))


def global_array(local, mesh=MESH):
    """The array whose block on this process is `local` (given a leading axis of 1)."""
    sharding = NamedSharding(mesh, block_spec(mesh))
    device = jax.local_devices()[0]
    block = jax.device_put(np.asarray(local)[None], device)
    return jax.make_array_from_single_device_arrays(
        (mesh.devices.size, *np.shape(local)), sharding, [block]
    )


def sharded(body, *local_inputs, mesh=MESH, checked=False):
    """`body` on this rank's `local_inputs` inside jit(shard_map) over `mesh` (every
    process's device on axis "x", or a 2-D mesh whose devices are laid out in rank order);
    this rank's block of each result, as numpy."""
    spec = block_spec(mesh)

    def blocks(*xs):
        outs = body(*(x[0] for x in xs))
        return jax.tree.map(lambda y: y[None], outs)

    checks = {} if checked else UNCHECKED
    program = jax.jit(shard_map(blocks, mesh=mesh, in_specs=spec, out_specs=spec, **checks))
    outs = program(*(global_array(x, mesh) for x in local_inputs))
    return jax.tree.map(lambda y: np.asarray(y.addressable_shards[0].data)[0], outs)


def mesh_2d(rows: int, columns: int) -> Mesh:
    """A (rows, columns) mesh, axes ("y", "x"), rank r at (r // columns, r % columns)."""
    devices = sorted(jax.devices(), key=lambda d: d.process_index)
    return Mesh(np.array(devices).reshape(rows, columns), ("y", "x"))


__all__ = ["MESH", "UNCHECKED", "block_spec", "global_array", "mesh_2d", "shard_map", "sharded"]
