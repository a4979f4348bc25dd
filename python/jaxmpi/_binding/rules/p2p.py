"""Rules of blocking point to point: send, recv, sendrecv. The tangent travels as a
second message right after the value; the cotangent travels back the other way."""

from __future__ import annotations

import jax.numpy as jnp

from ..._runtime.encodings import PEER_ANY, TAG_ANY
from .. import primitives as prim
from .common import bind_one, cotangent_for, differentiable, zeros_like_arg


def named_source_jvp(primitive, name: str):
    """recv and sendrecv: the sender sends the tangent right after the value; a receive
    from a named source gets them in that order (MPI does not overtake between one pair of
    ranks). From ANY_SOURCE the tangent could come from another rank."""

    def jvp(primals, tangents, *, source, **params):
        if source == PEER_ANY:
            raise NotImplementedError(
                f"jaxmpi.{name}: cannot differentiate a receive from ANY_SOURCE; give the source rank"
            )
        outs = primitive.bind(*primals, source=source, **params)
        if not differentiable(primals[0]):
            return outs, [jnp.zeros_like(o) for o in outs]
        return outs, primitive.bind(*tangents, source=source, **dict(params, status=0))

    return jvp


def send_transpose(cts, x, *, comm, dest, tag, **_):
    """What was sent comes back: the cotangent from the destination."""
    back = bind_one(prim.recv, zeros_like_arg(x), comm=comm, source=dest, tag=TAG_ANY, status=0)
    return [cotangent_for(x, back)]


def recv_transpose(cts, x, *, comm, source, tag, status, **_):
    prim.send.bind(*cts, comm=comm, dest=source, tag=0 if tag == TAG_ANY else tag)
    return [cotangent_for(x, zeros_like_arg(x))]


def sendrecv_transpose(cts, sendbuf, recvbuf, *, source, dest, sendtag, **params):
    """The cotangent goes back to the rank the data came from; the cotangent of what this
    rank sent comes back from its destination (matched by source, any tag)."""
    # The cotangents are two arrays even where the primal sent and received one.
    params = dict(params, recvtag=TAG_ANY, status=0, replace=False)
    # What goes back is shaped like what came, and the reverse: so are their pytrees.
    params["tree"], params["recv_tree"] = params.get("recv_tree", 0), params.get("tree", 0)
    back = bind_one(
        prim.sendrecv,
        *cts,
        zeros_like_arg(sendbuf),
        source=dest,
        dest=source,
        sendtag=sendtag,
        **params,
    )
    return [cotangent_for(sendbuf, back), cotangent_for(recvbuf, zeros_like_arg(recvbuf))]
