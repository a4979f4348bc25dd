"""Non-blocking point to point inside jit: `isend`, `irecv`, `wait`, `waitall`, and
`after`, which places work between a start and its wait.

A start returns a `Request`: the request value (which request, for the wait) and the
buffer its transfer uses, both private to the request. `wait` hands both to the wait op,
so XLA keeps the buffer alive and untouched until MPI is done with it, and everything that
reads received data runs after the wait. Nothing else orders a start, a wait and the work
between them: XLA runs independent work in any order. `after(requests, x)` makes `x` (the
interior's input) available only once the requests have started, and
`wait(request, after=y)` waits only once `y` (the interior's result) is computed. Both are
data dependences XLA cannot remove: a run-time zero subtracted from `x`, and `y` as unread
operands of the wait. (`lax.optimization_barrier`, which JAX's docs suggest for
psend/precv, does not do it on the CPU: XLA drops the barrier and fuses the interior into
a kernel after the wait.)

Misuse is refused while tracing: a request waited twice, waited in another function,
branch or loop body than the one that started it, or never waited (checked when the
program is lowered: `_binding/requests.py`). A Request is no JAX type: returning it from a
jitted function or carrying it through a loop fails in JAX itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ._binding import jax_shim
from ._binding import primitives as prim
from ._comm import CommArg, CommInfo
from ._errors import raise_mpi_errors
from ._ops import recv_args, send_args
from ._runtime.encodings import PEER_ANY, PEER_NULL, TAG_ANY
from ._token import refuses_token


def _peer_name(peer: int) -> str:
    return {PEER_ANY: "ANY_SOURCE", PEER_NULL: "PROC_NULL"}.get(peer, str(peer))


class Request:
    """A started `isend` or `irecv`. Pass it to `jaxmpi.wait` (or `waitall`) exactly once,
    in the function that started it (the same jitted function, branch or loop body)."""

    __slots__ = ("_buffer", "_params", "_trace", "_value", "_waited")

    def __init__(self, value, buffer, params: dict) -> None:
        self._value, self._buffer, self._params = value, buffer, params
        # Outside any trace, the start ran (its values are concrete): no place to match.
        self._trace = jax_shim.current_trace() if jax_shim.is_tracing() else None
        self._waited = False

    @property
    def sends(self) -> bool:
        return self._params["sends"]

    def __repr__(self) -> str:
        p = self._params
        op, toward = ("isend", "to") if p["sends"] else ("irecv", "from")
        tag = "ANY_TAG" if p["tag"] == TAG_ANY else p["tag"]
        return f"jaxmpi.Request({op} {toward} {_peer_name(p['peer'])}, tag {tag})"


def _start(primitive, x, c: CommInfo, peer: int, tag: int, **attrs) -> Request:
    value, buffer = primitive.bind(x, comm=c.handle, tag=tag, **attrs)
    params = {"comm": c.handle, "sends": primitive is prim.isend, "peer": peer, "tag": tag}
    return Request(value, buffer, params)


@refuses_token
@raise_mpi_errors()
def isend(x: ArrayLike, dest: int, *, tag: int = 0, comm: CommArg = None) -> Request:
    """Starts sending `x` to rank `dest`; returns the request to `wait` for. `x` is not
    copied: XLA keeps it alive until the wait."""
    x, c, dest, tag = send_args(x, dest, tag, comm, "isend")
    return _start(prim.isend, x, c, dest, tag, dest=dest)


@refuses_token
@raise_mpi_errors()
def irecv(
    x: ArrayLike,
    source: int | None = None,
    *,
    tag: int | None = None,
    comm: CommArg = None,
    status: Any = None,
) -> Request:
    """Starts receiving an array shaped like `x` (a template; its values are ignored) from
    `source` (default: any) with `tag` (default: any); `wait` returns it, and fills
    `status` (an mpi4py Status) if given. For derivatives, give a named source, and a
    template that depends on the differentiated values (such as the halo it replaces), as
    for `recv`."""
    x, c, source, tag, address = recv_args(x, source, tag, comm, status, "irecv")
    return _start(prim.irecv, x, c, source, tag, source=source, status=address)


def _waitable(request: Any, op: str) -> Request:
    if not isinstance(request, Request):
        raise TypeError(
            f"jaxmpi.{op}: expected a jaxmpi.Request (what isend and irecv return), got "
            f"{type(request).__name__}"
        )
    if request._waited:
        raise ValueError(f"jaxmpi.{op}: {request!r} was waited for already; wait once")
    if request._trace is not None and request._trace is not jax_shim.current_trace():
        raise ValueError(
            f"jaxmpi.{op}: {request!r} was started in another function, branch or loop "
            "body than this one. Wait for a request in the function that started it (the "
            "same jitted function, cond branch or loop body); to overlap across loop "
            "iterations, start and wait within each iteration."
        )
    return request


def _tied(x, zero):
    """`x`, bit for bit, computed from `zero` too: subtracting a zero keeps every value
    (-0.0 and NaN included), XLA cannot fold it away (it is not known before run time),
    and it fuses into the first kernel reading `x`."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        return x ^ (zero != zero)  # False: a request value is never NaN
    return x - zero.astype(x.dtype)


def after(first: Any, value: Any) -> Any:
    """`value` (an array or a pytree of arrays), available only once `first` (requests,
    or a pytree of them) has started: `u = jaxmpi.after(requests, u)` before the interior
    makes the transfers start first, whatever order XLA would choose. Costs nothing: an
    elementwise subtraction of a run-time zero, fused into the interior's first kernel."""
    leaves = jax.tree_util.tree_leaves(first, is_leaf=lambda r: isinstance(r, Request))
    if not all(isinstance(r, Request) for r in leaves):
        raise TypeError("jaxmpi.after: `first` must be requests (what isend and irecv return)")
    if not leaves:
        return value
    zero = sum((r._value[0] * 0 for r in leaves[1:]), leaves[0]._value[0] * 0)
    return jax.tree_util.tree_map(lambda x: _tied(x, zero), value)


@refuses_token
@raise_mpi_errors()
def wait(request: Request, *, after: Any = None) -> jax.Array | None:
    """Completes `request`: returns the received array for an irecv, None for an isend.
    `after` (arrays, a pytree): wait only once they are computed (the interior's result),
    so the transfer overlaps their computation."""
    request = _waitable(request, "wait")
    request._waited = True
    # Operands of the wait, never read: XLA has to compute them before it, and cannot
    # move their computation into a kernel after it.
    follows = [jnp.asarray(a) for a in jax.tree_util.tree_leaves(after)]
    (y,) = prim.wait.bind(request._value, request._buffer, *follows, **request._params)
    return None if request.sends else y


@refuses_token
@raise_mpi_errors()
def waitall(requests: Sequence[Request], *, after: Any = None) -> list:
    """Completes every request, in order: what `wait` returns for each."""
    requests = list(requests)
    for request in requests:
        _waitable(request, "waitall")
    if len({id(r) for r in requests}) != len(requests):
        raise ValueError("jaxmpi.waitall: the same request appears twice; wait once")
    return [wait(r, after=after) for r in requests]
