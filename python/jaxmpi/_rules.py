"""Differentiation and batching rules (mpi4jax 0.9's set): allreduce with SUM, sendrecv,
and barrier.

Conventions kept from mpi4jax so existing programs get the same gradients:
- the transpose of allreduce-SUM is the identity on each rank (no communication), and the
  transpose of that is allreduce-SUM again;
- sendrecv is linear in what it sends; its transpose sends the cotangent back the other
  way (source and destination swap).
"""

from __future__ import annotations

import jax.numpy as jnp

from . import _jax_shim
from ._comm import PEER_ANY, PREDEFINED_OPS, TAG_ANY
from ._ops import _allreduce_p, _barrier_p, _sendrecv_p

_SUM = PREDEFINED_OPS.index("SUM")


def _allreduce_jvp(primals, tangents, *, op, **params):
    if op != _SUM:
        name = PREDEFINED_OPS[op] if op >= 0 else "a user-defined op"
        raise NotImplementedError(
            f"jaxmpi.allreduce: derivatives are defined for op=SUM only, not {name}"
        )
    (y,) = _allreduce_p.bind(*primals, op=op, **params)
    (ty,) = _allreduce_p.bind(*tangents, op=op, **params)
    return [y], [ty]


def _allreduce_transpose(cotangents, x, *, identity, **params):
    return _allreduce_p.bind(*cotangents, identity=not identity, **params)


def _allreduce_batch(args, dims, **params):
    # Elementwise: the batch is just more elements, the same on every rank.
    return _allreduce_p.bind(*args, **params), dims


def _sendrecv_jvp(primals, tangents, *, status, **params):
    sendbuf, recvbuf = primals
    (y,) = _sendrecv_p.bind(sendbuf, recvbuf, status=status, **params)
    (ty,) = _sendrecv_p.bind(tangents[0], jnp.zeros_like(recvbuf), status=0, **params)
    return [y], [ty]


def _sendrecv_transpose(cotangents, sendbuf, recvbuf, *, source, dest, sendtag, **params):
    """The cotangent goes back to whoever sent the data, and the cotangent of what this
    rank sent comes back from its destination. Received by source only (any tag): the
    sender's tag is not known here when the forward receive accepted any."""
    params = dict(params, recvtag=TAG_ANY, status=0)
    template = jnp.zeros(_jax_shim.aval_of(sendbuf).shape, _jax_shim.aval_of(sendbuf).dtype)
    if source == PEER_ANY:
        raise NotImplementedError(
            "jaxmpi.sendrecv: cannot transpose a receive from ANY_SOURCE; give the source rank"
        )
    (ct_send,) = _sendrecv_p.bind(
        *cotangents, template, source=dest, dest=source, sendtag=sendtag, **params
    )
    recv_ct = (
        jnp.zeros(_jax_shim.aval_of(recvbuf).shape, _jax_shim.aval_of(recvbuf).dtype)
        if _jax_shim.is_linear(recvbuf)
        else None
    )
    return [ct_send if _jax_shim.is_linear(sendbuf) else None, recv_ct]


def _sendrecv_batch(args, dims, **params):
    """Both buffers batched along a leading axis (an unbatched one is broadcast), so the
    whole batch travels in one message."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    args = [
        jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
        for a, d in zip(args, dims)
    ]
    return _sendrecv_p.bind(*args, **params), [0]


def _barrier_batch(args, dims, **params):
    return _barrier_p.bind(**params), []


_jax_shim.def_jvp(_allreduce_p, _allreduce_jvp)
_jax_shim.def_transpose(_allreduce_p, _allreduce_transpose)
_jax_shim.def_batching(_allreduce_p, _allreduce_batch)
_jax_shim.def_jvp(_sendrecv_p, _sendrecv_jvp)
_jax_shim.def_transpose(_sendrecv_p, _sendrecv_transpose)
_jax_shim.def_batching(_sendrecv_p, _sendrecv_batch)
_jax_shim.def_batching(_barrier_p, _barrier_batch)
