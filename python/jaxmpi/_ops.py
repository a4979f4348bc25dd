"""The MPI ops as JAX primitives.

Each op is declared once with `_define`: its shape rule, which operand its result may
alias (so MPI can work in place, without a copy), and which operands it never reads
(receive templates). Lowering, attributes, ordering and eager execution are the same
generic path for all of them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import _jax_shim, _native
from ._comm import (
    PEER_NULL,
    check_rank,
    encode_dest,
    encode_source,
    encode_tag,
    resolve_comm,
    resolve_op,
    status_address,
)
from ._errors import raise_mpi_errors
from ._jax_shim import ShapedArray
from ._token import refuses_token

SUPPORTED_DTYPES: list[str] = _native.dtypes()
# Every op's operands, results and attributes as the handlers declare them
# (core/src/handlers/mod.rs): the attributes a lowering passes are derived from these.
SIGNATURES: dict = _native.signatures()


def _address(value: int) -> np.int64:
    """Handles and addresses travel as their two's-complement bit pattern: MLIR cannot
    hold an unsigned 64-bit attribute above 2^63, and MPICH user handles as mpi4py gives
    them are that large."""
    return np.int64(value - (1 << 64) if value >= 1 << 63 else value)


def _counts(value) -> np.ndarray:
    return np.asarray(value, np.int64)


# How each kind of attribute is encoded: the handler reads an int64, or an int64 array.
_ENCODERS = {
    "comm": _address,
    "address": _address,
    "reduce_op": np.int64,
    "peer": np.int64,
    "int": np.int64,
    "any_tag": np.int64,
    "counts": _counts,
}


def _checked(name: str, shape_params: frozenset, shapes):
    """`shapes`, the abstract evaluation, run only on operands and parameters that match
    the op's declaration: a mismatch is a bug in jaxmpi, said at trace time with the op and
    parameter, instead of an attribute the handler misses at run time."""
    signature = SIGNATURES[name]
    declared = {attr for attr, _ in signature["attrs"]}
    operands = signature["operands"]

    def check(*avals, **params):
        if len(avals) != len(operands):
            raise TypeError(
                f"jaxmpi.{name}: bound with {len(avals)} operands, but the op is declared "
                f"with {len(operands)} ({', '.join(operands) or 'none'})"
            )
        unknown = sorted(params.keys() - declared - shape_params)
        if unknown:
            raise TypeError(
                f"jaxmpi.{name}: parameter {unknown[0]!r} is neither an attribute the op is "
                f"declared with ({', '.join(sorted(declared))}) nor a shape parameter"
            )
        missing = sorted(declared - params.keys())
        if missing:
            raise TypeError(f"jaxmpi.{name}: attribute {missing[0]!r} was not bound")
        return shapes(*avals, **params)

    return check


def _none(**_):
    return {}


def _define(name: str, shapes, aliases=_none, unread=_none, shape_params=()):
    """A primitive `jaxmpi_<name>` lowered to the FFI handler of the same name, passing the
    attributes its declaration lists. `shapes(*avals, **params)` is its shape rule;
    `shape_params` name the parameters only Python's rules use (they never reach the
    handler). `aliases(**params)` maps an operand to the result it may alias;
    `unread(**params)` names the operands the op never reads (receive templates: only
    their shape matters). Those stay operands for JAX (its AD and batching rules see them)
    but are left out of the XLA call: XLA then never computes them, never keeps them alive
    for the call, and places the fresh result wherever is cheapest (in a loop, straight
    into the carry)."""
    target = f"jaxmpi_{name}"
    primitive = _jax_shim.new_primitive(target, _checked(name, frozenset(shape_params), shapes))
    encoders = [(attr, _ENCODERS[kind]) for attr, kind in SIGNATURES[name]["attrs"]]

    def lowering(ctx, *operands, identity=False, **params):
        if identity:  # a transposed allreduce-SUM: no communication (see _rules.py)
            _jax_shim.pass_tokens_through(ctx)
            return operands
        attrs = {attr: encode(params[attr]) for attr, encode in encoders}
        skipped = unread(**params)
        kept = [i for i in range(len(operands)) if i not in skipped]
        position = {operand: k for k, operand in enumerate(kept)}
        aliased = {position[operand]: out for operand, out in aliases(**params).items()}
        return _jax_shim.lower_ordered_ffi_call(ctx, target, operands, kept, attrs, aliased)

    _jax_shim.register_lowering(primitive, lowering, platform="cpu")
    _jax_shim.register_lowering(primitive, lowering, platform="cuda")
    return primitive


# Whether this rank is the root: what the rooted ops' shape rules and aliasing depend on.
_AT_ROOT = ("at_root",)


def _same(x, **_):
    return ShapedArray(x.shape, x.dtype)


def _like(x, **_):
    return [_same(x)]


def _in_place(**_):
    return {0: 0}


def _at_root_only(shape):
    """Reduce and gather bind no result away from the root (bcast: at the root), where the
    Python function returns the input itself. Aliasing a result to the input instead would
    make XLA copy the input whenever the program still uses it afterwards."""
    return lambda x, *, at_root, **params: [shape(x, **params)] if at_root else []


def _in_place_at_root(*, at_root, **_):
    return {0: 0} if at_root else {}


def _template_away_from_root(*, at_root, **_):
    return {} if at_root else {0}


def _receives(source) -> bool:
    """A receive from PROC_NULL writes nothing: its template is the result, in place."""
    return source != PEER_NULL


def _recv_aliases(*, source, **_):
    return {} if _receives(source) else {0: 0}


def _recv_unread(*, source, **_):
    return {0} if _receives(source) else set()


def _sendrecv_aliases(*, source, replace, **_):
    """`replace`: the send buffer is also the template (`a = sendrecv(a, a)`); the result
    replaces it in place (MPI_Sendrecv_replace), so a loop carrying `a` copies nothing."""
    if replace:
        return {0: 0}
    return {} if _receives(source) else {1: 0}


def _sendrecv_unread(*, source, replace, **_):
    return {1} if replace or _receives(source) else set()


_allreduce_p = _define("allreduce", _like, _in_place, shape_params=("identity",))
_reduce_p = _define("reduce", _at_root_only(_same), _in_place_at_root, shape_params=_AT_ROOT)
_scan_p = _define("scan", _like, _in_place)
_exscan_p = _define("exscan", _like, _in_place)
_bcast_p = _define(
    "bcast",
    lambda x, *, at_root, **_: [] if at_root else _like(x),
    unread=_template_away_from_root,
    shape_params=_AT_ROOT,
)
_gather_p = _define(
    "gather",
    _at_root_only(lambda x, *, size, **_: ShapedArray((size, *x.shape), x.dtype)),
    shape_params=("size", "at_root"),
)
_allgather_p = _define(
    "allgather",
    lambda x, *, size, **_: [ShapedArray((size, *x.shape), x.dtype)],
    shape_params=("size",),
)
# Away from the root the operand is a receive template, as recv's: never read, so not
# passed to XLA at all.
_scatter_p = _define(
    "scatter",
    lambda x, *, at_root, **_: [ShapedArray(x.shape[1:] if at_root else x.shape, x.dtype)],
    unread=_template_away_from_root,
    shape_params=_AT_ROOT,
)
_alltoall_p = _define("alltoall", _like)
_reduce_scatter_p = _define("reduce_scatter", lambda x, **_: [ShapedArray(x.shape[1:], x.dtype)])
_send_p = _define("send", lambda x, **_: [])
_recv_p = _define("recv", _like, _recv_aliases, unread=_recv_unread)
_sendrecv_p = _define(
    "sendrecv",
    lambda sendbuf, recvbuf, **_: _like(recvbuf),
    _sendrecv_aliases,
    unread=_sendrecv_unread,
    shape_params=("replace",),
)
_barrier_p = _define("barrier", lambda **_: [])


def _array(x, op: str):
    """Any array-like as a JAX array of a dtype jaxmpi can move."""
    try:
        x = jnp.asarray(x)
    except TypeError:
        raise TypeError(
            f"jaxmpi.{op}: expected an array or a scalar, got {type(x).__name__}"
        ) from None
    if x.dtype.name not in SUPPORTED_DTYPES:
        raise TypeError(
            f"jaxmpi.{op}: dtype {x.dtype.name} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}"
        )
    return x


def _leading_axis_is_size(x, size: int, op: str, name: str) -> None:
    if x.ndim == 0 or x.shape[0] != size:
        raise ValueError(
            f"jaxmpi.{op}: {name} input must have shape (nproc, ...) = ({size}, ...) for "
            f"a communicator of {size} ranks, got shape {x.shape}"
        )


def _reduction(primitive, name: str, x, op, comm, root=None, **params):
    """The shared front of the elementwise reductions: checks, then one bind."""
    x = _array(x, name)
    c = resolve_comm(comm, name)
    if root is not None:
        params["root"] = check_rank(root, c.size, "root", name)
        params["at_root"] = c.rank == params["root"]
    code, user_op = resolve_op(op, x.dtype, name)
    outs = primitive.bind(x, comm=c.handle, op=code, user_op=user_op, **params)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def allreduce(x, op, *, comm=None):
    """Reduces `x` over all ranks with `op`; every rank gets the result."""
    return _reduction(_allreduce_p, "allreduce", x, op, comm, identity=False)


@refuses_token
@raise_mpi_errors()
def reduce(x, op, root, *, comm=None):
    """Reduces `x` over all ranks to `root`; other ranks get `x` back unchanged."""
    return _reduction(_reduce_p, "reduce", x, op, comm, root=root)


@refuses_token
@raise_mpi_errors()
def scan(x, op, *, comm=None):
    """Inclusive prefix reduction: rank r gets `op` over ranks 0..r."""
    return _reduction(_scan_p, "scan", x, op, comm)


@refuses_token
@raise_mpi_errors()
def exscan(x, op, *, comm=None):
    """Exclusive prefix reduction: rank r gets `op` over ranks 0..r-1; rank 0 gets zeros."""
    return _reduction(_exscan_p, "exscan", x, op, comm)


@refuses_token
@raise_mpi_errors()
def reduce_scatter(x, op, *, comm=None):
    """`x` has shape `(size, ...)`; rank r gets the reduction over all ranks of slice r."""
    x = _array(x, "reduce_scatter")
    c = resolve_comm(comm, "reduce_scatter")
    _leading_axis_is_size(x, c.size, "reduce_scatter", "Reduce_scatter")
    code, user_op = resolve_op(op, x.dtype, "reduce_scatter")
    (y,) = _reduce_scatter_p.bind(x, comm=c.handle, op=code, user_op=user_op)
    return y


@refuses_token
@raise_mpi_errors()
def bcast(x, root, *, comm=None):
    """Sends `x` from `root` to all ranks; others pass an array of the same shape and
    dtype (its values are ignored)."""
    x = _array(x, "bcast")
    c = resolve_comm(comm, "bcast")
    root = check_rank(root, c.size, "root", "bcast")
    outs = _bcast_p.bind(x, comm=c.handle, root=root, at_root=c.rank == root)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def gather(x, root, *, comm=None):
    """`root` gets every rank's `x` stacked, shape `(size, *x.shape)`; others get `x`."""
    x = _array(x, "gather")
    c = resolve_comm(comm, "gather")
    root = check_rank(root, c.size, "root", "gather")
    outs = _gather_p.bind(x, comm=c.handle, root=root, size=c.size, at_root=c.rank == root)
    return outs[0] if outs else x


@refuses_token
@raise_mpi_errors()
def allgather(x, *, comm=None):
    """Every rank gets every rank's `x` stacked, shape `(size, *x.shape)`."""
    x = _array(x, "allgather")
    c = resolve_comm(comm, "allgather")
    (y,) = _allgather_p.bind(x, comm=c.handle, size=c.size)
    return y


@refuses_token
@raise_mpi_errors()
def scatter(x, root, *, comm=None):
    """`root` holds `x` of shape `(size, ...)` and sends slice i to rank i; other ranks
    pass an array shaped like one slice (values ignored)."""
    x = _array(x, "scatter")
    c = resolve_comm(comm, "scatter")
    root = check_rank(root, c.size, "root", "scatter")
    if c.rank == root:
        _leading_axis_is_size(x, c.size, "scatter", "Scatter")
    (y,) = _scatter_p.bind(x, comm=c.handle, root=root, at_root=c.rank == root)
    return y


@refuses_token
@raise_mpi_errors()
def alltoall(x, *, comm=None):
    """`x` has shape `(size, ...)`; rank r sends slice i to rank i and receives slice r of
    every rank, in rank order."""
    x = _array(x, "alltoall")
    c = resolve_comm(comm, "alltoall")
    _leading_axis_is_size(x, c.size, "alltoall", "Alltoall")
    (y,) = _alltoall_p.bind(x, comm=c.handle)
    return y


@refuses_token
@raise_mpi_errors()
def send(x, dest, *, tag=0, comm=None):
    """Sends `x` to rank `dest`."""
    x = _array(x, "send")
    c = resolve_comm(comm, "send")
    dest = encode_dest(dest, c.size, "send")
    return _send_p.bind(x, comm=c.handle, dest=dest, tag=encode_tag(tag, "send", allow_any=False))


@refuses_token
@raise_mpi_errors()
def recv(x, source=None, *, tag=None, comm=None, status=None):
    """Receives an array shaped like `x` (a template; its values are ignored) from
    `source` (default: any) with `tag` (default: any); fills `status` if given."""
    from ._comm import ANY_SOURCE, ANY_TAG

    x = _array(x, "recv")
    c = resolve_comm(comm, "recv")
    source = encode_source(ANY_SOURCE if source is None else source, c.size, "recv")
    tag = encode_tag(ANY_TAG if tag is None else tag, "recv", allow_any=True)
    (y,) = _recv_p.bind(
        x, comm=c.handle, source=source, tag=tag, status=status_address(status, "recv")
    )
    return y


@refuses_token
@raise_mpi_errors()
def sendrecv(sendbuf, recvbuf, source, dest, *, sendtag=0, recvtag=None, comm=None, status=None):
    """Sends `sendbuf` to `dest` while receiving an array shaped like `recvbuf` (a
    template; its values are ignored) from `source`, deadlock-free. The same array as both
    (`a = sendrecv(a, a, ...)`) is exchanged in place."""
    from ._comm import ANY_TAG

    replace = sendbuf is recvbuf
    sendbuf, recvbuf = _array(sendbuf, "sendrecv"), _array(recvbuf, "sendrecv")
    c = resolve_comm(comm, "sendrecv")
    (y,) = _sendrecv_p.bind(
        sendbuf,
        recvbuf,
        replace=replace,
        comm=c.handle,
        source=encode_source(source, c.size, "sendrecv"),
        dest=encode_dest(dest, c.size, "sendrecv"),
        sendtag=encode_tag(sendtag, "sendrecv", allow_any=False),
        recvtag=encode_tag(ANY_TAG if recvtag is None else recvtag, "sendrecv", allow_any=True),
        status=status_address(status, "sendrecv"),
    )
    return y


@refuses_token
@raise_mpi_errors()
def barrier(*, comm=None):
    """Waits until every rank of `comm` has reached the barrier."""
    c = resolve_comm(comm, "barrier")
    return _barrier_p.bind(comm=c.handle)
