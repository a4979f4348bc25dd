"""What the files that run JAX's collectives through jaxmpi's pass share
(test_jax_collectives.py): jax.distributed started once per process by
`jaxmpi.distributed.initialize(collectives="jaxmpi")`, in the layout of devices per process
the cell sets, and the mesh of every device, in process order.

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
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import jaxmpi.distributed  # noqa: E402
from jaxmpi._binding import jax_shim  # noqa: E402

if not jax_shim.has_hlo_pass_hook():
    pytest.skip(f"JAX {jax.__version__} has no HLO pass hook", allow_module_level=True)

# Once per process (this module is imported once).
jaxmpi.distributed.initialize(collectives="jaxmpi")

PROCESSES, LOCAL = (int(n) for n in LAYOUT.split("x"))
DEVICES = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
N = len(DEVICES)
MESH = Mesh(np.array(DEVICES), ("i",))
