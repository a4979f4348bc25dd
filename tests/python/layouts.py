"""What the files that run JAX's collectives through jaxmpi's pass share
(test_jax_collectives.py, test_device_layer.py, test_mesh_comm.py): jax.distributed
started once per process by
`jaxmpi.distributed.initialize(collectives="jaxmpi")`, in the layout of devices per process
the cell sets, the mesh of every device, in process order, and how the files put arrays
on it, run programs over it and check their blocks.

The cell sets JAXMPI_TEST_LAYOUT="PxD" (P processes of D CPU devices) and XLA_FLAGS'
--xla_force_host_platform_device_count=D; jax.distributed must start before any JAX
computation, so these files run in cells of their own (tests/python/selection.py's
"layouts" kind). Elsewhere, and where JAX has no pass hook (JAX < 0.10.2), they skip.
"""

from __future__ import annotations

import os

import pytest

LAYOUT = os.environ.get("JAXMPI_TEST_LAYOUT")
if LAYOUT is None:
    pytest.skip("set JAXMPI_TEST_LAYOUT=PxD (a cell of its own)", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import shard_map  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxmpi.distributed  # noqa: E402
from helpers import assert_array, within  # noqa: E402
from jaxmpi._binding import jax_shim  # noqa: E402

if not jax_shim.has_hlo_pass_hook():
    pytest.skip(f"JAX {jax.__version__} has no HLO pass hook", allow_module_level=True)

# Once per process (this module is imported once).
jaxmpi.distributed.initialize(collectives="jaxmpi")

PROCESSES, LOCAL = (int(n) for n in LAYOUT.split("x"))
DEVICES = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
N = len(DEVICES)
MESH = Mesh(np.array(DEVICES), ("i",))

BLOCKS = P("i")  # the leading axis split over every device


def put(value: np.ndarray, spec=BLOCKS, mesh: Mesh = MESH) -> jax.Array:
    """The global array `value`, sharded by `spec` over `mesh`."""
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def blocks_of(dtype="float32", rows: int = 2, cols: int = 3, devices: int = N) -> np.ndarray:
    """A global array of `devices` blocks of (rows, cols), distinct per block and element,
    small enough for a sum over 8 devices to fit every type."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    base = np.arange(devices * rows * cols).reshape(devices * rows, cols) % 13
    if name == "bool":
        return base % 3 == 0
    if name.startswith("complex"):
        return (base + 1j * (base[::-1] % 5)).astype(name)
    if name == "bfloat16":
        return np.asarray(base, jnp.bfloat16)
    return np.asarray(base, name)


def per_block(value: np.ndarray, devices: int = N) -> np.ndarray:
    """`value`'s blocks, one per device: (devices, rows per device, ...)."""
    return value.reshape(devices, -1, *value.shape[1:])


def smap(body, in_specs=BLOCKS, out_specs=BLOCKS, mesh: Mesh = MESH):
    """jit(shard_map(body)) over `mesh`."""
    return jax.jit(
        shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    )


def check(got: jax.Array, expected: np.ndarray, what: str) -> None:
    """Every block this process holds equals that block of `expected`, bit for bit."""
    for shard in got.addressable_shards:
        assert_array(shard.data, expected[shard.index], f"{what}, block {shard.index}")


def check_ppermute(x: np.ndarray, perm: list[tuple[int, int]]) -> None:
    """A ppermute of `x`'s blocks over every device, under `within`, against numpy's: a
    device no pair sends to gets zeros."""
    with within(f"ppermute {perm}"):
        got = jax.block_until_ready(smap(lambda a: jax.lax.ppermute(a, "i", perm))(put(x)))
    blocks = per_block(x)
    expected = np.zeros_like(blocks)
    for source, target in perm:
        expected[target] = blocks[source]
    check(got, np.concatenate(expected), f"ppermute {perm}")


def check_close(got: jax.Array, expected: np.ndarray, what: str) -> None:
    """As `check`, for results whose float sums may be ordered differently."""
    for shard in got.addressable_shards:
        np.testing.assert_allclose(
            np.asarray(shard.data), expected[shard.index], rtol=1e-5, err_msg=what
        )
