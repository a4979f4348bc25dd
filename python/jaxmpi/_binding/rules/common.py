"""What the rules of every op family share: binding helpers, the reduction codes, the
linear JVP (the tangents take the values' path), the shape of a transpose's result, and
the generic batching rule with its axes."""

from __future__ import annotations

import jax.numpy as jnp

from ... import _native
from ..._runtime.encodings import PREDEFINED_OPS
from .. import jax_shim

SUM, PROD, MIN, MAX = (PREDEFINED_OPS.index(n) for n in ("SUM", "PROD", "MIN", "MAX"))


def op_name(op: int) -> str:
    return PREDEFINED_OPS[op] if op >= 0 else "a user-defined op"


def bind_one(primitive, *args, **params):
    (y,) = primitive.bind(*args, **params)
    return y


def differentiable(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def rank_of(params) -> int:
    return _native.comm_rank(params["comm"])


def size_of(params) -> int:
    return _native.comm_size(params["comm"])


def zeros_like_arg(arg):
    aval = jax_shim.aval_of(arg)
    return jnp.zeros(aval.shape, aval.dtype)


def linear_jvp(primitive, name: str, sum_only: bool = False):
    """Linear in the data: the tangents take the same path as the values (templates carry
    only a shape). Reductions are linear for SUM only."""

    def jvp(primals, tangents, **params):
        if sum_only and params["op"] != SUM:
            raise NotImplementedError(
                f"jaxmpi.{name}: derivatives are defined for op=SUM only, not {op_name(params['op'])}"
            )
        outs = primitive.bind(*primals, **params)
        if not differentiable(primals[0]):
            return outs, [jnp.zeros_like(o) for o in outs]
        # Also without results (send; a rooted op where this rank receives nothing): the
        # tangent still travels, as a second message.
        quiet = dict(params, status=0) if "status" in params else params
        return outs, primitive.bind(*tangents, **quiet)

    return jvp


def sum_only_jvp(primitive, name: str):
    return linear_jvp(primitive, name, sum_only=True)


# Transpose rules return one cotangent per argument: None for arguments that are not being
# transposed (constants), zeros for templates whose values never mattered.


def cotangent_for(arg, value):
    return value if jax_shim.is_linear(arg) else None


# A rooted op's primal returns its input on the ranks where it binds no result; JAX adds
# the cotangent of that identity itself, so the rooted ops' transposes only add what
# travelled.


def cotangent_or_zeros(cts, x):
    """The one cotangent, or zeros shaped like `x` where the op bound no result."""
    return cts[0] if cts else zeros_like_arg(x)


def value_or(outs, fallback):
    return outs[0] if outs else fallback


def batcher(primitive, arg_axis, out_axis, out_dims=None):
    """Moves every argument's batch axis to `arg_axis(**params)` (broadcasting unbatched
    ones), binds once, and reports the outputs' batch axis as `out_axis(**params)`, or
    each output's as `out_dims(axis, **params)` lists them (a started op's request has
    none)."""

    def rule(args, dims, **params):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        axis = arg_axis(**params)
        moved = [
            jnp.moveaxis(
                jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0),
                0,
                axis,
            )
            for a, d in zip(args, dims)
        ]
        outs = primitive.bind(*moved, **params)
        if out_dims is not None:
            return outs, out_dims(axis, **params)
        return outs, [out_axis(**params)] * len(outs)

    return rule


def front(**_):
    return 0


def behind_rank_axis(**_):
    return 1


def root_axis(*, at_root, **_):
    """Gather's result and scatter's operand have the rank axis in front at the root only."""
    return 1 if at_root else 0
