"""Rules of the collectives that move equal blocks (bcast, gather, allgather, scatter,
alltoall) and of barrier. Their transposes are the adjoint communication: of bcast a
reduce-SUM to the root, of gather a scatter, of allgather a reduce_scatter."""

from __future__ import annotations

import jax.numpy as jnp

from ... import _native
from .. import primitives as prim
from .common import SUM, bind_one, cotangent_for, cotangent_or_zeros, value_or, zeros_like_arg


def bcast_transpose(cts, x, *, comm, root, at_root, **_):
    """The root's own cotangent arrives through the identity; the others' are summed."""
    ct = cotangent_or_zeros(cts, x)
    outs = prim.reduce.bind(ct, comm=comm, op=SUM, user_op=0, root=root, at_root=at_root)
    return [cotangent_for(x, value_or(outs, jnp.zeros_like(ct)))]


def gather_transpose(cts, x, *, comm, root, size, at_root, **_):
    ct = cotangent_or_zeros(cts, x)  # away from the root: a template
    return [cotangent_for(x, bind_one(prim.scatter, ct, comm=comm, root=root, at_root=at_root))]


def allgather_transpose(cts, x, *, comm, size, **_):
    return [cotangent_for(x, bind_one(prim.reduce_scatter, *cts, comm=comm, op=SUM, user_op=0))]


def scatter_transpose(cts, x, *, comm, root, at_root, **_):
    size = _native.comm_size(comm)
    outs = prim.gather.bind(*cts, comm=comm, root=root, size=size, at_root=at_root)
    return [cotangent_for(x, value_or(outs, zeros_like_arg(x)))]


def alltoall_transpose(cts, x, *, comm, **_):
    return [cotangent_for(x, bind_one(prim.alltoall, *cts, comm=comm))]


def barrier_batching(args, dims, **params):
    return prim.barrier.bind(**params), []
