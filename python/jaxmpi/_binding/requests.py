"""What the binding adds for requests (`jaxmpi/_requests.py` has the API): a wait on concrete
arrays, outside jit, and the refusal, when a program is lowered, of a request its function
started and never waited for. Importing the module installs both."""

from __future__ import annotations

import numpy as np

from .. import _native
from . import dispatch, jax_shim
from . import primitives as prim


def _wait_outside_jit(value, *operands, results, buffers, **_):
    """`wait` on concrete arrays (a request started outside jit): a native wait for the
    buffers themselves, which MPI fills in place. A program would get copies of them."""
    bits = np.asarray(value).view(np.uint32)
    first = operands[0].addressable_data(0).unsafe_buffer_pointer() if buffers else 0
    _native.wait_request((int(bits[0]), int(bits[1])), first)
    return list(operands[:results])


prim.wait.def_impl(_wait_outside_jit)

# Every started form: the primitives whose first result is a request.
_STARTS = {primitive.name: op for op, primitive in prim.STARTED.items()}


def check_program(jaxpr, top: bool = True) -> None:
    """Refuses, when a program is lowered, a request that its function started and never
    waited for: what it returns must go to a wait in the same jaxpr. (A start outside jit
    is a program of its own, which returns it: the wait comes later.)"""
    waits = {id(v) for eqn in jaxpr.eqns if eqn.primitive is prim.wait for v in eqn.invars}
    if top:
        waits |= {id(v) for v in jaxpr.outvars}
    for eqn in jaxpr.eqns:
        for inner in jax_shim.jaxprs_in(eqn):
            check_program(inner, top=False)
        name = str(eqn.primitive)
        if name in _STARTS and not any(id(v) in waits for v in eqn.outvars):
            op = prim.SIGNATURES[_STARTS[name]]["started"]
            raise ValueError(
                f"jaxmpi.{op} started at {jax_shim.where(eqn)} is never waited for in the "
                "function (branch, loop body) that started it: call jaxmpi.wait (or "
                "waitall) on its request there. A request left pending would let XLA "
                "reuse its buffers while MPI still uses them."
            )


dispatch.policy.program_checks.append(check_program)
