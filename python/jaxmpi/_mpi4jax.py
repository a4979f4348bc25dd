"""mpi4jax under its own name: the modules `import mpi4jax` gives when JAXMPI_AS_MPI4JAX=
<version> is set (the startup hook's finder, `_jaxmpi_startup.Mpi4jaxFinder`, asks `spec`
for them: files of their own, under _as_mpi4jax/, as a real package's), presenting that mpi4jax release's API over jaxmpi's ops: its `__version__`, its
names and submodules, and for releases before 0.8 its token API.

Before 0.8 every op took `token=` and returned `(result, token)` (`send` and `barrier`: the
token alone), the token ordering the calls. jaxmpi orders its calls itself, so a token is
only passed through: the one given (any token those releases took: `jax.lax.create_token()`,
an op's), or a new one where none was. Programs written for them (every NetKet release with
MPI, older Veros, many research codes) run on current JAX unchanged.

What each release has, read from its sdist on PyPI (table below). Releases before 0.3.0
had another API (`Allreduce`, `Send`, ... with other signatures) and are refused by name.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import inspect
import os
from typing import Any

import jax

import jaxmpi

from ._binding import jax_shim
from ._runtime import support

# mpi4jax's releases on PyPI from 0.3.0 on (its simple index, 2026-11-25), oldest first.
RELEASES = (
    "0.3.0 0.3.1 0.3.2 0.3.3 0.3.4 0.3.5 0.3.6 0.3.7 0.3.8 0.3.9 0.3.10 0.3.10.post1 "
    "0.3.10.post2 0.3.10.post3 0.3.10.post4 0.3.10.post5 0.3.10.post6 0.3.10.post7 0.3.11 "
    "0.3.11.post1 0.3.11.post2 0.3.11.post3 0.3.12 0.3.13 0.3.14 0.3.14.post1 0.3.14.post2 "
    "0.3.14.post3 0.3.14.post4 0.3.14.post5 0.3.14.post6 0.3.14.post7 0.3.14.post8 "
    "0.3.14.post9 0.3.15 0.3.15.post1 0.3.15.post2 0.4.0 0.4.0.post1 0.4.0.post2 "
    "0.4.0.post3 0.4.0.post4 0.4.0.post5 0.4.0.post6 0.4.1 0.4.1.post1 0.5.0 0.5.0.post1 "
    "0.5.1 0.5.1.post1 0.5.2 0.5.3 0.5.3.post1 0.5.3.post2 0.5.4 0.6.0 0.6.1 0.6.1.post1 "
    "0.6.1.post2 0.6.1.post3 0.7.0 0.7.0.post1 0.7.1 0.7.2 0.8.0 0.8.1 0.8.1.post1 "
    "0.8.1.post2 0.9.0 0.9.0.post1 0.9.1 0.9.1.post1 0.9.1.post2"
).split()
# The releases before those, whose API jaxmpi does not present.
EARLIER = (
    "0.1 0.2.0 0.2.1 0.2.2 0.2.3 0.2.4 0.2.5 0.2.6 0.2.7 0.2.8 0.2.9 0.2.10 0.2.11 0.2.12 "
    "0.2.13 0.2.14 0.2.15 0.2.16 0.2.17 0.2.18"
).split()

OPS = (
    "allgather", "allreduce", "alltoall", "barrier", "bcast", "gather", "recv", "reduce",
    "scan", "scatter", "send", "sendrecv",
)  # fmt: skip
# Ops whose token-API result was the token alone.
TOKEN_ONLY = ("send", "barrier")

# The parts of the API that came and went: (first release with it, first without it).
HAS_CUDA_SUPPORT = ("0.3.4", None)
HAS_SYCL_SUPPORT = ("0.4.1", None)
TOKENS = ("0.3.0", "0.8.0")  # token= on every op, (result, token) results
AUTO_TOKENIZE = ("0.3.7", "0.4.0")  # mpi4jax.experimental(.tokenizer).auto_tokenize
EXPERIMENTAL_NOTOKEN = ("0.4.0", "0.7.0")  # mpi4jax.experimental.notoken: 0.8's API
NOTOKEN = ("0.7.0", "0.8.0")  # mpi4jax.notoken: the same, moved


def _has(version: str, span: tuple[str, str | None]) -> bool:
    since, until = span
    at = support.release(version)
    return support.release(since) <= at and (until is None or at < support.release(until))


def checked(value: str) -> str:
    """The release JAXMPI_AS_MPI4JAX names; ImportError for anything else."""
    version = value.strip()
    if version in RELEASES:
        return version
    what = f"JAXMPI_AS_MPI4JAX={value!r}"
    span = f"{RELEASES[0]} to {RELEASES[-1]}"
    if version in EARLIER:
        raise ImportError(
            f"{what}: jaxmpi presents the API of mpi4jax {span}; {version}'s (Allreduce, "
            "Send, ...) is older. Port the program to 0.3's names, or unset the variable"
        )
    try:
        support.release(version)
    except ValueError:
        raise ImportError(
            f"{what} is not a version: set it to the mpi4jax release the program was "
            f"written for ({span}, e.g. 0.7.2), or unset it"
        ) from None
    close = [r for r in RELEASES if r.startswith(version.rsplit(".", 1)[0] + ".")]
    raise ImportError(
        f"{what}: mpi4jax {version} was never released (releases {span}"
        + (f"; near it: {', '.join(close[-6:])}" if close else "")
        + ")"
    )


def auto_tokenize(func):
    """mpi4jax 0.3.7-0.3.15's experimental.auto_tokenize: threads tokens through the ops in
    `func`. jaxmpi's ops keep program order without tokens, so `func` is returned as it is."""
    return func


def _with_tokens(name: str, op):
    """`op` (jaxmpi's) as mpi4jax before 0.8 had it: `token=` taken and passed through,
    `(result, token)` returned (`send`, `barrier`: the token)."""

    @functools.wraps(op)
    def with_tokens(*args: Any, token: Any = None, **kwargs: Any):
        if token is not None and not jax_shim.is_token(token):
            raise TypeError(
                f"mpi4jax.{name}: token must be a JAX token (jax.lax.create_token() or one "
                f"an op returned) or None, not {type(token).__name__}"
            )
        result = op(*args, **kwargs)
        token = jax.lax.create_token() if token is None else token
        return token if name in TOKEN_ONLY else (result, token)

    signature = inspect.signature(op)
    parameters = [p for p in signature.parameters.values() if p.name != "token"]
    parameters.append(inspect.Parameter("token", inspect.Parameter.KEYWORD_ONLY, default=None))
    returns = inspect.Signature.empty  # a tuple, or a token: not the op's
    with_tokens.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=returns
    )
    return with_tokens


def contents(version: str) -> dict[str, dict[str, Any]]:
    """Every module of mpi4jax `version`, by name, with the names it has."""
    ops = {name: getattr(jaxmpi, name) for name in OPS}
    top: dict[str, Any] = {"__version__": version}
    if _has(version, TOKENS):
        top.update({name: _with_tokens(name, op) for name, op in ops.items()})
    else:
        top.update(ops)
    if _has(version, HAS_CUDA_SUPPORT):
        top["has_cuda_support"] = jaxmpi.has_cuda_support
    if _has(version, HAS_SYCL_SUPPORT):
        top["has_sycl_support"] = jaxmpi.has_sycl_support
    top["__all__"] = [name for name in top if not name.startswith("_")]
    modules = {"mpi4jax": top}
    if _has(version, AUTO_TOKENIZE):
        tokenize = {"auto_tokenize": auto_tokenize, "__all__": ["auto_tokenize"]}
        modules["mpi4jax.experimental"] = tokenize
        modules["mpi4jax.experimental.tokenizer"] = tokenize
    if _has(version, EXPERIMENTAL_NOTOKEN):
        modules["mpi4jax.experimental"] = {}
        modules["mpi4jax.experimental.notoken"] = {**ops, "__all__": list(OPS)}
    if _has(version, NOTOKEN):
        modules["mpi4jax.notoken"] = {**ops, "__all__": list(OPS)}
    return modules


# The files `import mpi4jax` runs: one per module some release had, a package's as
# NAME/__init__.py and a module's as NAME.py, where that release had them.
FILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_as_mpi4jax")


def spec(name: str, value: str) -> importlib.machinery.ModuleSpec:
    """How `import name` (mpi4jax or one of its submodules) finds it as release `value`
    had it: a spec of the file under FILES, whose code asks `fill` for the names."""
    version = checked(value)
    if name not in contents(version):
        raise ModuleNotFoundError(
            f"No module named {name!r}: mpi4jax {version} has none (JAXMPI_AS_MPI4JAX={value})",
            name=name,
        )
    path = os.path.join(FILES, *name.split("."))
    if os.path.isdir(path):
        found = importlib.util.spec_from_file_location(
            name, os.path.join(path, "__init__.py"), submodule_search_locations=[path]
        )
    else:
        found = importlib.util.spec_from_file_location(name, path + ".py")
    assert found is not None, f"{path}: a module of `contents` without its file"
    return found


def fill(namespace: dict[str, Any]) -> None:
    """Gives the module whose globals are `namespace` (one of FILES, run by `import`) the
    names it has in the release JAXMPI_AS_MPI4JAX names."""
    name = namespace["__name__"]
    if name != "mpi4jax" and not name.startswith("mpi4jax."):
        raise ImportError(
            f"{name}: {namespace.get('__file__')} is a module of mpi4jax as jaxmpi presents "
            "it, not one to import by this name: set JAXMPI_AS_MPI4JAX and import mpi4jax"
        )
    namespace.update(contents(checked(os.environ.get("JAXMPI_AS_MPI4JAX", "")))[name])


def presented() -> str | None:
    """What `python -m jaxmpi info` says of the mpi4jax name."""
    value = os.environ.get("JAXMPI_AS_MPI4JAX", "").strip()
    if not value:
        return None
    try:
        version = checked(value)
    except ImportError as err:
        return f"JAXMPI_AS_MPI4JAX={value}: refused at `import mpi4jax`: {err}"
    api = "its token API" if _has(version, TOKENS) else "0.8's token-free API"
    return f"`import mpi4jax` gives jaxmpi as mpi4jax {version} ({api}; JAXMPI_AS_MPI4JAX)"
