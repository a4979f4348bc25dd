"""Rules of every started op (`iallreduce`, `isend`, ...) and of `wait`, derived from the
op's own row of `RULES`: one set of rules for all of them.

A start's derivative starts a second transfer for the tangent (the op must be linear: a
SUM reduction, or an op that moves data); the request value, a float32 array, carries
that transfer's request to the wait's derivative, which waits for it. `vmap`: the op's own
batch axes, one message for the whole batch; the request is one.

Transposed (reverse mode) the program runs backwards: a wait's transpose comes before the
transposed interior, the start's after it. Where the op's row names a `Reverse` (point
to point: the adjoint of a send is a receive, of a receive a send), the wait's transpose
starts that adjoint, whose request and buffers travel back as the cotangents of the
wait's operands to the start's transpose, which waits for it: the backward transfer
overlaps the transposed interior as the forward one overlapped the interior. For every
other op the start's transpose is the op's own transpose, made where the start was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp

from ..._runtime.encodings import PEER_ANY, TAG_ANY
from .. import jax_shim
from .. import primitives as prim
from .common import SUM, batcher, cotangent_for, differentiable, op_name, zeros_like_arg


class Reverse(NamedTuple):
    """An op's adjoint as a started op, for overlapped reverse mode: `adjoint(params)` its
    (op, parameters); `inputs(cts, buffers, params)` its operands from the cotangents of
    the wait's results and the wait's buffers (the start's outputs: their shapes are the
    adjoint's outputs' too); `cotangents(received, operands, params)` the start's operands'
    cotangents from what the adjoint's wait returned."""

    adjoint: Callable[[dict], tuple[str, dict]]
    inputs: Callable[[list, list, dict], list]
    cotangents: Callable[[list, tuple, dict], list]


def _linear(name: str, params: dict) -> None:
    started = prim.SIGNATURES[name]["started"]
    if params.get("op", SUM) != SUM:
        raise NotImplementedError(
            f"jaxmpi.{started}: derivatives are defined for op=SUM only, not "
            f"{op_name(params['op'])} (the blocking jaxmpi.{name} differentiates it)"
        )
    if params.get("source") == PEER_ANY:
        raise NotImplementedError(
            f"jaxmpi.{started}: cannot differentiate a receive from ANY_SOURCE; give the "
            "source rank"
        )


def started_jvp(name: str):
    """The tangent's transfer starts next to the value's; its request is the tangent of
    the request value."""
    primitive = prim.STARTED[name]

    def jvp(primals, tangents, **params):
        _linear(name, params)
        outs = primitive.bind(*primals, **params)
        if not differentiable(primals[0]):
            return outs, [jnp.zeros_like(o) for o in outs]
        quiet = dict(params, status=0) if "status" in params else params
        return outs, primitive.bind(*tangents, **quiet)

    return jvp


def started_transpose(name: str, transpose: Callable | None, reverse: Reverse | None):
    def rule(cts, *operands, results, **params):
        request, *outs = cts
        if reverse is None:  # the op's own transpose, here
            assert transpose is not None, f"jaxmpi.{name} is started but not linear"
            return transpose(outs[:results], *operands, **params)
        # The wait's transpose started the adjoint: its request and buffers came back.
        op, adjoint = reverse.adjoint(params)
        mine = len(outs) - len(_through(op, adjoint))
        received = prim.wait_for(op, request, outs[:mine], outs[mine:], adjoint)
        return reverse.cotangents(received, operands, params)

    return rule


def _through(name: str, params: dict) -> list[int]:
    return prim.passed_through(name, **params)


def started_batching(name: str, batch):
    """The op's own batch axes (one message for the batch); the request is one."""
    arg_axis, out_axis = batch

    def out_dims(axis, **params):
        through = len(_through(name, prim.op_params(params)))
        return [None] + [out_axis(**params)] * params["results"] + [axis] * through

    return batcher(prim.STARTED[name], arg_axis, out_axis, out_dims)


def wait_jvp(primitive, name: str):
    """The tangent's wait follows the tangents of what the wait follows."""

    def jvp(primals, tangents, **params):
        outs = primitive.bind(*primals, **params)
        if params["buffers"] == 0 or not differentiable(primals[1]):
            return outs, [jnp.zeros_like(o) for o in outs]
        return outs, primitive.bind(*tangents, **params)

    return jvp


def wait_transpose(reverses: dict[str, Reverse]):
    def rule(cts, request, *operands, results, buffers, op, op_params, comm):
        params = dict(op_params)
        bufs, after = operands[:buffers], operands[buffers:]
        follows = [zeros_like_arg(a) if jax_shim.is_linear(a) else None for a in after]
        reverse = reverses.get(op)
        if reverse is None:  # the start's transpose makes the op's own
            back = [*cts, *(zeros_like_arg(b) for b in bufs[results:])]
            ct_request = zeros_like_arg(request) if jax_shim.is_linear(request) else None
            return [ct_request, *(cotangent_for(b, c) for b, c in zip(bufs, back)), *follows]
        adjoint_op, adjoint = reverse.adjoint(params)
        inputs = reverse.inputs(list(cts), list(bufs), params)
        value, outs, through = prim.start(adjoint_op, *inputs, **adjoint)
        return [value, *outs, *through, *follows]

    return rule


def wait_batching(args, dims, **params):
    """What the wait follows keeps its batch axes: it is never read."""
    if dims[0] is not None:
        raise NotImplementedError(
            "jaxmpi.wait: a batch of requests (vmap over started ops made outside the "
            "vmapped function) cannot be waited for; start and wait inside vmap"
        )
    return prim.wait.bind(*args, **params), list(dims[1 : 1 + params["results"]])


def rules_of_started(name: str, transpose: Callable | None, batch, reverse: Reverse | None):
    """(jvp, transpose, batching) of `name`'s started form."""
    return (
        started_jvp(name),
        started_transpose(name, transpose, reverse),
        started_batching(name, batch),
    )


def _receive_back(p: dict) -> tuple[str, dict]:
    return "recv", {"comm": p["comm"], "source": p["dest"], "tag": TAG_ANY, "status": 0}


def _send_back(p: dict) -> tuple[str, dict]:
    tag = 0 if p["tag"] == TAG_ANY else p["tag"]
    return "send", {"comm": p["comm"], "dest": p["source"], "tag": tag}


#: What was sent comes back: the cotangent from the destination, received where the wait
#: was and waited for where the send started.
SEND_REVERSE = Reverse(
    adjoint=_receive_back,
    inputs=lambda cts, bufs, p: [zeros_like_arg(bufs[0])],
    cotangents=lambda received, operands, p: [cotangent_for(operands[0], received[0])],
)

#: The cotangent goes back to the source, sent where the receive's wait was.
RECV_REVERSE = Reverse(
    adjoint=_send_back,
    inputs=lambda cts, bufs, p: [cts[0]],
    cotangents=lambda received, operands, p: [
        cotangent_for(operands[0], zeros_like_arg(operands[0]))
    ],
)
