"""Rules of the variable-count collectives (gatherv, allgatherv, scatterv, alltoallv) and
of ragged_alltoallv, the exchange whose counts are operands: transposes by the adjoint
exchange with the same counts; the counts themselves carry no derivative."""

from __future__ import annotations

import jax.numpy as jnp

from ... import _native
from .. import primitives as prim
from .common import (
    bind_one,
    cotangent_for,
    cotangent_or_zeros,
    differentiable,
    value_or,
    zeros_like_arg,
)


def gatherv_transpose(cts, x, *, comm, root, counts, at_root, **_):
    ct = cotangent_or_zeros(cts, x)  # away from the root: a template
    rank = _native.comm_rank(comm)
    mine = bind_one(
        prim.scatterv, ct, comm=comm, root=root, counts=counts, rank=rank, at_root=at_root
    )
    return [cotangent_for(x, mine)]


def allgatherv_transpose(cts, x, *, comm, counts, **_):
    """Rank r's rows were copied to every rank: its cotangent is the sum over ranks of
    their cotangents of block r, collected with one alltoallv."""
    (ct,) = cts
    rank, size = _native.comm_rank(comm), _native.comm_size(comm)
    mine = counts[rank]
    blocks = bind_one(prim.alltoallv, ct, comm=comm, send_counts=counts, recv_counts=(mine,) * size)
    return [cotangent_for(x, blocks.reshape((size, mine) + blocks.shape[1:]).sum(axis=0))]


def scatterv_transpose(cts, x, *, comm, root, counts, rank, at_root, **_):
    outs = prim.gatherv.bind(*cts, comm=comm, root=root, counts=counts, at_root=at_root)
    return [cotangent_for(x, value_or(outs, zeros_like_arg(x)))]


def alltoallv_transpose(cts, x, *, comm, send_counts, recv_counts, **_):
    back = bind_one(
        prim.alltoallv, *cts, comm=comm, send_counts=recv_counts, recv_counts=send_counts
    )
    return [cotangent_for(x, back)]


def ragged_jvp(primitive, name: str):
    """Linear in the data (operand and output); the counts carry no derivative."""

    def jvp(primals, tangents, **params):
        outs = primitive.bind(*primals, **params)
        if not differentiable(primals[0]):
            return outs, [jnp.zeros_like(o) for o in outs]
        return outs, primitive.bind(*tangents[:2], *primals[2:], **params)

    return jvp


def ragged_alltoallv_transpose(cts, x, output, *counts, **params):
    """The reverse exchange with the same counts brings each received row's cotangent
    back to the row it was sent from; the output's rows nobody wrote keep theirs."""
    (ct,) = cts
    send_displs, send_counts, recv_displs, recv_counts = counts
    back = bind_one(
        prim.ragged_alltoallv,
        ct,
        zeros_like_arg(x),
        recv_displs,
        recv_counts,
        send_displs,
        send_counts,
        **params,
    )
    row = jnp.arange(ct.shape[0])[:, None]
    written = ((row >= recv_displs) & (row < recv_displs + recv_counts)).any(axis=1)
    kept = jnp.where(written.reshape((-1,) + (1,) * (ct.ndim - 1)), jnp.zeros_like(ct), ct)
    return [cotangent_for(x, back), cotangent_for(output, kept), None, None, None, None]


def ragged_alltoallv_batching(args, dims, **params):
    """Batched data with shared counts: one exchange, the batch axis inside each row.
    Counts that differ along the batch: one exchange per batch entry."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    if any(d is not None for d in dims[2:]):
        entries = [
            bind_one(
                prim.ragged_alltoallv,
                *(a if d is None else jnp.take(a, i, axis=d) for a, d in zip(args, dims)),
                **params,
            )
            for i in range(size)
        ]
        return [jnp.stack(entries)], [0]
    data = [
        jnp.moveaxis(a, d, 1)
        if d is not None
        else jnp.broadcast_to(a[:, None], (a.shape[0], size, *a.shape[1:]))
        for a, d in zip(args[:2], dims[:2])
    ]
    return prim.ragged_alltoallv.bind(*data, *args[2:], **params), [1]
