"""Point-to-point transfers users call: send, recv, sendrecv; and the argument checks the
non-blocking isend and irecv share with them (`send_args`, `recv_args`). Each binds its
primitive (declared in `_binding/primitives.py`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._args import (
    encode_dest,
    encode_source,
    encode_tag,
    per_rank,
    status_address,
)
from ._binding import primitives as prim
from ._comm import ANY_SOURCE, ANY_TAG, CommArg, CommInfo, StatusArg, resolve_comm
from ._errors import raise_mpi_errors
from ._requests import apply
from ._runtime.encodings import PEER_ANY, PEER_NULL
from ._token import refuses_token
from ._trees import PyTree, Tree, each_group, pack, unpack


def send_args(x: PyTree, dest: int, tag: int, comm: CommArg, op: str) -> tuple:
    """A send's arguments checked and encoded: (tree, communicator, dest, tag)."""
    tree = Tree(x, op)
    c = resolve_comm(comm, op)
    dest = per_rank(dest, c.rank, c.size, lambda d: encode_dest(d, c.size, op))
    return tree, c, dest, encode_tag(tag, op, allow_any=False)


def _one_message(tree: Tree, source: int, status: Any, op: str, what: str = "x") -> None:
    """A pytree's messages (one per group of leaves) come from one sender, in order; a
    status describes one message."""
    if status is not None and not tree.bare:
        raise ValueError(
            f"jaxmpi.{op}: status= describes one message, but {what} is a pytree, which "
            "travels as one message per dtype: receive single arrays to read their status"
        )
    if source == PEER_ANY and len(tree.groups(0)) > 1:
        raise ValueError(
            f"jaxmpi.{op}: {what} is a pytree of several dtypes, which travels as one message "
            "per dtype: from ANY_SOURCE they could match messages of different senders. "
            "Receive it from a named source, or one dtype at a time"
        )


def _on_mesh_comm(c: CommInfo, source: Any, status: Any, op: str) -> None:
    """What a receive on a MeshComm cannot do yet: report an mpi4py Status (its fields
    would be MPI's, of processes), or match ANY_SOURCE (messages are matched by their
    sending device)."""
    if c.rank is not None:
        return
    if status is not None:
        raise ValueError(
            f"jaxmpi.{op}: status= on a MeshComm is not built: its ranks are devices, "
            "which an MPI_Status cannot name. Leave status out"
        )
    if source == PEER_ANY or (isinstance(source, tuple) and PEER_ANY in source):
        raise ValueError(
            f"jaxmpi.{op}: ANY_SOURCE on a MeshComm is not built: name the source rank "
            "(per rank: a function of the rank, or a list)"
        )


def recv_args(
    x: PyTree, source: int | None, tag: int | None, comm: CommArg, status: Any, op: str
) -> tuple:
    """A receive's arguments checked and encoded: (template tree, communicator, source,
    tag, status address); no source or tag means any."""
    tree = Tree(x, op)
    c = resolve_comm(comm, op)
    source = per_rank(
        ANY_SOURCE if source is None else source,
        c.rank,
        c.size,
        lambda s: encode_source(s, c.size, op),
    )
    tag = encode_tag(ANY_TAG if tag is None else tag, op, allow_any=True)
    address = status_address(status, op)
    _one_message(tree, source, status, op)
    _on_mesh_comm(c, source, status, op)
    return tree, c, source, tag, address


@refuses_token
@raise_mpi_errors()
def send(x: PyTree, dest: int, *, tag: int = 0, comm: CommArg = None) -> list:
    """Sends `x` to rank `dest`.

    MPI_Send: returns once `x` may be reused (MPI may or may not have delivered it). The
    matching `recv` (or `sendrecv`) on `dest` names this rank, or any, and this tag, or any.
    Two ranks that both send first may deadlock: exchange with `sendrecv`.

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
        An empty list (mpi4jax's result).

    Derivative:
        Linear: the tangent follows as a second message to `dest`. Reverse mode receives the
        cotangent back from `dest` (whose `recv` transposes into a send). `vmap`: one message
        for the whole batch.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; a rank is not a static int.
        ValueError: A rank outside `comm` (or `ANY_SOURCE` as `dest`); a tag that is not an
            int in `[0, 2**31)`; `comm` is freed, `COMM_NULL` or an intercommunicator; or
            the op is in a program over several devices outside `shard_map`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time (a receive that does not fit the message fails
            on the receiving rank). Inside your own jitted function JAX raises its own error
            instead; `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            if rank == 0:
                jaxmpi.send(jnp.arange(3.0), dest=1, tag=7)
            else:
                print(jaxmpi.recv(jnp.zeros(3), source=0, tag=7))

        .. output::

            [0. 1. 2.]
    """
    tree, c, dest, tag = send_args(x, dest, tag, comm, "send")

    def call(x: jax.Array, fingerprint: int) -> None:
        apply(prim.send, x, comm=c.handle, dest=dest, tag=tag, tree=fingerprint)

    each_group(tree, 0, call)
    return []


@refuses_token
@raise_mpi_errors()
def recv(
    x: PyTree,
    source: int | None = None,
    *,
    tag: int | None = None,
    comm: CommArg = None,
    status: StatusArg = None,
) -> PyTree:
    """Receives an array shaped like `x` from rank `source`.

    MPI_Recv: waits for a message from `source` with `tag` on `comm`. `x` is a template:
    only its shape and dtype matter, its values are never read, and the message lands in a
    fresh buffer without a copy.

    Args:
        x: Template of the message: its shape and dtype. Or a pytree of templates.
        source: The sending rank, `ANY_SOURCE` (None, the default, means it too), or
            `PROC_NULL` (nothing arrives: the result is `x`). A static int.
        tag: The tag to match; None (default) or `ANY_TAG` match any.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        status: An mpi4py `MPI.Status` to fill in: the source, tag and element count. With
            it, a message shorter than `x` is accepted (the rest of the result is zeros).
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The array received, shaped like `x`. For a pytree, the same structure, each leaf's
        result in its place.

    Derivative:
        Linear, for a named `source` (`ANY_SOURCE` raises NotImplementedError): the
        sender's tangent follows as a second message. JAX differentiates the receive only if
        `x` depends on the differentiated values: pass the array the result replaces (a
        halo, say), not a constant, or the sender's tangent finds no receive. Reverse mode
        sends the cotangent back to `source`. `vmap`: one message for the whole batch.

    Raises:
        TypeError: `x` (or a leaf of it) is not an array of a supported dtype, or `comm` no
            communicator; a rank is not a static int; `status` is no `MPI.Status`.
        ValueError: A rank outside `comm`; a tag that is not an int in `[0, 2**31)`; `comm`
            is freed, `COMM_NULL` or an intercommunicator; the op is in a program over
            several devices outside `shard_map`; `status` with a pytree `x`; or a pytree of
            several dtypes from `ANY_SOURCE` (its messages could come from different
            senders).
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time: a message longer than the receive buffer, or
            (without `status`) shorter; with `JAXMPI_CHECK=1`, a message whose dtype or
            shape differs. Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi
            from mpi4py import MPI

            rank = jaxmpi.COMM_WORLD.Get_rank()
            if rank == 1:
                jaxmpi.send(jnp.ones(2), dest=0, tag=5)
            else:
                status = MPI.Status()
                y = jaxmpi.recv(jnp.zeros(4), status=status)  # any source, any tag
                print(y, status.Get_source(), status.Get_tag(), status.Get_count(MPI.FLOAT))

        .. output::

            [1. 1. 0. 0.] 1 5 2
    """
    tree, c, source, tag, address = recv_args(x, source, tag, comm, status, "recv")

    def call(x: jax.Array, fingerprint: int) -> jax.Array:
        (y,) = apply(
            prim.recv, x, comm=c.handle, source=source, tag=tag, status=address, tree=fingerprint
        )
        return y

    return each_group(tree, 0, call)


@refuses_token
@raise_mpi_errors()
def sendrecv(
    sendbuf: PyTree,
    recvbuf: PyTree,
    source: int,
    dest: int,
    *,
    sendtag: int = 0,
    recvtag: int | None = None,
    comm: CommArg = None,
    status: StatusArg = None,
) -> PyTree:
    """Sends `sendbuf` to `dest` while receiving an array shaped like `recvbuf` from `source`.

    MPI_Sendrecv: the send and the receive proceed together, so ranks that all exchange
    at once (a ring, a halo exchange) cannot deadlock. `recvbuf` is a template: its values
    are never read. The same array as both (`a = sendrecv(a, a, ...)`) is exchanged in
    place, through one buffer (MPI_Sendrecv_replace).

    Args:
        sendbuf: The array to send, any shape and supported dtype. Or a pytree of them.
        recvbuf: Template of what arrives: its shape and dtype. Or a pytree of templates
            (its structure may differ from `sendbuf`'s).
        source: The sending rank, `ANY_SOURCE` or `PROC_NULL` (nothing arrives: the result
            is `recvbuf`). A static int.
        dest: The receiving rank, or `PROC_NULL` (nothing is sent). A static int.
        sendtag: The tag of the message sent, in `[0, 2**31)` (default 0).
        recvtag: The tag to match; None (default) or `ANY_TAG` match any.
        comm: A `jaxmpi.Comm` or mpi4py intracommunicator. None (default): a clone of
            the world communicator, made at import.
        status: An mpi4py `MPI.Status` to fill in, as for `recv` (a shorter message is
            then accepted).
        token: Refused with a RuntimeError, as mpi4jax >= 0.8 refuses it: calls are
            ordered automatically.

    Returns:
        The array received from `source`, shaped like `recvbuf`. For a pytree, the same
        structure, each leaf's result in its place.

    Derivative:
        Linear, for a named `source` (`ANY_SOURCE` raises NotImplementedError): the
        tangents are exchanged right after the values. Reverse mode runs the swapped
        exchange: the cotangent of the result goes back to `source`, that of `sendbuf` comes
        from `dest`. `vmap`: one message for the whole batch.

    Raises:
        TypeError: `sendbuf` or `recvbuf` is not an array of a supported dtype, or `comm` no
            communicator; a rank is not a static int; `status` is no `MPI.Status`.
        ValueError: A rank outside `comm` (or `ANY_SOURCE` as `dest`); a tag that is not an
            int in `[0, 2**31)`; `comm` is freed, `COMM_NULL` or an intercommunicator; the
            op is in a program over several devices outside `shard_map`; `status` with a
            pytree `recvbuf`; or a pytree `recvbuf` of several dtypes from `ANY_SOURCE`.
        RuntimeError: `token` was passed.
        MPIError: MPI failed at run time: a message longer than the receive buffer, or
            (without `status`) shorter; with `JAXMPI_CHECK=1`, a message whose dtype or
            shape differs. Inside your own jitted function JAX raises its own error instead;
            `raise_mpi_errors` turns it into this one.

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            other = 1 - rank
            a = jnp.full(2, float(rank))
            a = jaxmpi.sendrecv(a, a, source=other, dest=other)  # swapped in place
            print(rank, a)

        .. output::

            0 [1. 1.]
            1 [0. 0.]
    """
    replace = sendbuf is recvbuf
    sent, received = Tree(sendbuf, "sendrecv", "sendbuf"), Tree(recvbuf, "sendrecv", "recvbuf")
    c = resolve_comm(comm, "sendrecv")
    params = {
        "comm": c.handle,
        "source": per_rank(source, c.rank, c.size, lambda s: encode_source(s, c.size, "sendrecv")),
        "dest": per_rank(dest, c.rank, c.size, lambda d: encode_dest(d, c.size, "sendrecv")),
        "sendtag": encode_tag(sendtag, "sendrecv", allow_any=False),
        "recvtag": encode_tag(ANY_TAG if recvtag is None else recvtag, "sendrecv", allow_any=True),
        "status": status_address(status, "sendrecv"),
    }
    _one_message(received, params["source"], status, "sendrecv", "recvbuf")
    _on_mesh_comm(c, params["source"], status, "sendrecv")
    return _exchange(sent, received, replace, params)


def _exchange(sent: Tree, received: Tree, replace: bool, params: dict) -> PyTree:
    """sendrecv of two pytrees: one sendrecv per group, the k-th group sent with the k-th
    received; where one tree has more groups than the other, the other side of those
    calls is PROC_NULL (its partner, receiving what this rank sends, makes the same
    calls). `replace`: the two are the same tree, exchanged in place group by group."""
    sends, receives = sent.groups(0), received.groups(0)
    fingerprints = {"tree": sent.fingerprint(0), "recv_tree": received.fingerprint(0)}
    out = list(received.leaves)
    for k in range(max(len(sends), len(receives))):
        s = [sent.leaves[i] for i in sends[k]] if k < len(sends) else []
        r = [received.leaves[i] for i in receives[k]] if k < len(receives) else []
        x = pack(s, 0) if s else jnp.zeros(0, r[0].dtype)
        t = x if replace else pack(r, 0) if r else jnp.zeros(0, x.dtype)
        ends = {
            "dest": params["dest"] if s else PEER_NULL,
            "source": params["source"] if r else PEER_NULL,
        }
        (y,) = prim.sendrecv.bind(x, t, **{**params, **ends, **fingerprints}, replace=replace)
        for i, piece in zip(receives[k] if r else [], unpack(y, r, 0)):
            out[i] = piece
    return received.rebuild(out)
