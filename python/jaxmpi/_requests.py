"""Requests: what a started op returns, and how any op is started.

An op's non-blocking form is the op itself run in starting mode (`starting`): its
arguments are checked and its pytree packed as always, but every bind of a primitive
(`apply`) starts that primitive's started form instead (`_binding/primitives.py`, derived
from the op's row of the table) and gives back placeholders (`Pending`) for its results,
which nothing may read before the wait. `_trees.each_group` then leaves a `Request` in the
mode's holder: the request values and buffers of every group, and how the wait's results
become the op's result (the pytree, cut back into leaves). So an op needs no code of its
own to be started; `jaxmpi/_nonblocking.py` makes the public functions.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ._binding import jax_shim
from ._binding import primitives as prim
from ._runtime.encodings import PEER_ANY, PEER_NULL, TAG_ANY


class Part(NamedTuple):
    """One started primitive: its request value, the op's results and the operands it
    passed through (for the wait), which op with which parameters."""

    value: Any
    results: list
    through: list
    op: str
    params: dict


class Pending:
    """A started op's result, for its request's wait only: no array, so that nothing can
    compute on it before the wait (which would read the buffer MPI is still filling)."""

    __slots__ = ("index", "part")

    def __init__(self, part: Part, index: int) -> None:
        self.part, self.index = part, index


def _peer_name(peer: int) -> str:
    return {PEER_ANY: "ANY_SOURCE", PEER_NULL: "PROC_NULL"}.get(peer, str(peer))


class Request:
    """An op started by `isend`, `irecv`, `iallreduce` or any other started op, to
    complete with `wait` or `waitall`.

    Returned by the started ops, never made by users. Pass it to `wait` (or `waitall`)
    exactly once, in the function that started it: the same jitted function, `cond` branch
    or loop body (to overlap across loop iterations, start and wait within each). A
    request is no JAX type: returning it from a jitted function or carrying it through a
    loop fails in JAX itself. One started outside `jit` and never waited for is given up
    at exit (a receive cancelled, a collective completed) and reported on stderr. A
    pytree's request stands for all its messages (one per dtype).

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            request = jaxmpi.isend(jnp.ones(2), dest=jaxmpi.PROC_NULL, tag=3)
            print(request, request.sends)
            jaxmpi.wait(request)

        .. output::

            jaxmpi.Request(isend to PROC_NULL, tag 3) True
            jaxmpi.Request(isend to PROC_NULL, tag 3) True
    """

    __slots__ = ("_op", "_params", "_parts", "_rebuild", "_trace", "_waited")

    def __init__(self, op: str, params: dict, parts: list[Part], rebuild: Callable) -> None:
        # `rebuild(results)`: what `wait` returns, given each part's results (by part).
        self._op, self._params, self._parts, self._rebuild = op, params, parts, rebuild
        # Outside any trace, the start ran (its values are concrete): no place to match.
        self._trace = jax_shim.current_trace() if jax_shim.is_tracing() else None
        self._waited = False

    @property
    def sends(self) -> bool:
        """True for the request of an `isend` (its wait gives None), else False."""
        return self._op == "isend"

    def __repr__(self) -> str:
        p = self._params
        if self._op in ("isend", "irecv"):
            peer = _peer_name(p["dest"] if self._op == "isend" else p["source"])
            toward = "to" if self._op == "isend" else "from"
            tag = "ANY_TAG" if p["tag"] == TAG_ANY else p["tag"]
            return f"jaxmpi.Request({self._op} {toward} {peer}, tag {tag})"
        root = f", root {p['root']}" if "root" in p else ""
        return f"jaxmpi.Request({self._op}{root})"


class _Holder:
    """Starting mode for one public call: what its binds started, and its request."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.parts: list[Part] = []
        self.params: dict = {}
        self.request: Request | None = None


_mode = threading.local()


@contextlib.contextmanager
def starting(op: str) -> Iterator[_Holder]:
    """Starting mode, on this thread, for the call of `op` (a started op's public name)
    made inside: its request is the holder's."""
    holder, previous = _Holder(op), getattr(_mode, "holder", None)
    _mode.holder = holder
    try:
        yield holder
    finally:
        _mode.holder = previous


def _holder() -> _Holder | None:
    return getattr(_mode, "holder", None)


def apply(primitive, *operands, **params) -> list:
    """`primitive.bind(*operands, **params)`, the bind of every public op; in starting mode
    the start of its started form instead, whose results are `Pending`."""
    if params.get("tree") == 0:  # a single array's: the default, bound as before pytrees
        del params["tree"]
    holder = getattr(_mode, "holder", None)
    if holder is None:
        return primitive.bind(*operands, **params)
    op = primitive.name.removeprefix("jaxmpi_")
    if op not in prim.STARTED:
        raise NotImplementedError(
            f"jaxmpi.{holder.op}: this call makes a jaxmpi.{op}, which has no non-blocking "
            "form: use the blocking op"
        )
    if holder.parts and holder.parts[0].op != op:
        raise NotImplementedError(f"jaxmpi.{holder.op}: starts more than one kind of op")
    value, results, through = prim.start(op, *operands, **params)
    part = Part(value, results, through, op, params)
    holder.parts.append(part)
    holder.params = params
    return [Pending(part, i) for i in range(len(results))]


def is_starting() -> bool:
    return _holder() is not None


def finish(rebuild: Callable) -> Request:
    """The request of the call being started: its parts, and `rebuild`, which makes what
    its wait returns from a function giving each `Pending` its array."""
    holder = _holder()
    assert holder is not None, "finish outside starting mode"
    holder.request = Request(holder.op, holder.params, list(holder.parts), rebuild)
    return holder.request
