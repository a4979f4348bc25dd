"""Every op as a JAX primitive, declared once: the Python twin of the Rust table
(`declare_ops!` in core/src/xla/handlers/mod.rs).

Each row gives an op's shape rule, which operand its result may alias (so MPI works in
place, without a copy), which operands it never reads (receive templates) and the
parameters only Python's rules use. Lowering, attributes, ordering and eager execution are
one generic path (`define`) for all of them; `PRIMITIVES` holds them by op name, for the
rules table in `rules/` and for the tests. Importing the module registers the handlers the
lowerings call with XLA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from .. import _native
from .._runtime import profile
from .._runtime.encodings import PEER_NULL
from .._runtime.gpu import cuda
from . import jax_shim, placement
from .jax_shim import Primitive, ShapedArray

# Every op's operands, results and attributes as the handlers declare them: the attributes
# a lowering passes are derived from these.
SIGNATURES: dict = _native.signatures()
PRIMITIVES: dict[str, Primitive] = {}
# Each op's started form (`iallreduce` for `allreduce`), by the op's name: declared in the
# Rust table (`started iname`), derived below from the op's own row.
STARTED: dict[str, Primitive] = {}

# The handlers, one FFI target per op and platform; CUDA's only where jaxlib has CUDA
# (asking for them installs the extension's CUDA runtime), and only of the ops that run on
# GPU buffers (those whose declaration gives no `host_only` reason).
for _platform in ("cpu", "CUDA") if cuda["plugin"] else ("cpu",):
    for _target, _capsule in _native.handlers(_platform):
        jax_shim.register_ffi_target(_target, _capsule, platform=_platform)


def gpu_choice_ignored(option: str | None, started: bool, gpus: list[int]) -> str | None:
    """Why this rank's GPU choice did not take, or None: JAX's GPU client reads
    jax_cuda_visible_devices (`option`, as jaxmpi set it) once, when it starts; one that
    had `started` before `import jaxmpi` kept the GPUs it opened (`gpus`, their ordinals)."""
    if option is None or not started or gpus in ([], [int(option)]):
        return None
    return (
        f"jaxmpi chose GPU {option} for this rank ({cuda['chosen']}), but JAX's GPU client "
        f"had already started, on GPUs {gpus}, so JAX ignores the choice (every rank of "
        "the node would allocate on the same GPUs). Import jaxmpi before anything that "
        "starts JAX's backend (jax.devices(), the first array), or choose yourself: "
        "jax.config.update('jax_cuda_visible_devices', '<this rank's GPU>') before that, "
        "or JAXMPI_GPU=jax to let JAX use every GPU it sees."
    )


def _started_gpus() -> list[int]:
    try:
        return sorted(d.local_hardware_id for d in jax.local_devices(backend="cuda"))
    except RuntimeError:  # JAX runs no CUDA client (it fell back to the CPU)
        return []


if cuda["jax_option"] is not None and jax_shim.backends_started():
    _ignored = gpu_choice_ignored(cuda["jax_option"], True, _started_gpus())
    if _ignored:
        raise RuntimeError(_ignored)


def _comm_id(handle: int) -> np.int64:
    """A program carries a communicator as a small id, the same in every run (its handle
    differs between runs and ranks: see core/src/xla/frame/handles.rs); a MeshComm's
    handle is its id already (negative: core/src/xla/mesh/mesh_comms.rs)."""
    return np.int64(handle if placement.is_mesh_comm(handle) else _native.handle_id("comm", handle))


def _peer(value) -> np.int64 | np.ndarray:
    """A peer, or on a MeshComm one per rank (each device's call reads its own)."""
    return np.asarray(value, np.int64) if isinstance(value, tuple) else np.int64(value)


def _address_id(value: int) -> np.int64:
    """Likewise for a Status's address or a user op's handle (0, none, stays 0)."""
    return np.int64(_native.handle_id("address", value))


def _counts(value) -> np.ndarray:
    return np.asarray(value, np.int64)


# How each kind of attribute is encoded: the handler reads an int64, or an int64 array.
_ENCODERS = {
    "comm": _comm_id,
    "address": _address_id,
    "reduce_op": np.int64,
    "peer": _peer,
    "int": np.int64,
    "any_tag": np.int64,
    "counts": _counts,
    "tree": np.int64,
}

# Attributes a bind may leave out, by kind, and the value they then take: a pytree's
# fingerprint is 0 (a single array) in the calls the rules make on cotangents and batches,
# which every rank makes alike.
_DEFAULTS = {"tree": 0}


def _checked(name: str, shape_params: frozenset, shapes):
    """`shapes`, the abstract evaluation, run only on operands and parameters that match
    the op's declaration: a mismatch is a bug in jaxmpi, said at trace time with the op and
    parameter, instead of an attribute the handler misses at run time."""
    signature = SIGNATURES[name]
    declared = {attr for attr, _ in signature["attrs"]}
    optional = {attr for attr, kind in signature["attrs"] if kind in _DEFAULTS}
    operands = signature["operands"]

    # An operand declared as `after` stands for any number of them (never read).
    variadic = bool(operands) and operands[-1] == "after"
    fixed = len(operands) - variadic

    def check(*avals, **params):
        if len(avals) != len(operands) and not (variadic and len(avals) >= fixed):
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
        missing = sorted(declared - optional - params.keys())
        if missing:
            raise TypeError(f"jaxmpi.{name}: attribute {missing[0]!r} was not bound")
        return shapes(*avals, **params)

    return check


def _none(**_):
    return {}


def _host_only(name: str, why: str):
    def refuse(ctx, *operands, **params):
        raise NotImplementedError(f"jaxmpi.{name}: {why}")

    return refuse


class Definition(NamedTuple):
    """An op's row of the table below: what its started form is derived from."""

    shapes: Callable
    aliases: Callable
    unread: Callable
    shape_params: tuple


DEFINITIONS: dict[str, Definition] = {}


def define(name: str, shapes, aliases=_none, unread=_none, shape_params=()) -> Primitive:
    """A primitive `jaxmpi_<name>` lowered to the FFI handler of the same name, passing the
    attributes its declaration lists. `shapes(*avals, **params)` is its shape rule;
    `shape_params` name the parameters only Python's rules use (they never reach the
    handler). `aliases(**params)` maps an operand to the result it may alias;
    `unread(**params)` names the operands the op never reads (receive templates: only
    their shape matters). Those stay operands for JAX (its AD and batching rules see them)
    but are left out of the XLA call: XLA then never computes them, never keeps them alive
    for the call, and places the fresh result wherever is cheapest (in a loop, straight
    into the carry). For GPU arrays it lowers to the op's CUDA handler; an op that has
    none refuses, saying its declaration's `host_only` reason (it reads operands on the
    CPU, or is not built for GPU memory)."""
    target = f"jaxmpi_{name}"
    primitive = jax_shim.new_primitive(target, _checked(name, frozenset(shape_params), shapes))
    encoders = [
        (attr, _ENCODERS[kind], _DEFAULTS.get(kind)) for attr, kind in SIGNATURES[name]["attrs"]
    ]

    def lowering(ctx, *operands, **params):
        placement.check_sharded(name, params.get("comm"), *jax_shim.program_devices(ctx))
        # An attribute at its default is left out: the handler reads the same default, and
        # XLA copies one attribute fewer into every call (a single array's call is then
        # the one it was before pytrees).
        attrs = {}
        for attr, encode, default in encoders:
            value = params.get(attr, default)
            if default is None or value != default:
                attrs[attr] = encode(value)
        # While a profile records, each call says where the program named it (a handler
        # reads no attribute it was not declared with but this one, and only then).
        if profile.recording():
            attrs["site"] = jax_shim.call_site(ctx)
        skipped = unread(**params)
        kept = [i for i in range(len(operands)) if i not in skipped]
        position = {operand: k for k, operand in enumerate(kept)}
        aliased = {position[operand]: out for operand, out in aliases(**params).items()}
        return jax_shim.lower_ordered_ffi_call(ctx, target, operands, kept, attrs, aliased)

    jax_shim.register_lowering(primitive, lowering, platform="cpu")
    host_only = SIGNATURES[name]["host_only"]
    cuda = _host_only(name, host_only) if host_only else lowering
    jax_shim.register_lowering(primitive, cuda, platform="cuda")
    PRIMITIVES[name] = primitive
    DEFINITIONS[name] = Definition(shapes, aliases, unread, tuple(shape_params))
    return primitive


# --- Shape and aliasing rules the table shares ------------------------------------------

# Whether this rank is the root: what the rooted ops' shape rules and aliasing depend on.
# None on a MeshComm, where one trace serves every device: each binds the root's result
# (and reads its operand), the body deciding at run time (core: xla/mesh/on_devices.rs).
_AT_ROOT = ("at_root",)


def _same(x, **_):
    return ShapedArray(x.shape, x.dtype)


def _like(x, **_):
    return [_same(x)]


def _rows_like(x, rows: int):
    return ShapedArray((rows, *x.shape[1:]), x.dtype)


def _in_place(**_):
    return {0: 0}


def _at_root_only(shape):
    """Reduce and gather bind no result away from the root (bcast: at the root), where the
    Python function returns the input itself. Aliasing a result to the input instead would
    make XLA copy the input whenever the program still uses it afterwards."""
    return lambda x, *, at_root, **params: [] if at_root is False else [shape(x, **params)]


def _in_place_at_root(*, at_root, **_):
    return {} if at_root is False else {0: 0}


def _template_away_from_root(*, at_root, **_):
    return {0} if at_root is False else {}


def _in_place_everywhere(*, at_root, **_):
    """bcast on a MeshComm: every device's result starts as its operand, the root's
    message."""
    return {0: 0} if at_root is None else {}


def _receives(source) -> bool:
    """A receive from PROC_NULL writes nothing: its template is the result, in place (on
    a MeshComm, where any rank's source is PROC_NULL)."""
    if isinstance(source, tuple):
        return PEER_NULL not in source
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


# --- The table ------------------------------------------------------------------------------

allreduce = define("allreduce", _like, _in_place)
reduce = define("reduce", _at_root_only(_same), _in_place_at_root, shape_params=_AT_ROOT)
scan = define("scan", _like, _in_place)
exscan = define("exscan", _like, _in_place)
reduce_scatter = define("reduce_scatter", lambda x, **_: [ShapedArray(x.shape[1:], x.dtype)])
bcast = define(
    "bcast",
    lambda x, *, at_root, **_: [] if at_root else _like(x),
    _in_place_everywhere,
    unread=_template_away_from_root,
    shape_params=_AT_ROOT,
)
gather = define(
    "gather",
    _at_root_only(lambda x, *, size, **_: ShapedArray((size, *x.shape), x.dtype)),
    shape_params=("size", "at_root"),
)
allgather = define(
    "allgather",
    lambda x, *, size, **_: [ShapedArray((size, *x.shape), x.dtype)],
    shape_params=("size",),
)
# Away from the root the operand is a receive template, as recv's: never read, so not
# passed to XLA at all.
scatter = define(
    "scatter",
    lambda x, *, at_root, **_: [ShapedArray(x.shape if at_root is False else x.shape[1:], x.dtype)],
    unread=_template_away_from_root,
    shape_params=_AT_ROOT,
)
alltoall = define("alltoall", _like)
# Counts are rows of the leading axis; like gather and scatter, no result away from
# gatherv's root, and scatterv's operand there is a template, never read.
gatherv = define(
    "gatherv",
    _at_root_only(lambda x, *, counts, **_: _rows_like(x, sum(counts))),
    shape_params=_AT_ROOT,
)
allgatherv = define("allgatherv", lambda x, *, counts, **_: [_rows_like(x, sum(counts))])
scatterv = define(
    "scatterv",
    lambda x, *, counts, rank, at_root, **_: [_rows_like(x, counts[rank]) if at_root else x],
    unread=_template_away_from_root,
    shape_params=("rank", "at_root"),
)
alltoallv = define("alltoallv", lambda x, *, recv_counts, **_: [_rows_like(x, sum(recv_counts))])
send = define("send", lambda x, **_: [])
recv = define("recv", _like, _recv_aliases, unread=_recv_unread)
sendrecv = define(
    "sendrecv",
    lambda sendbuf, recvbuf, **_: _like(recvbuf),
    _sendrecv_aliases,
    unread=_sendrecv_unread,
    shape_params=("replace",),
)
barrier = define("barrier", lambda **_: [])
# MPI_Alltoallv with its row counts and offsets computed inside jit: operands (x, output,
# send offsets, send counts, receive offsets, receive counts). The result starts as
# `output`, in place: rows nobody sends to keep its values.
ragged_alltoallv = define(
    "ragged_alltoallv",
    lambda x, output, *counts, **_: _like(output),
    lambda **_: {1: 0},
)

# --- Started forms -------------------------------------------------------------------------
# An op's started form (`jaxmpi/_requests.py` binds them, `requests.py` runs a wait outside
# jit) takes the op's operands and parameters and one more, `results`: how many results
# the op has on this rank. Its results: the request value (8 bytes, its key in the core's
# table), the op's results, which MPI fills until the wait, and the operands MPI reads
# until then (the op's operands that are neither templates nor aliased to a result),
# passed through, aliased: no copy, and private to the wait, which XLA then keeps them
# alive for. The request is float32 so that derivatives can carry the tangent's and the
# cotangent's own requests from one rule to the next (see rules/nonblocking.py); its bits
# are never computed on.
REQUEST = ShapedArray((2,), np.float32)


def passed_through(op: str, /, **params) -> list[int]:
    """The operands of `op`'s started form that its call passes through to the wait."""
    row = DEFINITIONS[op]
    skipped, aliased = row.unread(**params), row.aliases(**params)
    count = len(SIGNATURES[op]["operands"])
    return [i for i in range(count) if i not in skipped and i not in aliased]


def _define_started(op: str) -> Primitive:
    row = DEFINITIONS[op]

    def shapes(*avals, results, **params):
        outs = row.shapes(*avals, **params)
        return [REQUEST, *outs, *(avals[i] for i in passed_through(op, **params))]

    def aliases(*, results, **params):
        own = {operand: 1 + out for operand, out in row.aliases(**params).items()}
        through = passed_through(op, **params)
        return {**own, **{operand: 1 + results + k for k, operand in enumerate(through)}}

    def unread(*, results, **params):
        return row.unread(**params)

    name = SIGNATURES[op]["started"]
    return define(name, shapes, aliases, unread, row.shape_params)


def start(op: str, /, *operands, **params) -> tuple[Any, list, list]:
    """Starts `op` (binds its started form): (the request value, the op's results, the
    operands passed through). None of them may be read but by the request's `wait`."""
    avals = [jax.typeof(x) for x in operands]
    results = len(DEFINITIONS[op].shapes(*avals, **params))
    value, *outs = STARTED[op].bind(*operands, results=results, **params)
    return value, outs[:results], outs[results:]


for _op, _signature in SIGNATURES.items():
    if _signature["started"]:
        STARTED[_op] = _define_started(_op)


def op_params(params: dict) -> dict:
    """A started op's parameters less its own (`results`): its op's."""
    return {k: v for k, v in params.items() if k != "results"}


def wait_for(op: str, value, results: list, through: list, params: dict, after=()) -> list:
    """Binds the wait of a started `op` (its request value and outputs, its parameters),
    to follow `after`: the op's results."""
    params = op_params(params)
    return wait.bind(
        value,
        *results,
        *through,
        *after,
        results=len(results),
        buffers=len(results) + len(through),
        op=op,
        op_params=tuple(sorted(params.items())),
        comm=params["comm"],
    )


# The wait of any started op: the request value, then `buffers` arrays (what the start
# returned after it: the op's `results` first, then what it passed through), then any
# number it must follow, never read. It returns the op's results, aliased: readable once
# MPI is done with them. `op` and `op_params` (the start's, as sorted items) are for the
# rules: the handler knows its request.
wait = define(
    "wait",
    lambda request, *operands, results, **_: [
        ShapedArray(a.shape, a.dtype) for a in operands[:results]
    ],
    lambda *, results, **_: {1 + i: i for i in range(results)},
    shape_params=("results", "buffers", "op", "op_params"),
)

# The transpose of allreduce-SUM under mpi4jax's convention: the identity on each rank,
# no communication. A primitive of its own (not the identity function) so that its own
# transpose can be allreduce-SUM again (see rules/reductions.py).
allreduce_transposed = jax_shim.new_identity_primitive("jaxmpi_allreduce_transposed")
PRIMITIVES["allreduce_transposed"] = allreduce_transposed


def _name_call_sites(on: bool) -> None:
    """While a profile records, every jaxmpi equation is lowered where it stands, so that
    its lowering sees the program's name stack (its call site)."""
    jax_shim.lower_each_call(PRIMITIVES.values(), on)


profile.on_change.append(_name_call_sites)
if profile.recording():  # JAXMPI_PROFILE started before this module was imported
    _name_call_sites(True)
