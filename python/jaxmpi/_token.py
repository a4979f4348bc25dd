"""`token=`: accepted by every op, refused as mpi4jax 0.9 refuses it.

mpi4jax before 0.8 threaded an explicit token through every call (`y, token =
allreduce(x, op, token=token)`); since 0.8 the ordering is automatic and passing a token
raises a RuntimeError that says how to port the call. jaxmpi orders its calls the same
automatic way, so code written for old mpi4jax gets the same message from jaxmpi.
"""

from __future__ import annotations

import functools
import inspect


class _NotSet:
    """The default of `token=`: any value passed, None included, is refused. Its repr is
    what signatures show (`help()`, the API reference): `token=refused`, a Python name so
    that Sphinx can parse the signature."""

    def __repr__(self) -> str:
        return "refused"


NOTSET = _NotSet()

# mpi4jax 0.9's text (mpi4jax/_src/utils.py, raise_if_token_is_set), word for word, so
# a program that matches on it behaves the same.
_MESSAGE = (
    "Explicit token management is not supported for mpi4jax>=0.8.0. "
    "Tokens are now managed automatically and must not be passed "
    "as arguments to collective operations anymore.\n"
    "That is, please adjust your code like this:\n"
    "     # For mpi4jax<0.8.0:\n"
    "     result, token = mpi4jax.allgather(x, token=token)\n"
    "     # For mpi4jax>=0.8.0:\n"
    "     result = mpi4jax.allgather(x)"
)


def refuses_token(fn):
    """`fn` with a keyword-only `token=NOTSET` parameter that raises mpi4jax's
    RuntimeError when given; the signature shown by `inspect.signature` includes it."""

    @functools.wraps(fn)
    def op(*args, token=NOTSET, **kwargs):
        if token is not NOTSET:
            raise RuntimeError(_MESSAGE)
        return fn(*args, **kwargs)

    signature = inspect.signature(fn)
    parameters = list(signature.parameters.values())
    parameters.append(inspect.Parameter("token", inspect.Parameter.KEYWORD_ONLY, default=NOTSET))
    op.__signature__ = signature.replace(parameters=parameters)
    return op
