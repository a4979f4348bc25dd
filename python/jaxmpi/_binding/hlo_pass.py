"""JAX's collectives through jaxmpi's own calls: the HLO pass (core/src/xla/hlo in Rust)
registered with JAX, which hands it every CPU module after SPMD partitioning. It replaces
each all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute and
ragged-all-to-all by a call to jaxmpi's handlers, with one token ordering every MPI call of
the module, jaxmpi's own ops included. A module it cannot take whole fails to compile,
naming the instruction and why.

`jaxmpi.distributed.initialize` installs it where JAX has the hook (JAX >= 0.10.2); the
route is then the same for any number of CPU devices per process.
"""

from __future__ import annotations

import jax

from .. import _native
from . import jax_shim

NAME = "jaxmpi-collectives"

# Modules rewritten in this process, and collectives in them (for `info` and the tests).
rewritten = {"modules": 0, "collectives": 0}
_installed = False


def available() -> bool:
    return jax_shim.has_hlo_pass_hook()


def installed() -> bool:
    return _installed


def _rewrite(module: bytes) -> bytes | None:
    done = _native.rewrite_hlo(module)  # ValueError, naming the instruction, if refused
    if done is None:
        return None
    new, collectives = done
    rewritten["modules"] += 1
    rewritten["collectives"] += collectives
    return new


def install() -> None:
    """Registers the pass for every CPU compilation from now on; after
    `jax.distributed.initialize` (the job's devices must be known)."""
    global _installed
    if _installed:
        return
    _native.set_device_owners([(d.id, d.process_index) for d in jax.devices()])
    from jax.extend import xla as extend_xla

    extend_xla.register_hlo_module_transformation(
        _rewrite,
        name=NAME,
        stage=extend_xla.PipelineStage.PRE_SCHEDULER,
        platforms="cpu",
    )
    # Executables compiled with and without the pass, or by another revision of it, must
    # never be taken for each other.
    jax_shim.salt_compilation_cache(f"|{NAME}-{_native.hlo_revision()}")
    _installed = True
