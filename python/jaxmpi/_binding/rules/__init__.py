"""Differentiation and batching rules for every op.

Linear ops (data movement, SUM reductions) have JVPs that apply the op to the tangents and
transposes built from the adjoint communication: the transpose of bcast is a reduce-SUM to
the root, of scatter a gather, of allgather a reduce_scatter, of sendrecv the swapped
sendrecv. allreduce-SUM keeps mpi4jax's convention: its transpose is the identity on each
rank (every rank holds the same, replicated loss), and the transpose of that is
allreduce-SUM again. MIN/MAX reductions differentiate through the selected elements (ties
share the derivative equally); PROD through the product of the other ranks' values.

vmap moves the batch axis where the op's semantics allow one MPI call for the whole
batch: the front for elementwise ops and point to point, just behind the rank axis for ops
that split or stack along it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp

from . import _jax_shim, _native
from . import _primitive as prim
from ._comm import PEER_ANY, PREDEFINED_OPS, TAG_ANY

SUM, PROD, MIN, MAX = (PREDEFINED_OPS.index(n) for n in ("SUM", "PROD", "MIN", "MAX"))


def _op_name(op: int) -> str:
    return PREDEFINED_OPS[op] if op >= 0 else "a user-defined op"


def _one(primitive, *args, **params):
    (y,) = primitive.bind(*args, **params)
    return y


def _differentiable(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _rank(params) -> int:
    return _native.comm_rank(params["comm"])


def _size(params) -> int:
    return _native.comm_size(params["comm"])


def _zeros_like_arg(arg):
    aval = _jax_shim.aval_of(arg)
    return jnp.zeros(aval.shape, aval.dtype)


# --- JVPs -----------------------------------------------------------------------------------


def _linear_jvp(primitive, name: str, sum_only: bool = False):
    """Linear in the data: the tangents take the same path as the values (templates carry
    only a shape). Reductions are linear for SUM only."""

    def jvp(primals, tangents, **params):
        if sum_only and params["op"] != SUM:
            raise NotImplementedError(
                f"jaxmpi.{name}: derivatives are defined for op=SUM only, not {_op_name(params['op'])}"
            )
        outs = primitive.bind(*primals, **params)
        if not _differentiable(primals[0]):
            return outs, [jnp.zeros_like(o) for o in outs]
        # Also without results (send; a rooted op where this rank receives nothing): the
        # tangent still travels, as a second message.
        quiet = dict(params, status=0) if "status" in params else params
        return outs, primitive.bind(*tangents, **quiet)

    return jvp


def _sum_only_jvp(primitive, name: str):
    return _linear_jvp(primitive, name, sum_only=True)


def _selection_tangent(x, t, result, primitive, params):
    """MIN/MAX: the tangent of the elements that were selected, shared equally by ties."""
    chosen = (x == result).astype(t.dtype)
    count = _allreduce(chosen, params)
    return primitive.bind(t * chosen / count, **dict(params, op=SUM, user_op=0))


def _product_tangent(x, t, primitive, params):
    """PROD: d(prod_r x_r) = sum_r t_r * prod_{s != r} x_s, exact also where some x is 0."""
    everyone = _one(prim.allgather, x, comm=params["comm"], size=_size(params))
    own = (jnp.arange(everyone.shape[0]) == _rank(params)).reshape((-1,) + (1,) * x.ndim)
    others = jnp.prod(jnp.where(own, jnp.ones_like(everyone), everyone), axis=0)
    return primitive.bind(t * others, **dict(params, op=SUM, user_op=0))


def _reduction_jvp(primitive, name: str):
    """allreduce and reduce: SUM is linear; MIN/MAX/PROD have their own rules, whose
    tangents are SUM-reduced the same way as the values."""

    def jvp(primals, tangents, **params):
        (x,), (t,) = primals, tangents
        op = params["op"]
        if op == SUM or not _differentiable(x):
            return _linear(primitive, primals, tangents, params)
        outs = primitive.bind(x, **params)
        if op in (MIN, MAX):
            full = outs[0] if primitive is prim.allreduce else _allreduce(x, params, op)
            return outs, _selection_tangent(x, t, full, primitive, params)
        if op == PROD:
            return outs, _product_tangent(x, t, primitive, params)
        raise NotImplementedError(f"jaxmpi.{name}: {_op_name(op)} has no derivative")

    return jvp


def _linear(primitive, primals, tangents, params):
    return primitive.bind(*primals, **params), primitive.bind(*tangents, **params)


def _allreduce(t, params, op=SUM):
    return _one(prim.allreduce, t, comm=params["comm"], op=op, user_op=0)


def _named_source_jvp(primitive, name: str):
    """recv and sendrecv: the sender sends the tangent right after the value; a receive
    from a named source gets them in that order (MPI does not overtake between one pair of
    ranks). From ANY_SOURCE the tangent could come from another rank."""

    def jvp(primals, tangents, *, source, **params):
        if source == PEER_ANY:
            raise NotImplementedError(
                f"jaxmpi.{name}: cannot differentiate a receive from ANY_SOURCE; give the source rank"
            )
        outs = primitive.bind(*primals, source=source, **params)
        if not _differentiable(primals[0]):
            return outs, [jnp.zeros_like(o) for o in outs]
        return outs, primitive.bind(*tangents, source=source, **dict(params, status=0))

    return jvp


def _ragged_jvp(primitive, name: str):
    """Linear in the data (operand and output); the counts carry no derivative."""

    def jvp(primals, tangents, **params):
        outs = primitive.bind(*primals, **params)
        if not _differentiable(primals[0]):
            return outs, [jnp.zeros_like(o) for o in outs]
        return outs, primitive.bind(*tangents[:2], *primals[2:], **params)

    return jvp


# --- Transposes -----------------------------------------------------------------------------
# Each returns one cotangent per argument: None for arguments that are not being
# transposed (constants), zeros for templates whose values never mattered.


def _for(arg, value):
    return value if _jax_shim.is_linear(arg) else None


def _allreduce_transpose(cts, x, **params):
    return prim.allreduce_transposed.bind(*cts, **params)


def _allreduce_transposed_transpose(cts, x, **params):
    return prim.allreduce.bind(*cts, **params)


# A rooted op's primal returns its input on the ranks where it binds no result; JAX adds
# the cotangent of that identity itself, so these rules only add what travelled.


def _cotangent_or_zeros(cts, x):
    """The one cotangent, or zeros shaped like `x` where the op bound no result."""
    return cts[0] if cts else _zeros_like_arg(x)


def _value_or(outs, fallback):
    return outs[0] if outs else fallback


def _reduce_transpose(cts, x, *, comm, root, at_root, **params):
    ct = _cotangent_or_zeros(cts, x)
    spread = _value_or(prim.bcast.bind(ct, comm=comm, root=root, at_root=at_root), ct)
    return [_for(x, spread)]


def _scan_transpose(cts, x, **params):
    """Rank s's input reaches every rank r >= s: sum over r >= s = total - exclusive sum."""
    (ct,) = cts
    before = _one(prim.exscan, ct, **params)
    return [_for(x, _allreduce(ct, params) - before)]


def _exscan_transpose(cts, x, **params):
    (ct,) = cts
    upto = _one(prim.scan, ct, **params)
    return [_for(x, _allreduce(ct, params) - upto)]


def _reduce_scatter_transpose(cts, x, *, comm, **params):
    return [_for(x, _one(prim.allgather, *cts, comm=comm, size=_native.comm_size(comm)))]


def _bcast_transpose(cts, x, *, comm, root, at_root):
    """The root's own cotangent arrives through the identity; the others' are summed."""
    ct = _cotangent_or_zeros(cts, x)
    outs = prim.reduce.bind(ct, comm=comm, op=SUM, user_op=0, root=root, at_root=at_root)
    return [_for(x, _value_or(outs, jnp.zeros_like(ct)))]


def _gather_transpose(cts, x, *, comm, root, size, at_root):
    ct = _cotangent_or_zeros(cts, x)  # away from the root: a template
    return [_for(x, _one(prim.scatter, ct, comm=comm, root=root, at_root=at_root))]


def _allgather_transpose(cts, x, *, comm, size):
    return [_for(x, _one(prim.reduce_scatter, *cts, comm=comm, op=SUM, user_op=0))]


def _scatter_transpose(cts, x, *, comm, root, at_root):
    size = _native.comm_size(comm)
    outs = prim.gather.bind(*cts, comm=comm, root=root, size=size, at_root=at_root)
    return [_for(x, _value_or(outs, _zeros_like_arg(x)))]


def _alltoall_transpose(cts, x, *, comm):
    return [_for(x, _one(prim.alltoall, *cts, comm=comm))]


def _send_transpose(cts, x, *, comm, dest, tag):
    """What was sent comes back: the cotangent from the destination."""
    back = _one(prim.recv, _zeros_like_arg(x), comm=comm, source=dest, tag=TAG_ANY, status=0)
    return [_for(x, back)]


def _recv_transpose(cts, x, *, comm, source, tag, status):
    prim.send.bind(*cts, comm=comm, dest=source, tag=0 if tag == TAG_ANY else tag)
    return [_for(x, _zeros_like_arg(x))]


def _sendrecv_transpose(cts, sendbuf, recvbuf, *, source, dest, sendtag, **params):
    """The cotangent goes back to the rank the data came from; the cotangent of what this
    rank sent comes back from its destination (matched by source, any tag)."""
    # The cotangents are two arrays even where the primal sent and received one.
    params = dict(params, recvtag=TAG_ANY, status=0, replace=False)
    back = _one(
        prim.sendrecv,
        *cts,
        _zeros_like_arg(sendbuf),
        source=dest,
        dest=source,
        sendtag=sendtag,
        **params,
    )
    return [_for(sendbuf, back), _for(recvbuf, _zeros_like_arg(recvbuf))]


def _gatherv_transpose(cts, x, *, comm, root, counts, at_root):
    ct = _cotangent_or_zeros(cts, x)  # away from the root: a template
    rank = _native.comm_rank(comm)
    mine = _one(prim.scatterv, ct, comm=comm, root=root, counts=counts, rank=rank, at_root=at_root)
    return [_for(x, mine)]


def _allgatherv_transpose(cts, x, *, comm, counts):
    """Rank r's rows were copied to every rank: its cotangent is the sum over ranks of
    their cotangents of block r, collected with one alltoallv."""
    (ct,) = cts
    rank, size = _native.comm_rank(comm), _native.comm_size(comm)
    mine = counts[rank]
    blocks = _one(prim.alltoallv, ct, comm=comm, send_counts=counts, recv_counts=(mine,) * size)
    return [_for(x, blocks.reshape((size, mine) + blocks.shape[1:]).sum(axis=0))]


def _scatterv_transpose(cts, x, *, comm, root, counts, rank, at_root):
    outs = prim.gatherv.bind(*cts, comm=comm, root=root, counts=counts, at_root=at_root)
    return [_for(x, _value_or(outs, _zeros_like_arg(x)))]


def _alltoallv_transpose(cts, x, *, comm, send_counts, recv_counts):
    back = _one(prim.alltoallv, *cts, comm=comm, send_counts=recv_counts, recv_counts=send_counts)
    return [_for(x, back)]


def _ragged_alltoallv_transpose(cts, x, output, *counts, **params):
    """The reverse exchange with the same counts brings each received row's cotangent
    back to the row it was sent from; the output's rows nobody wrote keep theirs."""
    (ct,) = cts
    send_displs, send_counts, recv_displs, recv_counts = counts
    back = _one(
        prim.ragged_alltoallv,
        ct,
        _zeros_like_arg(x),
        recv_displs,
        recv_counts,
        send_displs,
        send_counts,
        **params,
    )
    row = jnp.arange(ct.shape[0])[:, None]
    written = ((row >= recv_displs) & (row < recv_displs + recv_counts)).any(axis=1)
    kept = jnp.where(written.reshape((-1,) + (1,) * (ct.ndim - 1)), jnp.zeros_like(ct), ct)
    return [_for(x, back), _for(output, kept), None, None, None, None]


# --- Batching -------------------------------------------------------------------------------


def _batcher(primitive, arg_axis, out_axis):
    """Moves every argument's batch axis to `arg_axis(**params)` (broadcasting unbatched
    ones), binds once, and reports the outputs' batch axis as `out_axis(**params)`."""

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
        return outs, [out_axis(**params)] * len(outs)

    return rule


def _front(**_):
    return 0


def _behind_rank_axis(**_):
    return 1


def _root_axis(*, at_root, **_):
    """Gather's result and scatter's operand have the rank axis in front at the root only."""
    return 1 if at_root else 0


def _ragged_alltoallv_batching(args, dims, **params):
    """Batched data with shared counts: one exchange, the batch axis inside each row.
    Counts that differ along the batch: one exchange per batch entry."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    if any(d is not None for d in dims[2:]):
        entries = [
            _one(
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


def _barrier_batching(args, dims, **params):
    return prim.barrier.bind(**params), []


# --- Non-blocking: the tangent and the cotangent travel as requests of their own --------
# A start's derivative starts a second transfer for the tangent; the request value, a
# float32 array, carries that transfer's request to the wait's derivative, which waits for
# it. Transposed (reverse mode), the program runs backwards: a wait becomes the start of
# the reverse transfer (a send's wait starts receiving the cotangent, a receive's wait
# starts sending it), whose request travels back as the cotangent of the request value to
# the transposed start, which waits for it. So the backward exchange overlaps the
# transposed interior just as the forward one overlaps the interior.


def _wait_jvp(primitive, name: str):
    """The tangent's wait follows the tangents of what the wait follows."""

    def jvp(primals, tangents, **params):
        outs = primitive.bind(*primals, **params)
        if not _differentiable(primals[1]):
            return outs, [jnp.zeros_like(o) for o in outs]
        return outs, primitive.bind(*tangents, **params)

    return jvp


def _wait_transpose(cts, value, buffer, *after, comm, sends, peer, tag):
    """The reverse transfer starts here: its request and buffer are the cotangents of the
    wait's request value and buffer, for the transposed start to wait for. What the wait
    followed gets zero cotangents, which the transposed interior adds to its own: so it
    runs after this start, as the interior ran before the wait."""
    if sends:
        back = prim.irecv.bind(
            _zeros_like_arg(buffer), comm=comm, source=peer, tag=TAG_ANY, status=0
        )
    else:
        (ct,) = cts
        back = prim.isend.bind(ct, comm=comm, dest=peer, tag=0 if tag == TAG_ANY else tag)
    return [*back, *(_zeros_like_arg(a) if _jax_shim.is_linear(a) else None for a in after)]


def _start_transpose(primitive):
    def transpose(cts, x, *, comm, tag, **params):
        sends = primitive is prim.isend
        peer = params["dest"] if sends else params["source"]
        (received,) = prim.wait.bind(*cts, comm=comm, sends=not sends, peer=peer, tag=tag)
        return [received if sends else _zeros_like_arg(x)]

    return transpose


def _start_batching(primitive):
    """The batch axis in front: one message for the whole batch; the request is one."""

    def rule(args, dims, **params):
        (x,), (d,) = args, dims
        x = jnp.moveaxis(x, d, 0) if d is not None else x
        return primitive.bind(x, **params), [None, 0 if d is not None else None]

    return rule


def _wait_batching(args, dims, **params):
    """What the wait follows keeps its batch axes: it is never read."""
    if dims[0] is not None:
        raise NotImplementedError(
            "jaxmpi.wait: a batch of requests (vmap over isend/irecv calls made outside "
            "the vmapped function) cannot be waited for; start and wait inside vmap"
        )
    return prim.wait.bind(*args, **params), [dims[1]]


# --- The table: every primitive's rules, one row each ------------------------------------


class Rules(NamedTuple):
    """How JAX differentiates and batches one primitive: `jvp(primitive, name)` makes its
    JVP rule (None: no derivative, no operands), `transpose` is its transpose rule (None:
    not linear), `batch` is (operand axis, result axis) for `_batcher`, each a function of
    the op's parameters, or a whole batching rule."""

    jvp: Callable | None
    transpose: Callable | None
    batch: tuple[Callable, Callable] | Callable


RULES: dict[str, Rules] = {
    "allreduce": Rules(_reduction_jvp, _allreduce_transpose, (_front, _front)),
    "reduce": Rules(_reduction_jvp, _reduce_transpose, (_front, _front)),
    "scan": Rules(_sum_only_jvp, _scan_transpose, (_front, _front)),
    "exscan": Rules(_sum_only_jvp, _exscan_transpose, (_front, _front)),
    "reduce_scatter": Rules(_sum_only_jvp, _reduce_scatter_transpose, (_behind_rank_axis, _front)),
    "bcast": Rules(_linear_jvp, _bcast_transpose, (_front, _front)),
    "gather": Rules(_linear_jvp, _gather_transpose, (_front, _root_axis)),
    "allgather": Rules(_linear_jvp, _allgather_transpose, (_front, _behind_rank_axis)),
    "scatter": Rules(_linear_jvp, _scatter_transpose, (_root_axis, _front)),
    "alltoall": Rules(_linear_jvp, _alltoall_transpose, (_behind_rank_axis, _behind_rank_axis)),
    "gatherv": Rules(_linear_jvp, _gatherv_transpose, (_behind_rank_axis, _behind_rank_axis)),
    "allgatherv": Rules(_linear_jvp, _allgatherv_transpose, (_behind_rank_axis, _behind_rank_axis)),
    "scatterv": Rules(_linear_jvp, _scatterv_transpose, (_behind_rank_axis, _behind_rank_axis)),
    "alltoallv": Rules(_linear_jvp, _alltoallv_transpose, (_behind_rank_axis, _behind_rank_axis)),
    "send": Rules(_linear_jvp, _send_transpose, (_front, _front)),
    "recv": Rules(_named_source_jvp, _recv_transpose, (_front, _front)),
    "sendrecv": Rules(_named_source_jvp, _sendrecv_transpose, (_front, _front)),
    "barrier": Rules(None, None, _barrier_batching),
    "ragged_alltoallv": Rules(_ragged_jvp, _ragged_alltoallv_transpose, _ragged_alltoallv_batching),
    "isend": Rules(_linear_jvp, _start_transpose(prim.isend), _start_batching(prim.isend)),
    "irecv": Rules(_named_source_jvp, _start_transpose(prim.irecv), _start_batching(prim.irecv)),
    "wait": Rules(_wait_jvp, _wait_transpose, _wait_batching),
    "allreduce_transposed": Rules(_linear_jvp, _allreduce_transposed_transpose, (_front, _front)),
}  # fmt: skip

for _name, _rules in RULES.items():
    _primitive = prim.PRIMITIVES[_name]
    if _rules.jvp is not None:
        _jax_shim.def_jvp(_primitive, _rules.jvp(_primitive, _name))
    if _rules.transpose is not None:
        _jax_shim.def_transpose(_primitive, _rules.transpose)
    _batch = _rules.batch if callable(_rules.batch) else _batcher(_primitive, *_rules.batch)
    _jax_shim.def_batching(_primitive, _batch)
