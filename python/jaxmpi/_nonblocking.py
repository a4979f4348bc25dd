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

from ._binding import jax_shim
from ._binding import primitives as prim
from ._comm import CommArg, CommInfo, StatusArg
from ._errors import raise_mpi_errors
from ._p2p import recv_args, send_args
from ._runtime.encodings import PEER_ANY, PEER_NULL, TAG_ANY
from ._token import refuses_token
from ._trees import PyTree, Tree, pack, unpack


def _peer_name(peer: int) -> str:
    return {PEER_ANY: "ANY_SOURCE", PEER_NULL: "PROC_NULL"}.get(peer, str(peer))


class Request:
    """A transfer started by `isend` or `irecv`, to complete with `wait` or `waitall`.

    Returned by `isend` and `irecv`, never made by users. Pass it to `wait` (or
    `waitall`) exactly once, in the function that started it: the same jitted function,
    `cond` branch or loop body (to overlap across loop iterations, start and wait within
    each). A request is no JAX type: returning it from a jitted function or carrying it
    through a loop fails in JAX itself. One started outside `jit` and never waited for
    is cancelled at exit and reported on stderr.

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

    __slots__ = ("_params", "_parts", "_rebuild", "_trace", "_waited")

    def __init__(self, parts: list, params: dict, rebuild) -> None:
        # One (request value, transfer buffer) per message: a pytree travels as one per
        # group of leaves (`_trees.py`); `rebuild` makes what `wait` returns of the
        # buffers the waits give back.
        self._parts, self._params, self._rebuild = parts, params, rebuild
        # Outside any trace, the start ran (its values are concrete): no place to match.
        self._trace = jax_shim.current_trace() if jax_shim.is_tracing() else None
        self._waited = False

    @property
    def sends(self) -> bool:
        """True for the request of an `isend`, False for an `irecv`'s."""
        return self._params["sends"]

    def __repr__(self) -> str:
        p = self._params
        op, toward = ("isend", "to") if p["sends"] else ("irecv", "from")
        tag = "ANY_TAG" if p["tag"] == TAG_ANY else p["tag"]
        return f"jaxmpi.Request({op} {toward} {_peer_name(p['peer'])}, tag {tag})"


def _start(primitive, tree: Tree, c: CommInfo, peer: int, tag: int, **attrs) -> Request:
    fingerprint, parts, groups = tree.fingerprint(0), [], tree.groups(0)
    for group in groups:
        leaves = [tree.leaves[i] for i in group]
        parts.append(
            primitive.bind(pack(leaves, 0), comm=c.handle, tag=tag, tree=fingerprint, **attrs)
        )
    params = {"comm": c.handle, "sends": primitive is prim.isend, "peer": peer, "tag": tag}

    def rebuild(received: list) -> PyTree:
        out = list(tree.leaves)
        for group, y in zip(groups, received):
            for i, piece in zip(group, unpack(y, [tree.leaves[i] for i in group], 0)):
                out[i] = piece
        return tree.rebuild(out)

    return Request(parts, params, rebuild)


@refuses_token
@raise_mpi_errors()
def isend(x: PyTree, dest: int, *, tag: int = 0, comm: CommArg = None) -> Request:
    """Starts sending `x` to rank `dest`; returns the request to `wait` for.

    MPI_Isend: the transfer proceeds while the program computes, until `wait`. `x` is not
    copied: XLA keeps it alive and unchanged until the wait. Inside `jax.jit`, XLA may run
    independent work before the start or after the wait; `after` and `wait(after=...)` pin
    the work between them. Wait for the request exactly once, in the same function (branch,
    loop body) that started it.

    Args:
        x: The array to send, any shape and supported dtype. Or a pytree of them, moved as
            one: one MPI call per dtype.
        dest: The receiving rank, or `PROC_NULL` (nothing is sent): a static int.
        tag: The message's tag, an int in `[0, 2**31)` (default 0).
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        A `Request`, for `wait` or `waitall` (where it gives None).

    Derivative:
        Linear: the tangent travels as a second non-blocking transfer, started and waited
        next to the value's. Reverse mode runs the exchange backwards, still overlapped: the
        wait starts receiving the cotangent from `dest`, the start waits for it. `vmap`:
        one message for the whole batch.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; a rank is not a static int.
        ValueError: A rank outside `comm` (or `ANY_SOURCE` as `dest`); a tag that is not an
            int in `[0, 2**31)`; `comm` is freed, `COMM_NULL` or an intercommunicator; the
            op is in a program over several devices outside `shard_map`; or, when the
            program is lowered, the request is never waited for in the function (branch,
            loop body) that started it.
        NotImplementedError: `x` is a GPU array (not supported yet: use `sendrecv`).
        RuntimeError: `token` was passed.
        MPIError: MPI failed to start the transfer. A transfer that fails later raises at
            its `wait`. Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax
            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            other = 1 - rank

            @jax.jit
            def swap(x):
                sent = jaxmpi.isend(x, dest=other)
                got = jaxmpi.irecv(jnp.zeros_like(x), source=other)
                jaxmpi.wait(sent)
                return jaxmpi.wait(got)

            print(rank, swap(jnp.full(2, float(rank))))

        .. output::

            0 [1. 1.]
            1 [0. 0.]
    """
    tree, c, dest, tag = send_args(x, dest, tag, comm, "isend")
    return _start(prim.isend, tree, c, dest, tag, dest=dest)


@refuses_token
@raise_mpi_errors()
def irecv(
    x: PyTree,
    source: int | None = None,
    *,
    tag: int | None = None,
    comm: CommArg = None,
    status: StatusArg = None,
) -> Request:
    """Starts receiving an array shaped like `x` from rank `source`; `wait` returns it.

    MPI_Irecv: the message arrives while the program computes, until `wait`. `x` is a
    template: only its shape and dtype matter, its values are never read. Wait for the
    request exactly once, in the same function (branch, loop body) that started it.

    Args:
        x: Template of the message: its shape and dtype. Or a pytree of templates.
        source: The sending rank, `ANY_SOURCE` (None, the default, means it too), or
            `PROC_NULL` (nothing arrives: `wait` returns `x`). A static int.
        tag: The tag to match; None (default) or `ANY_TAG` match any.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        status: An mpi4py `MPI.Status`, filled in by the `wait`: the source, tag and
            element count. With it, a message shorter than `x` is accepted.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        A `Request`, for `wait` or `waitall` (where it gives the array received, or the
        pytree of `x`'s structure).

    Derivative:
        As `recv`'s: linear, for a named `source` (`ANY_SOURCE` raises
        NotImplementedError), and only if `x` depends on the differentiated values (pass the
        halo the result replaces). The tangent travels as a second non-blocking transfer;
        reverse mode sends the cotangent back to `source`, overlapped as the forward
        exchange. `vmap`: one message for the whole batch.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; a rank is not a static int; `status` is no `MPI.Status`.
        ValueError: A rank outside `comm`; a tag that is not an int in `[0, 2**31)`; `comm`
            is freed, `COMM_NULL` or an intercommunicator; the op is in a program over
            several devices outside `shard_map`; `status` with a pytree `x`, or a pytree of
            several dtypes from `ANY_SOURCE`; or, when the program is lowered, the request
            is never waited for in the function (branch, loop body) that started it.
        NotImplementedError: `x` is a GPU array (not supported yet: use `sendrecv`).
        RuntimeError: `token` was passed.
        MPIError: MPI failed to start the transfer. A transfer that fails later raises at
            its `wait`. Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax
            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()

            @jax.jit
            def step(x):
                if rank == 0:
                    jaxmpi.wait(jaxmpi.isend(x, dest=1))
                    return x
                request = jaxmpi.irecv(jnp.zeros_like(x), source=0)
                return jaxmpi.wait(request)

            print(rank, step(jnp.arange(3.0) * (1 - rank)))

        .. output::

            0 [0. 1. 2.]
            1 [0. 1. 2.]
    """
    tree, c, source, tag, address = recv_args(x, source, tag, comm, status, "irecv")
    return _start(prim.irecv, tree, c, source, tag, source=source, status=address)


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


def after(first: PyTree, value: PyTree) -> PyTree:
    """`value`, made available only once the requests in `first` have started.

    Inside `jax.jit`, XLA orders only what data dependence orders: `u = after(requests, u)`
    before the interior computation makes the transfers start before it, whatever order
    XLA would choose (pair it with `wait(request, after=interior)`). Costs nothing: an
    elementwise subtraction of a run-time zero, fused into the first kernel that reads the
    result.

    Args:
        first: Requests (`isend`, `irecv`), or a pytree of them; empty: `value` unchanged.
        value: An array, or a pytree of arrays.

    Returns:
        `value`, bit for bit (same structure, shapes and dtypes).

    Derivative:
        The identity on `value`; nothing flows to the requests. `vmap`: elementwise.

    Raises:
        TypeError: A leaf of `first` is not a `Request`.

    Example:
        .. mpirun::

            import jax
            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()

            @jax.jit
            def step(u):
                request = jaxmpi.isend(u, jaxmpi.PROC_NULL)
                u = jaxmpi.after(request, u)  # the interior starts after the send
                interior = jnp.sin(u) ** 2 + jnp.cos(u) ** 2
                jaxmpi.wait(request, after=interior)
                return interior

            print(rank, step(jnp.zeros(2)))

        .. output::

            0 [1. 1.]
            1 [1. 1.]
    """
    leaves = jax.tree_util.tree_leaves(first, is_leaf=lambda r: isinstance(r, Request))
    if not all(isinstance(r, Request) for r in leaves):
        raise TypeError("jaxmpi.after: `first` must be requests (what isend and irecv return)")
    if not leaves:
        return value
    values = [value for r in leaves for value, _ in r._parts]
    if not values:  # requests of empty pytrees: nothing started
        return value
    zero = sum((v[0] * 0 for v in values[1:]), values[0][0] * 0)
    return jax.tree_util.tree_map(lambda x: _tied(x, zero), value)


@refuses_token
@raise_mpi_errors()
def wait(request: Request, *, after: PyTree = None) -> jax.Array | None:
    """Completes `request`: returns what an `irecv` received, None for an `isend`.

    MPI_Wait. Everything that reads the received array runs after it; work that does not
    depend on it may run before, overlapping the transfer: `after` says which (the
    interior's result), so that XLA cannot move that work past the wait.

    Args:
        request: What `isend` or `irecv` returned, in this same function (jitted function,
            `cond` branch or loop body), not yet waited for.
        after: Arrays, or any pytree of them, that must be computed before the wait (they
            are not read). None (default): no such constraint.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The array received (shaped like the `irecv` template; a pytree of its structure
        for a pytree template), or None for an `isend`.

    Derivative:
        The tangent's transfer is waited for next to the value's. Reverse mode starts the
        reverse transfer here (a send's wait starts receiving its cotangent), so the backward
        exchange overlaps the transposed interior. `vmap`: inside the vmapped function; a
        batch of requests started outside it raises NotImplementedError.

    Raises:
        TypeError: `request` is not a `Request`.
        ValueError: `request` was waited for already, or was started in another function,
            `cond` branch or loop body.
        RuntimeError: `token` was passed.
        MPIError: The transfer failed (a message longer than the receive template, or
            without `status` shorter). Inside your own jitted function JAX raises its own
            error instead; `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax
            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            other = 1 - rank

            @jax.jit
            def step(u):
                requests = [jaxmpi.isend(u[:1], other), jaxmpi.irecv(u[:1], other)]
                interior = jaxmpi.after(requests, u) * 2  # computed while the halo travels
                _, halo = [jaxmpi.wait(r, after=interior) for r in requests]
                return interior.sum() + halo[0]

            print(rank, step(jnp.arange(3.0) + 10 * rank))

        .. output::

            0 16.0
            1 66.0
    """
    request = _waitable(request, "wait")
    request._waited = True
    # Operands of the wait, never read: XLA has to compute them before it, and cannot
    # move their computation into a kernel after it.
    follows = [jnp.asarray(a) for a in jax.tree_util.tree_leaves(after)]
    received = [
        prim.wait.bind(value, buffer, *follows, **request._params)[0]
        for value, buffer in request._parts
    ]
    return None if request.sends else request._rebuild(received)


@refuses_token
@raise_mpi_errors()
def waitall(requests: Sequence[Request], *, after: PyTree = None) -> list:
    """Completes every request in `requests`, in order: what `wait` returns for each.

    MPI_Wait on each request in turn: one call for the requests of an exchange.

    Args:
        requests: Requests (a sequence), each started in this same function, none twice.
        after: As for `wait`: arrays (a pytree) to compute before any of the waits.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        A list with one entry per request, the array (or pytree) received for an `irecv`
        and None for an `isend`.

    Derivative:
        As `wait`'s, for each request.

    Raises:
        TypeError: An entry is not a `Request`.
        ValueError: A request appears twice, was waited for already, or was started in
            another function, `cond` branch or loop body.
        RuntimeError: `token` was passed.
        MPIError: A transfer failed. Inside your own jitted function JAX raises its own
            error instead; `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            other = 1 - rank
            sent = jaxmpi.isend(jnp.full(2, rank), other)
            requests = [sent, jaxmpi.irecv(jnp.zeros(2, jnp.int32), other)]
            print(rank, jaxmpi.waitall(requests))

        .. output::

            0 [None, Array([1, 1], dtype=int32)]
            1 [None, Array([0, 0], dtype=int32)]
    """
    requests = list(requests)
    for request in requests:
        _waitable(request, "waitall")
    if len({id(r) for r in requests}) != len(requests):
        raise ValueError("jaxmpi.waitall: the same request appears twice; wait once")
    return [wait(r, after=after) for r in requests]
