"""Rules of the reductions: allreduce, reduce, scan, exscan, reduce_scatter, and the
transposed allreduce.

SUM is linear. allreduce-SUM keeps mpi4jax's convention: its transpose is the identity on
each rank (every rank holds the same, replicated loss), and the transpose of that is
allreduce-SUM again. MIN/MAX differentiate through the selected elements (ties share the
derivative equally); PROD through the product of the other ranks' values.
"""

from __future__ import annotations

import jax.numpy as jnp

from ... import _native
from .. import primitives as prim
from .common import (
    MAX,
    MIN,
    PROD,
    SUM,
    bind_one,
    cotangent_for,
    cotangent_or_zeros,
    differentiable,
    op_name,
    rank_of,
    size_of,
    value_or,
)


def reduction_jvp(primitive, name: str):
    """allreduce and reduce: SUM is linear; MIN/MAX/PROD have their own rules, whose
    tangents are SUM-reduced the same way as the values."""

    def jvp(primals, tangents, **params):
        (x,), (t,) = primals, tangents
        op = params["op"]
        if op == SUM or not differentiable(x):
            return _linear(primitive, primals, tangents, params)
        outs = primitive.bind(x, **params)
        if op in (MIN, MAX):
            full = outs[0] if primitive is prim.allreduce else _allreduce(x, params, op)
            return outs, _selection_tangent(x, t, full, primitive, params)
        if op == PROD:
            return outs, _product_tangent(x, t, primitive, params)
        raise NotImplementedError(f"jaxmpi.{name}: {op_name(op)} has no derivative")

    return jvp


def _selection_tangent(x, t, result, primitive, params):
    """MIN/MAX: the tangent of the elements that were selected, shared equally by ties."""
    chosen = (x == result).astype(t.dtype)
    count = _allreduce(chosen, params)
    return primitive.bind(t * chosen / count, **dict(params, op=SUM, user_op=0))


def _product_tangent(x, t, primitive, params):
    """PROD: d(prod_r x_r) = sum_r t_r * prod_{s != r} x_s, exact also where some x is 0."""
    everyone = bind_one(prim.allgather, x, comm=params["comm"], size=size_of(params))
    own = (jnp.arange(everyone.shape[0]) == rank_of(params)).reshape((-1,) + (1,) * x.ndim)
    others = jnp.prod(jnp.where(own, jnp.ones_like(everyone), everyone), axis=0)
    return primitive.bind(t * others, **dict(params, op=SUM, user_op=0))


def _linear(primitive, primals, tangents, params):
    return primitive.bind(*primals, **params), primitive.bind(*tangents, **params)


def _allreduce(t, params, op=SUM):
    return bind_one(prim.allreduce, t, comm=params["comm"], op=op, user_op=0)


def allreduce_transpose(cts, x, **params):
    return prim.allreduce_transposed.bind(*cts, **params)


def allreduce_transposed_transpose(cts, x, **params):
    return prim.allreduce.bind(*cts, **params)


def reduce_transpose(cts, x, *, comm, root, at_root, **params):
    ct = cotangent_or_zeros(cts, x)
    spread = value_or(prim.bcast.bind(ct, comm=comm, root=root, at_root=at_root), ct)
    return [cotangent_for(x, spread)]


def scan_transpose(cts, x, **params):
    """Rank s's input reaches every rank r >= s: sum over r >= s = total - exclusive sum."""
    (ct,) = cts
    before = bind_one(prim.exscan, ct, **params)
    return [cotangent_for(x, _allreduce(ct, params) - before)]


def exscan_transpose(cts, x, **params):
    (ct,) = cts
    upto = bind_one(prim.scan, ct, **params)
    return [cotangent_for(x, _allreduce(ct, params) - upto)]


def reduce_scatter_transpose(cts, x, *, comm, **params):
    return [
        cotangent_for(x, bind_one(prim.allgather, *cts, comm=comm, size=_native.comm_size(comm)))
    ]
