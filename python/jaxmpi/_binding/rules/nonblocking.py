"""Rules of non-blocking point to point: isend, irecv and wait. The tangent and the
cotangent travel as requests of their own.

A start's derivative starts a second transfer for the tangent; the request value, a
float32 array, carries that transfer's request to the wait's derivative, which waits for
it. Transposed (reverse mode), the program runs backwards: a wait becomes the start of the
reverse transfer (a send's wait starts receiving the cotangent, a receive's wait starts
sending it), whose request travels back as the cotangent of the request value to the
transposed start, which waits for it. So the backward exchange overlaps the transposed
interior just as the forward one overlaps the interior.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..._runtime.encodings import TAG_ANY
from .. import jax_shim
from .. import primitives as prim
from .common import differentiable, zeros_like_arg


def wait_jvp(primitive, name: str):
    """The tangent's wait follows the tangents of what the wait follows."""

    def jvp(primals, tangents, **params):
        outs = primitive.bind(*primals, **params)
        if not differentiable(primals[1]):
            return outs, [jnp.zeros_like(o) for o in outs]
        return outs, primitive.bind(*tangents, **params)

    return jvp


def wait_transpose(cts, value, buffer, *after, comm, sends, peer, tag):
    """The reverse transfer starts here: its request and buffer are the cotangents of the
    wait's request value and buffer, for the transposed start to wait for. What the wait
    followed gets zero cotangents, which the transposed interior adds to its own: so it
    runs after this start, as the interior ran before the wait."""
    if sends:
        back = prim.irecv.bind(
            zeros_like_arg(buffer), comm=comm, source=peer, tag=TAG_ANY, status=0
        )
    else:
        (ct,) = cts
        back = prim.isend.bind(ct, comm=comm, dest=peer, tag=0 if tag == TAG_ANY else tag)
    return [*back, *(zeros_like_arg(a) if jax_shim.is_linear(a) else None for a in after)]


def start_transpose(primitive):
    def transpose(cts, x, *, comm, tag, **params):
        sends = primitive is prim.isend
        peer = params["dest"] if sends else params["source"]
        (received,) = prim.wait.bind(*cts, comm=comm, sends=not sends, peer=peer, tag=tag)
        return [received if sends else zeros_like_arg(x)]

    return transpose


def start_batching(primitive):
    """The batch axis in front: one message for the whole batch; the request is one."""

    def rule(args, dims, **params):
        (x,), (d,) = args, dims
        x = jnp.moveaxis(x, d, 0) if d is not None else x
        return primitive.bind(x, **params), [None, 0 if d is not None else None]

    return rule


def wait_batching(args, dims, **params):
    """What the wait follows keeps its batch axes: it is never read."""
    if dims[0] is not None:
        raise NotImplementedError(
            "jaxmpi.wait: a batch of requests (vmap over isend/irecv calls made outside "
            "the vmapped function) cannot be waited for; start and wait inside vmap"
        )
    return prim.wait.bind(*args, **params), [dims[1]]
