"""jaxmpi as an exact drop-in for mpi4jax 0.9: its names, its parameters (`token=`
included, refused with mpi4jax's own error), its version attribute."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jaxmpi
from helpers import RANK, SIZE
from jaxmpi import _native

# The drop-in API's signatures and conventions, whatever the MPI.
pytestmark = [pytest.mark.same_on_every_mpi, pytest.mark.same_at_every_size]

# mpi4jax 0.9.1's public functions and their parameters, as (name, kind) in order
# (`inspect.signature` of the installed package; the defaults are its own MPI's values).
P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
MPI4JAX_OPS = {
    "allgather": [("x", P), ("comm", K), ("token", K)],
    "allreduce": [("x", P), ("op", P), ("comm", K), ("token", K)],
    "alltoall": [("x", P), ("comm", K), ("token", K)],
    "barrier": [("comm", K), ("token", K)],
    "bcast": [("x", P), ("root", P), ("comm", K), ("token", K)],
    "gather": [("x", P), ("root", P), ("comm", K), ("token", K)],
    "recv": [("x", P), ("source", P), ("tag", K), ("comm", K), ("status", K), ("token", K)],
    "reduce": [("x", P), ("op", P), ("root", P), ("comm", K), ("token", K)],
    "scan": [("x", P), ("op", P), ("comm", K), ("token", K)],
    "scatter": [("x", P), ("root", P), ("comm", K), ("token", K)],
    "send": [("x", P), ("dest", P), ("tag", K), ("comm", K), ("token", K)],
    "sendrecv": [
        ("sendbuf", P), ("recvbuf", P), ("source", P), ("dest", P),
        ("sendtag", K), ("recvtag", K), ("comm", K), ("status", K), ("token", K),
    ],
}  # fmt: skip
MPI4JAX_OTHERS = ["has_cuda_support", "has_sycl_support"]

# mpi4jax 0.9's error for `token=` (mpi4jax/_src/utils.py, raise_if_token_is_set).
TOKEN_MESSAGE = (
    "Explicit token management is not supported for mpi4jax>=0.8.0. "
    "Tokens are now managed automatically and must not be passed "
    "as arguments to collective operations anymore.\n"
    "That is, please adjust your code like this:\n"
    "     # For mpi4jax<0.8.0:\n"
    "     result, token = mpi4jax.allgather(x, token=token)\n"
    "     # For mpi4jax>=0.8.0:\n"
    "     result = mpi4jax.allgather(x)"
)


def _valid_calls(request=None) -> dict:
    """Arguments every op would accept on this rank: the token must be the only fault.
    `request`: what `wait` is given (the `null_request` fixture)."""
    x, rows = jnp.ones(3, jnp.float32), jnp.ones((SIZE, 3), jnp.float32)
    counts = (1,) * SIZE
    one = jnp.ones((1, 3), jnp.float32)
    calls = {
        "allgather": (x,),
        "allgatherv": (one, counts),
        "allreduce": (x, jaxmpi.SUM),
        "alltoall": (rows,),
        "alltoallv": (rows, counts, counts),
        "barrier": (),
        "bcast": (x, 0),
        "exscan": (x, jaxmpi.SUM),
        "gather": (x, 0),
        "gatherv": (one, counts, 0),
        "irecv": (x, jaxmpi.PROC_NULL),
        "isend": (x, jaxmpi.PROC_NULL),
        "ragged_all_to_all": (rows, rows, *[jnp.zeros(SIZE, jnp.int32)] * 4),
        "recv": (x, RANK),
        "reduce": (x, jaxmpi.SUM, 0),
        "reduce_scatter": (rows, jaxmpi.SUM),
        "scan": (x, jaxmpi.SUM),
        "scatter": (rows if RANK == 0 else x, 0),
        "scatterv": (rows if RANK == 0 else one, counts, 0),
        "send": (x, RANK),
        "sendrecv": (x, x, RANK, RANK),
        "wait": (request,),
        "waitall": ([],),
    }
    # Every started op takes its op's arguments (the table says which ops have one).
    started = {s["started"]: s for s in _native.signatures().values() if s["started"]}
    for name, signature in _native.signatures().items():
        if signature["started"] and signature["started"] not in calls:
            calls[signature["started"]] = calls[name]
    assert set(started) <= set(calls)
    return calls


OPS = sorted(_valid_calls())


def test_every_public_op_is_covered():
    public = sorted(
        name
        for name in jaxmpi.__all__
        if callable(getattr(jaxmpi, name))
        and name[0].islower()
        and name not in {"raise_mpi_errors", "after", "profile", *MPI4JAX_OTHERS}
    )
    assert public == OPS
    assert len(OPS) == 35


@pytest.fixture(scope="module")
def null_request():
    """A request for `wait` to be called with: to PROC_NULL, so nothing travels."""
    request = jaxmpi.isend(jnp.ones(1), jaxmpi.PROC_NULL)
    yield request
    jaxmpi.wait(request)


def test_every_mpi4jax_name_exists():
    missing = [name for name in [*MPI4JAX_OPS, *MPI4JAX_OTHERS] if name not in jaxmpi.__all__]
    assert not missing


@pytest.mark.parametrize("name", sorted(MPI4JAX_OPS))
def test_parameters_are_mpi4jax_s(name):
    parameters = inspect.signature(getattr(jaxmpi, name)).parameters.values()
    assert [(p.name, p.kind) for p in parameters] == MPI4JAX_OPS[name]


@pytest.mark.parametrize("name", OPS)
def test_signature_shows_token_after_the_op_s_own_parameters(name):
    op = getattr(jaxmpi, name)
    shown = inspect.signature(op).parameters
    own = inspect.signature(inspect.unwrap(op)).parameters
    assert list(shown) == [*own, "token"]
    assert shown["token"].kind == inspect.Parameter.KEYWORD_ONLY
    assert "token" not in own


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("token", [None, object(), "a token"])
@pytest.mark.parametrize("name", OPS)
def test_token_is_refused_as_mpi4jax_refuses_it(name, token, mode, null_request):
    op, args = getattr(jaxmpi, name), _valid_calls(null_request)[name]

    def run():
        return op(*args, token=token)

    with pytest.raises(RuntimeError) as info:
        (jax.jit(run) if mode == "jit" else run)()
    assert type(info.value) is RuntimeError  # not an MPIError: nothing reached MPI
    assert str(info.value) == TOKEN_MESSAGE


def test_has_sycl_support_is_false():
    # jaxmpi has no SYCL (Intel GPU) handlers: only CPU and CUDA ones.
    assert jaxmpi.has_sycl_support() is False
    assert "has_sycl_support" in jaxmpi.__all__


def test_version_is_the_wheel_s_and_the_crate_s():
    installed = importlib.metadata.version("jaxmpi")
    cargo = Path(__file__).resolve().parents[2] / "Cargo.toml"
    # [workspace.package] version = "..." (the Python extension crate inherits it)
    crate = re.search(r'^version\s*=\s*"([^"]+)"', cargo.read_text(), re.MULTILINE)
    assert isinstance(jaxmpi.__version__, str)
    assert jaxmpi.__version__ == installed
    assert crate is not None and jaxmpi.__version__ == crate.group(1)
