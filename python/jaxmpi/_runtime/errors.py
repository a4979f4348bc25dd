"""`jaxmpi.MPIError`: the exception for an MPI call that failed, with what failed as
attributes.

Every error a jaxmpi handler reports reaches Python inside XLA's `JaxRuntimeError`, whose
text jaxmpi writes in one format (core/src/error.rs):

    jaxmpi.<op> failed: rank <r>: <MPI's text> (MPI error class <c>) [comm <h>, source 0, ...]

with the step inside the op in parentheses after it where the op's own MPI call was not
what failed (`jaxmpi.allreduce (error handler check) failed: ...`), and without `failed`
and the class for failures MPI did not report (`jaxmpi.bcast: rank 0: root 5 is out of
range ...`). Failures outside any op name what jaxmpi was doing instead of an op
(`jaxmpi.select MPI: ...`).

`MPIError` subclasses `JaxRuntimeError` (so code that catches that keeps working) and
`RuntimeError`. jaxmpi raises it itself from every call it executes: eager ops,
communicator methods, initialization. Inside a user's own `jax.jit` function JAX raises
its own exception, with XLA's status code in front of jaxmpi's text (`INTERNAL: jaxmpi...`):
a `JaxRuntimeError` on the first call, but a `ValueError` when JAX 0.10 re-runs a compiled
function through its C++ fast path. `jaxmpi.raise_mpi_errors` (decorator or context
manager, `jaxmpi/_errors.py`) or `MPIError.from_exception` turn either into an `MPIError`.

It lives in the process runtime, below everything that calls MPI: the extension raises it
from the first call on (`_native.init`, which `library.py` makes).

Under fast dispatch a failed call without a result (a send, say) may leave nothing for the
user to read its error from; the core keeps it and jaxmpi raises it later
(core/src/xla/handlers/services/pending.rs has the rule). Creating an `MPIError` for it,
here or by conversion, tells the core it was reported, so it is not raised a second time.
"""

from __future__ import annotations

import re

from jax.errors import JaxRuntimeError

from .. import _native

# A handler's failure as XLA passes it on: its status code, then jaxmpi's message.
_FROM_XLA = re.compile(r"\b[A-Z][A-Z_]*: (?=jaxmpi\.)")

_MESSAGE = re.compile(
    r"jaxmpi\.(?P<op>\w+(?: \w+)*?)(?: \((?P<step>[^()]*)\))?(?: failed)?: "
    r"(?:rank (?P<rank>-?\d+): )?(?P<text>.*?)"
    r"(?: \(MPI error class (?P<error_class>-?\d+)\))?(?: \[(?P<call>[^\[\]]*)\])?\s*$",
    re.DOTALL,
)


def _call_fields(call: str) -> dict[str, int | str]:
    """'comm 0x44000000, source 0, tag 9, 16 bytes' as {'comm': 0x44000000, 'source': 0,
    'tag': 9, 'bytes': 16}; ANY_SOURCE, ANY_TAG and PROC_NULL stay names."""
    fields: dict[str, int | str] = {}
    for item in call.split(", "):
        first, _, second = item.partition(" ")
        key, value = ("bytes", first) if second == "bytes" else (first, second)
        try:
            fields[key] = int(value, 0)
        except ValueError:
            fields[key] = value
    return fields


def _number(call: dict[str, int | str], key: str) -> int | None:
    value = call.get(key)
    return value if isinstance(value, int) else None


def raise_kept_failure() -> None:
    """Raises the failure the core kept since an op nobody could read (fast dispatch).
    Called only once the caller's own MPI work is done: a rank raising before its part of
    a collective would leave the other ranks waiting
    (core/src/xla/handlers/services/pending.rs)."""
    message = _native.take_failure()
    if message is not None:
        raise MPIError(message)


def _forget_kept_failure(message: str) -> None:
    """The user now holds this failure: the core need not raise it again later (see
    core/src/xla/handlers/services/pending.rs)."""
    _native.discard_failure(message)


class MPIError(JaxRuntimeError):
    """An MPI call made by jaxmpi failed; the attributes say which and where.

    Raised by every call jaxmpi executes itself: eager ops, `Comm` methods,
    initialization. Inside your own `jax.jit` function JAX raises its own exception
    instead; `raise_mpi_errors` or `MPIError.from_exception` give this one. A subclass of
    `jax.errors.JaxRuntimeError` and `RuntimeError`, so existing `except` clauses keep
    working. The job goes on: jaxmpi's communicators return errors instead of aborting,
    and the library stays usable.

    Attributes:
        op: The jaxmpi op that failed (`"recv"`), or None.
        step: What failed inside it: the MPI function (`"MPI_Recv"`), or a check
            (`"short message"`, `"JAXMPI_CHECK"`); outside any op, what jaxmpi was doing
            (`"select MPI"`).
        rank: The rank in MPI_COMM_WORLD of the process that saw the failure.
        peer: The source or destination of a point-to-point call.
        root: The root of a rooted collective.
        tag: The tag of a point-to-point call.
        comm: The communicator's handle, an int.
        nbytes: The bytes of the call's first buffer.
        error_class: The MPI library's error class, an int.
        error_string: The library's text (or jaxmpi's, for its own checks).
        call: Every field of the call's description, a dict (`{"comm": ..., "source": 0,
            "tag": 9, "bytes": 16}`).

    Attributes that do not apply are None (`error_string` is always a str).

    Example:
        .. mpirun::

            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()
            try:
                if rank == 0:
                    jaxmpi.send(jnp.ones(2), dest=1, tag=22)
                else:
                    jaxmpi.recv(jnp.zeros(4), source=0, tag=22)  # 2 arrive, not 4
            except jaxmpi.MPIError as err:
                print(err.op, err.step, err.rank, err.peer, err.tag)

        .. output::

            recv short message 1 0 22
    """

    def __init__(self, message: str):
        super().__init__(message)
        match = _MESSAGE.search(message)
        groups = match.groupdict() if match else {}
        call = _call_fields(groups["call"]) if groups.get("call") else {}
        self.op: str | None = groups.get("op")
        self.step: str | None = groups.get("step")
        if self.op is not None and " " in self.op:
            # Not an op: a step outside any op ("select MPI").
            self.op, self.step = None, self.op
        self.rank: int | None = int(groups["rank"]) if groups.get("rank") else None
        self.error_class: int | None = (
            int(groups["error_class"]) if groups.get("error_class") else None
        )
        self.error_string: str = (groups.get("text") or message).strip()
        self.call: dict = call
        self.comm = _number(call, "comm")
        self.root = call.get("root")
        self.tag = call.get("tag", call.get("recvtag"))
        self.peer = call.get("source", call.get("dest"))
        self.nbytes = _number(call, "bytes")
        _forget_kept_failure(message)

    @classmethod
    def from_exception(cls, exc: BaseException) -> MPIError | None:
        """The `MPIError` that an exception raised by a jaxmpi call stands for.

        For what your own jitted function raised (JAX's `JaxRuntimeError`, or its
        `ValueError` from a re-run): the text jaxmpi wrote is in it, and becomes an
        `MPIError` with its attributes. `raise_mpi_errors` does this for a block of code.

        Args:
            exc: Any exception.

        Returns:
            `exc` itself if it is an `MPIError`; the `MPIError` it stands for if it
            carries a jaxmpi failure; else None (jaxmpi's own argument checks included:
            they are no MPI failure).

        Example:
            .. mpirun::

                import jax
                import jax.numpy as jnp
                import jaxmpi

                rank = jaxmpi.COMM_WORLD.Get_rank()
                other = 1 - rank
                # Sends 3 elements where the other rank takes 1.
                swap = jax.jit(lambda x: jaxmpi.sendrecv(x, x[:1], other, other, sendtag=23))
                try:
                    swap(jnp.ones(3))
                except Exception as err:
                    print(type(err).__name__, jaxmpi.MPIError.from_exception(err).op)
                print(jaxmpi.MPIError.from_exception(KeyError("x")))

            .. output::

                JaxRuntimeError sendrecv
                None
                JaxRuntimeError sendrecv
                None
        """
        if isinstance(exc, MPIError):
            return exc
        message = str(exc)
        if isinstance(exc, JaxRuntimeError):
            start = message.find("jaxmpi.")
        else:
            # Other types (JAX's ValueError) only with XLA's status code in front: a
            # ValueError of jaxmpi's own argument checks is no MPI failure.
            xla = _FROM_XLA.search(message)
            start = xla.end() if xla else -1
        if start < 0 or not _MESSAGE.search(message[start:]):
            return None
        return cls(message[start:])


# Users write `jaxmpi.MPIError`, which is what tracebacks and pickles name too: the module
# holding it is private and may move.
MPIError.__module__ = "jaxmpi"
