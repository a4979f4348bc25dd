"""Non-blocking ops inside jit: every started op (`isend`, `irecv`, `iallreduce`, `ibcast`,
`iallgather`, `ialltoall`, `ireduce_scatter`, ...), `wait`, `waitall`, and `after`, which
places work between a start and its wait.

Each started op is its op run in starting mode (`_requests.py`): the same checks, the same
pytree packing, the op's started form bound instead of the op. It returns a `Request`:
the request values (which requests, for the wait) and the buffers their transfers use,
all private to the request. `wait` hands them to the wait op, so XLA keeps the buffers
alive and untouched until MPI is done with them, and everything that reads the op's
results runs after the wait. Nothing else orders a start, a wait and the work between
them: XLA runs independent work in any order. `after(requests, x)` makes `x` (the
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

import functools
import inspect
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec

import jax
import jax.numpy as jnp

from . import _native
from ._binding import jax_shim
from ._binding import primitives as prim
from ._collectives import allgather, alltoall, bcast, gather, scatter
from ._comm import CommArg, StatusArg
from ._errors import raise_mpi_errors
from ._p2p import recv, send
from ._reductions import allreduce, reduce, reduce_scatter
from ._requests import Request, starting
from ._token import refuses_token
from ._trees import PyTree
from ._varcount import allgatherv, alltoallv, gatherv, scatterv

P = ParamSpec("P")


def _start(op: str, blocking: Callable, *args: Any, **kwargs: Any) -> Request:
    """`blocking(*args, **kwargs)` started: its request (see `_requests.py`)."""
    with starting(op) as holder:
        blocking(*args, **kwargs)
    if holder.request is None:
        raise NotImplementedError(f"jaxmpi.{op}: this call has no non-blocking form")
    return holder.request


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
    return _start("isend", send, x, dest, tag=tag, comm=comm)


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
    return _start("irecv", recv, x, source, tag=tag, comm=comm, status=status)


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
    XLA would choose (pair it with `wait(request, after=interior)`). The tie is an
    elementwise subtraction of a run-time zero, fused into the kernels that read the
    result: one subtraction per element read (a stencil's interior: up to 30% slower).
    Where nothing could move a transfer meanwhile (progress mode `at-start`: every rank on
    one host, every core computing) placing work gains nothing, and `value` comes back
    untouched.

    Args:
        first: Requests (of any started op), or a pytree of them; empty: `value` unchanged.
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
    values = [part.value for r in leaves for part in r._parts]
    if not values or _native.collectives_at_start():
        # Nothing started (empty pytrees); or nothing can move a transfer while the program
        # computes (progress mode "at-start": every core computes), so placing work
        # between a start and its wait gains nothing, and the tie would cost a subtraction
        # at every read of `value` (a stencil's interior: 30% slower).
        return value
    # A reduction makes the zero: XLA computes it once, in a kernel of its own, where an
    # elementwise sum of the request values would be recomputed at every element each
    # kernel reading the value reads (a stencil's interior: ~30% slower).
    zero = jnp.sum(jnp.concatenate(values) * 0)
    return jax.tree_util.tree_map(lambda x: _tied(x, zero), value)


@refuses_token
@raise_mpi_errors()
def wait(request: Request, *, after: PyTree = None) -> PyTree:
    """Completes `request`: returns what its op gives (what an `irecv` received, the sum
    an `iallreduce` made, ...), None for an `isend`.

    MPI_Wait (on each of a pytree's messages). Everything that reads the result runs after
    it; work that does not depend on it may run before, overlapping the transfer: `after`
    says which (the interior's result), so that XLA cannot move that work past the wait.

    Args:
        request: What a started op (`isend`, `irecv`, `iallreduce`, ...) returned, in this
            same function (jitted function, `cond` branch or loop body), not yet waited for.
        after: Arrays, or any pytree of them, that must be computed before the wait (they
            are not read). None (default): no such constraint.
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        What the started op gives, as its blocking op would: the array received (shaped
        like the `irecv` template; a pytree of its structure for a pytree template), a
        collective's result (at a rooted op's ranks that receive nothing, its input), or
        None for an `isend`.

    Derivative:
        The tangent's transfer is waited for next to the value's. Reverse mode of point to
        point starts the reverse transfer here (a send's wait starts receiving its
        cotangent), so the backward exchange overlaps the transposed interior; of a
        collective, the op's transpose is made where it started. `vmap`: inside the
        vmapped function; a batch of requests started outside it raises
        NotImplementedError.

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
    received = {
        id(part): prim.wait_for(
            part.op, part.value, part.results, part.through, part.params, follows
        )
        for part in request._parts
    }
    result = request._rebuild(lambda pending: received[id(pending.part)][pending.index])
    return None if request.sends else result


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


# --- Every other started op: its op, started, with a reference derived from its op's -------

_SECTIONS = ("Args", "Returns", "Derivative", "Raises", "Example")


def _sections(doc: str) -> tuple[list[str], dict[str, list[str]]]:
    """A Google-style docstring as (its text before the sections, {section: its lines})."""
    lines = inspect.cleandoc(doc).splitlines()
    head: list[str] = []
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.rstrip(":") in _SECTIONS and line.endswith(":"):
            current = line.rstrip(":")
            sections[current] = []
            if head and not head[-1]:
                head.pop()
        elif current is None:
            head.append(line)
        else:
            sections[current].append(line)
    return head, sections


def _entries(lines: list[str]) -> dict[str, str]:
    """A section's entries ("Name: text", continued on deeper lines), by name."""
    entries: dict[str, str] = {}
    for line in lines:
        name, _, text = line.strip().partition(": ")
        if line.startswith("    ") and not line.startswith("        ") and text:
            entries[name] = text
        elif entries and line.strip():
            last = next(reversed(entries))
            entries[last] += " " + line.strip()
    return entries


def _wrap(text: str, indent: str = "", hang: str = "") -> list[str]:
    """`text` in lines of the docstrings' width, the first indented by `indent`, the others
    by `indent` and `hang`."""
    return textwrap.wrap(text, 88, initial_indent=indent, subsequent_indent=indent + hang)


def _started_example(op: str, lines: list[str]) -> list[str]:
    """The op's example with each call of it started and waited for at once: it prints the
    same. A call with counts computed inside jit (`recv_capacity=`) stays blocking: its
    exchange has no non-blocking form."""
    text, call = "\n".join(lines), f"jaxmpi.{op}("
    out, at = [], 0
    while (found := text.find(call, at)) >= 0:
        depth, end = 0, found + len(call) - 1
        for end in range(found + len(call) - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        arguments = text[found + len(call) : end + 1]
        if "recv_capacity" in arguments:
            out.append(text[at : end + 1])
        else:
            out += [text[at:found], f"jaxmpi.wait(jaxmpi.i{op}(", arguments, ")"]
        at = end + 1
    return ("".join(out) + text[at:]).splitlines()


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _started_doc(op: str, doc: str) -> str:
    head, sections = _sections(doc)
    raises = _entries(sections["Raises"])
    never = (
        "or, when the program is lowered, the request is never waited for in the function "
        "(branch, loop body) that started it"
    )
    raises["ValueError"] = raises.get("ValueError", "").rstrip(".") + f"; {never}."
    raises["NotImplementedError"] = (
        f"GPU arrays (not supported yet: use `{op}`); counts computed inside jit "
        f"(`recv_capacity=`), whose exchange has no non-blocking form; "
        + raises.get("NotImplementedError", "a derivative the non-blocking form lacks (below).")
    )
    returns = " ".join(line.strip() for line in sections["Returns"])
    lines = [
        f"Starts `{op}`: returns a `Request` at once; `wait` gives what `{op}` returns.",
        "",
        *_wrap(
            f"MPI's non-blocking form of `{op}` ({head[0].rstrip('.')}): it moves its "
            "data while the program computes, until `wait` (or `waitall`). In every other "
            f"way it is `jaxmpi.{op}`: the same arguments, checks (their errors name "
            f"`{op}`), pytrees and result. Its buffers are not copied: XLA keeps them alive "
            "and untouched until the wait. Inside `jax.jit`, XLA may run independent work "
            "before the start or after the wait: `after` and `wait(after=...)` pin the work "
            "between them. Wait for the request exactly once, in the same function (branch, "
            "loop body) that started it; every rank starts its collectives on a "
            "communicator in the same order, as it would call them.",
            "",
        ),
        "",
        "Args:",
        *_trimmed(sections["Args"]),
        "",
        "Returns:",
        *_wrap(
            f"A `Request`, for `wait` or `waitall`, which give what `{op}` returns: {returns}",
            "    ",
        ),
        "",
        "Derivative:",
        *_wrap(
            f"Where `{op}` is linear (a SUM reduction, or moving data): the tangent travels "
            "as a second started transfer, waited for next to the value's. Reverse mode "
            f"makes `{op}`'s transpose where the start was. Other reductions raise "
            f"NotImplementedError (use `{op}`). `vmap`: as `{op}`, one MPI call for the "
            "whole batch.",
            "    ",
        ),
        "",
        "Raises:",
        *(
            line
            for kind, text in raises.items()
            for line in _wrap(f"{kind}: {text}", "    ", "    ")
        ),
        "",
        "Example:",
        *_started_example(op, _trimmed(sections["Example"])),
    ]
    return "\n".join(lines)


def started(blocking: Callable[P, Any]) -> Callable[P, Request]:
    """The started form of the public op `blocking`, named as the table names it."""
    op = blocking.__name__
    name = prim.SIGNATURES[op]["started"]

    @functools.wraps(blocking)
    def start(*args: P.args, **kwargs: P.kwargs) -> Request:
        return _start(name, blocking, *args, **kwargs)

    start.__name__ = start.__qualname__ = name
    start.__doc__ = _started_doc(op, blocking.__doc__ or "")
    signature = inspect.signature(blocking)
    start.__signature__ = signature.replace(return_annotation="Request")  # type: ignore[attr-defined]
    return start


iallreduce = started(allreduce)
ireduce = started(reduce)
ireduce_scatter = started(reduce_scatter)
ibcast = started(bcast)
igather = started(gather)
iallgather = started(allgather)
iscatter = started(scatter)
ialltoall = started(alltoall)
igatherv = started(gatherv)
iallgatherv = started(allgatherv)
iscatterv = started(scatterv)
ialltoallv = started(alltoallv)
