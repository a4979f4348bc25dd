"""The checks every op makes of the arguments users pass, at trace time: arrays and the
dtypes jaxmpi moves, ranks, peers and tags known at trace time, an mpi4py Status; each
turned into the value the handlers read, or a clear error naming the op."""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from . import _native
from ._comm import ANY_SOURCE, ANY_TAG, PROC_NULL
from ._runtime.encodings import PEER_ANY, PEER_NULL, TAG_ANY
from ._runtime.library import loaded_mpi4py

SUPPORTED_DTYPES: list[str] = _native.dtypes()


def array_arg(x: ArrayLike, op: str, leaf: str = "") -> jax.Array:
    """Any array-like as a JAX array of a dtype jaxmpi can move. `leaf`: which leaf of a
    pytree it is, named in errors."""
    where = f"{leaf}: " if leaf else ""
    try:
        # A JAX array (or tracer) is one already: asarray would cost ~10 us per eager call.
        x = x if isinstance(x, jax.Array) else jnp.asarray(x)
    except TypeError:
        raise TypeError(
            f"jaxmpi.{op}: {where}expected an array or a scalar, got {type(x).__name__}"
        ) from None
    if x.dtype.name not in SUPPORTED_DTYPES:
        raise TypeError(
            f"jaxmpi.{op}: {where}dtype {x.dtype.name} is not supported; use one of "
            f"{', '.join(SUPPORTED_DTYPES)}"
        )
    return x


def leading_axis_is_size(x: jax.Array, size: int, op: str, name: str, leaf: str = "") -> None:
    if x.ndim == 0 or x.shape[0] != size:
        what = f"{leaf} of the " if leaf else ""
        raise ValueError(
            f"jaxmpi.{op}: {what}{name} input must have shape (nproc, ...) = ({size}, ...) "
            f"for a communicator of {size} ranks, got shape {x.shape}"
        )


def static_int(value: Any, what: str, op: str) -> int:
    """`value` as a Python int known at trace time, or a clear error: ranks and tags decide
    which MPI call is compiled, so they cannot be traced values."""
    if isinstance(value, bool) or (not isinstance(value, int) and not hasattr(value, "__index__")):
        raise TypeError(f"jaxmpi.{op}: {what} must be an int, got {type(value).__name__}")
    try:
        return operator.index(value)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
        raise TypeError(
            f"jaxmpi.{op}: {what} must be known at trace time (a Python int), but it is a "
            f"traced value inside jit; pass it as a static argument (static_argnums) or "
            f"compute it outside the jitted function"
        ) from None


def check_rank(value: Any, size: int, what: str, op: str) -> int:
    value = static_int(value, what, op)
    if not 0 <= value < size:
        raise ValueError(
            f"jaxmpi.{op}: {what} {value} is out of range for a communicator of {size} ranks"
        )
    return value


def encode_source(source: Any, size: int, op: str) -> int:
    source = static_int(source, "source", op)
    if source == ANY_SOURCE:
        return PEER_ANY
    if source == PROC_NULL:
        return PEER_NULL
    return check_rank(source, size, "source", op)


def encode_dest(dest: Any, size: int, op: str) -> int:
    dest = static_int(dest, "dest", op)
    if dest == PROC_NULL:
        return PEER_NULL
    if dest == ANY_SOURCE:
        raise ValueError(f"jaxmpi.{op}: ANY_SOURCE is not a valid destination")
    return check_rank(dest, size, "dest", op)


def per_rank(value: Any, rank: int | None, size: int, encode: Any) -> Any:
    """A peer (`encode`d) that may be given per rank: a function of the rank, or a list
    with one entry per rank. On an MPI communicator (`rank` known) it is this rank's; on
    a MeshComm (`rank` None: one trace serves every device) a tuple of every rank's, of
    which each device's call reads its own."""
    if callable(value):
        if rank is not None:
            return encode(value(rank))
        return tuple(encode(value(r)) for r in range(size))
    if isinstance(value, (list, tuple)):
        if len(value) != size:
            raise ValueError(
                f"a peer given per rank needs one entry per rank ({size}), got {len(value)}"
            )
        return encode(value[rank]) if rank is not None else tuple(encode(v) for v in value)
    return encode(value)


def encode_tag(tag: Any, op: str, allow_any: bool) -> int:
    """Tags are C ints; MPI refuses those above MPI_TAG_UB (at least 32767) at run time."""
    if isinstance(tag, jax.Array):  # a jnp scalar works if concrete; a tracer says why not
        tag = static_int(tag, "tag", op)
    if allow_any and tag == ANY_TAG:
        return TAG_ANY
    if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag < 2**31:
        raise ValueError(f"jaxmpi.{op}: tag must be an int in [0, 2**31), got {tag!r}")
    return tag


def status_address(status: Any, op: str) -> int:
    """Where the handler writes the MPI_Status of a receive: inside an mpi4py Status."""
    if status is None:
        return 0
    mpi = loaded_mpi4py()
    if mpi is None or not isinstance(status, mpi.Status):
        raise TypeError(
            f"jaxmpi.{op}: status must be an mpi4py.MPI.Status, got {type(status).__name__}"
        )
    return mpi._addressof(status)
