"""What the binding adds for non-blocking requests (`jaxmpi/_nonblocking.py` has the API):
a wait on concrete arrays, outside jit, and the refusal, when a program is lowered, of a
request its function started and never waited for. Importing the module installs both."""

from __future__ import annotations

import numpy as np

from .. import _native
from . import dispatch, jax_shim
from . import primitives as prim


def _wait_outside_jit(value, buffer, *after, **_):
    """`wait` on concrete arrays (a request started outside jit): a native wait on the
    buffer itself, which MPI fills in place. A program would get a copy of the buffer."""
    bits = np.asarray(value).view(np.uint32)
    address = buffer.addressable_data(0).unsafe_buffer_pointer()
    _native.wait_request((int(bits[0]), int(bits[1])), address)
    return [buffer]


prim.wait.def_impl(_wait_outside_jit)


_STARTS = ("jaxmpi_isend", "jaxmpi_irecv")


def check_program(jaxpr, top: bool = True) -> None:
    """Refuses, when a program is lowered, a request that its function started and never
    waited for: its transfer buffer must go to a wait in the same jaxpr. (A start outside
    jit is a program of its own, which returns the buffer: the wait comes later.)"""
    waits = {id(eqn.invars[1]) for eqn in jaxpr.eqns if str(eqn.primitive) == "jaxmpi_wait"}
    if top:
        waits |= {id(v) for v in jaxpr.outvars}
    for eqn in jaxpr.eqns:
        for inner in jax_shim.jaxprs_in(eqn):
            check_program(inner, top=False)
        if str(eqn.primitive) in _STARTS and id(eqn.outvars[1]) not in waits:
            op = str(eqn.primitive).removeprefix("jaxmpi_")
            raise ValueError(
                f"jaxmpi.{op} started at {jax_shim.where(eqn)} is never waited for in the "
                "function (branch, loop body) that started it: call jaxmpi.wait (or "
                "waitall) on its request there. A request left pending would let XLA "
                "reuse its buffer while MPI still uses it."
            )


dispatch.policy.program_checks.append(check_program)
