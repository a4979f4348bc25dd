"""`import mpi4jax` finding jaxmpi (JAXMPI_AS_MPI4JAX=<version>): the version and names a
program sees, the token API of the releases before 0.8 in a program written for it (tokens
threaded through every op, inside jit, fori_loop and grad, in rank-asymmetric order), the
variable's refusals, and a process without it (no mpi4jax module appears).

In this process the finder is installed by `presenting` (what the startup hook does at
start when the variable is set); processes started here show the hook itself at work.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.resources
import importlib.util
import inspect
import os
import sys
import tarfile
from pathlib import Path

import _jaxmpi_startup
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_startup import rank_0_only, run_alone

from helpers import MPI, RANK, SIZE, assert_array, needs_mpi4py, partner_or_skip
from jaxmpi import _mpi4jax

# Modules and names made in Python, whatever the MPI.
pytestmark = [pytest.mark.same_on_every_mpi, pytest.mark.same_at_every_size]


@pytest.fixture
def presenting(monkeypatch):
    """`presenting("0.7.2")`: `import mpi4jax` gives that release from then on, in this
    test; the finder and the modules made are gone afterwards."""

    def present(version: str):
        monkeypatch.setenv("JAXMPI_AS_MPI4JAX", version)
        _jaxmpi_startup.present_mpi4jax()
        import mpi4jax

        return mpi4jax

    yield present
    if _jaxmpi_startup.Mpi4jaxFinder in sys.meta_path:
        sys.meta_path.remove(_jaxmpi_startup.Mpi4jaxFinder)
    for name in [n for n in sys.modules if n == "mpi4jax" or n.startswith("mpi4jax.")]:
        del sys.modules[name]


OPS = sorted(_mpi4jax.OPS)


@pytest.mark.parametrize(
    ("version", "names", "modules"),
    [
        ("0.3.0", OPS, []),
        ("0.3.4", [*OPS, "has_cuda_support"], []),
        ("0.3.15.post2", [*OPS, "has_cuda_support"], ["experimental", "experimental.tokenizer"]),
        ("0.4.0", [*OPS, "has_cuda_support"], ["experimental", "experimental.notoken"]),
        ("0.6.1", [*OPS, "has_cuda_support", "has_sycl_support"], ["experimental.notoken"]),
        ("0.7.2", [*OPS, "has_cuda_support", "has_sycl_support"], ["notoken"]),
        ("0.9.1", [*OPS, "has_cuda_support", "has_sycl_support"], []),
    ],
)
def test_a_release_has_its_version_names_and_submodules(presenting, version, names, modules):
    import importlib

    mpi4jax = presenting(version)
    assert mpi4jax.__version__ == version
    assert sorted(mpi4jax.__all__) == sorted(names)
    assert sorted(n for n in vars(mpi4jax) if not n.startswith("_")) == sorted(names)
    for module in modules:
        importlib.import_module(f"mpi4jax.{module}")
    for absent in {"notoken", "experimental.notoken", "experimental.tokenizer"} - set(modules):
        with pytest.raises(ModuleNotFoundError, match=f"mpi4jax {version} has none"):
            importlib.import_module(f"mpi4jax.{absent}")


# mpi4jax's own sdists (ci/setup.sh fetches them from PyPI), a release for each layout
# presented: the package alone, notoken beside it, experimental.notoken, experimental.tokenizer.
SDISTS = Path(__file__).resolve().parents[2] / ".venvs" / "mpi4jax-sdists"
LAYOUTS = {
    "0.9.1.post2": ["mpi4jax"],
    "0.7.2": ["mpi4jax", "mpi4jax.notoken"],
    "0.4.0": ["mpi4jax", "mpi4jax.experimental", "mpi4jax.experimental.notoken"],
    "0.3.10": ["mpi4jax", "mpi4jax.experimental", "mpi4jax.experimental.tokenizer"],
}


def real_modules(version: str, into: Path) -> tuple[dict, Path]:
    """mpi4jax `version`'s modules (LAYOUTS), as `import` makes them from its files before
    running them (running them needs mpi4jax's compiled bridge): find_spec, then
    module_from_spec, which sets every attribute compared here. And their root folder."""
    sdist = SDISTS / f"mpi4jax-{version}.tar.gz"
    assert sdist.is_file(), f"{sdist} is missing: ci/setup.sh fetches mpi4jax's sdists from PyPI"
    with tarfile.open(sdist) as tar:
        package = [m for m in tar.getmembers() if m.name.startswith(f"mpi4jax-{version}/mpi4jax/")]
        tar.extractall(into, members=package, filter="data")
    root = into / f"mpi4jax-{version}"
    made: dict = {}
    for name in LAYOUTS[version]:
        parent = name.rpartition(".")[0]
        path = made[parent].__path__ if parent else [str(root)]
        made[name] = importlib.util.module_from_spec(
            importlib.machinery.PathFinder.find_spec(name, path)
        )
    return made, root


def looks(module, root: Path) -> dict:
    """What a program or a tool sees of `module`'s place: its file, folder and spec, with
    paths relative to the folder that holds the package."""
    spec = module.__spec__

    def here(path):
        return os.path.relpath(path, root)

    search = spec.submodule_search_locations
    return {
        "__name__": module.__name__,
        "__file__": here(module.__file__),
        "__path__": [here(p) for p in module.__path__] if hasattr(module, "__path__") else None,
        "__package__": module.__package__,
        "__cached__": here(module.__cached__),
        "__loader__": type(module.__loader__),
        "spec": (spec.name, here(spec.origin), spec.has_location, spec.parent, here(spec.cached)),
        "spec.loader": type(spec.loader),
        "spec.submodule_search_locations": [here(p) for p in search] if search else None,
    }


@pytest.mark.parametrize("version", list(LAYOUTS))
def test_each_module_has_a_file_folder_and_spec_as_the_real_mpi4jax(presenting, version, tmp_path):
    """`__file__`, `__path__` and the spec of each module, against the same release's."""
    real, real_root = real_modules(version, tmp_path)
    presenting(version)
    ours = {name: importlib.import_module(name) for name in LAYOUTS[version]}
    our_root = Path(_mpi4jax.FILES)
    for name in LAYOUTS[version]:
        assert looks(ours[name], our_root) == looks(real[name], real_root), name
        # What tools open: the spec's origin (the module's source) and the package's folder.
        origin = importlib.util.find_spec(name).origin
        assert inspect.getsource(ours[name]) == Path(origin).read_text(), name
        assert Path(origin).is_relative_to(our_root), origin
    assert importlib.resources.files("mpi4jax").joinpath("__init__.py").is_file()


def test_a_file_run_under_another_name_says_how_to_import_it():
    where = Path(_mpi4jax.FILES) / "mpi4jax" / "__init__.py"
    spec = importlib.util.spec_from_file_location("elsewhere", where)
    with pytest.raises(ImportError, match="set JAXMPI_AS_MPI4JAX and import mpi4jax"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


@needs_mpi4py
def test_a_token_program_of_mpi4jax_0_7(presenting):
    """Written for mpi4jax 0.7.2: every op threads the token, inside jit, fori_loop and
    grad; send and recv in an order that depends on the rank."""
    mpi4jax = presenting("0.7.2")
    partner = partner_or_skip()
    comm = MPI.COMM_WORLD

    @jax.jit
    def step(x):
        token = jax.lax.create_token()
        total, token = mpi4jax.allreduce(x, op=MPI.SUM, comm=comm, token=token)
        root, token = mpi4jax.bcast(x, 0, comm=comm, token=token)
        gathered, token = mpi4jax.allgather(x, comm=comm, token=token)
        if RANK < partner:
            token = mpi4jax.send(x, partner, tag=3, comm=comm, token=token)
            other, token = mpi4jax.recv(x, partner, tag=4, comm=comm, token=token)
        else:
            other, token = mpi4jax.recv(x, partner, tag=3, comm=comm, token=token)
            token = mpi4jax.send(x, partner, tag=4, comm=comm, token=token)
        swapped, token = mpi4jax.sendrecv(x, x, partner, partner, comm=comm, token=token)
        token = mpi4jax.barrier(comm=comm, token=token)
        return total, root, gathered, other, swapped, token

    x = jnp.full(3, float(RANK))
    total, root, gathered, other, swapped, token = step(x)
    assert_array(total, np.full(3, SIZE * (SIZE - 1) / 2))
    assert_array(root, np.zeros(3))
    assert_array(gathered, np.stack([np.full(3, float(r)) for r in range(SIZE)]))
    assert_array(other, np.full(3, float(partner)))
    assert_array(swapped, np.full(3, float(partner)))
    assert isinstance(jax.typeof(token), type(jax.typeof(jax.lax.create_token())))

    def loop(x):
        def body(_, carry):
            value, token = carry
            value, token = mpi4jax.allreduce(value, op=MPI.SUM, comm=comm, token=token)
            return value / SIZE, token

        return jax.lax.fori_loop(0, 5, body, (x, jax.lax.create_token()))[0]

    assert_array(jax.jit(loop)(jnp.arange(3.0)), np.arange(3.0))
    loss = lambda v: jnp.sum(mpi4jax.allreduce(v * v, op=MPI.SUM, comm=comm)[0])  # noqa: E731
    assert_array(jax.grad(loss)(jnp.arange(3.0)), 2 * np.arange(3.0))


@needs_mpi4py
def test_a_token_given_is_the_token_returned(presenting):
    mpi4jax = presenting("0.5.4")
    token = jax.lax.create_token()
    _, returned = mpi4jax.allreduce(jnp.ones(2), op=MPI.SUM, token=token)
    assert returned is token
    assert mpi4jax.barrier(token=token) is token
    with pytest.raises(TypeError, match="token must be a JAX token"):
        mpi4jax.allreduce(jnp.ones(2), op=MPI.SUM, token=jnp.ones(1))


@needs_mpi4py
def test_from_0_8_on_tokens_are_refused_as_mpi4jax_refuses_them(presenting):
    mpi4jax = presenting("0.8.0")
    with pytest.raises(RuntimeError, match="Explicit token management is not supported"):
        mpi4jax.allreduce(jnp.ones(2), op=MPI.SUM, token=jax.lax.create_token())
    assert_array(mpi4jax.allreduce(jnp.ones(2), op=MPI.SUM), np.full(2, float(SIZE)))


def test_experimental_auto_tokenize_keeps_the_function(presenting):
    presenting("0.3.10")
    from mpi4jax.experimental import auto_tokenize

    def f(x):
        return x

    assert auto_tokenize(f) is f


@pytest.mark.parametrize(
    ("value", "phrases"),
    [
        ("banana", ["JAXMPI_AS_MPI4JAX='banana' is not a version", "0.3.0 to 0.9.1.post2"]),
        ("0.7.9", ["mpi4jax 0.7.9 was never released", "near it: 0.7.0"]),
        ("0.2.18", ["0.2.18's (Allreduce", "older"]),
    ],
)
def test_a_bad_value_is_refused_at_import(presenting, value, phrases):
    with pytest.raises(ImportError) as refused:
        presenting(value)
    for phrase in phrases:
        assert phrase in str(refused.value)


def test_without_the_variable_no_mpi4jax_module_appears():
    """This process started without JAXMPI_AS_MPI4JAX (and mpi4jax is not installed)."""
    assert _jaxmpi_startup.Mpi4jaxFinder not in sys.meta_path
    assert "mpi4jax" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="No module named 'mpi4jax'"):
        import mpi4jax  # noqa: F401


@rank_0_only
def test_a_process_started_with_the_variable_finds_jaxmpi_as_mpi4jax(tmp_path):
    """The startup hook at work: the variable wins over an mpi4jax earlier on sys.path,
    and a program of 0.7.2 whose first jitted program takes and returns its own token
    keeps fast dispatch (that token is not the MPI effect's). No mpi4py: not every build's
    mpi4py loads its MPI (the MPI-5 ABI one)."""
    (tmp_path / "mpi4jax").mkdir()
    (tmp_path / "mpi4jax" / "__init__.py").write_text("__version__ = 'NOT JAXMPI'\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import warnings, jax, jax.numpy as jnp, jaxmpi, mpi4jax\n"
        "from jaxmpi._binding.dispatch import dispatch_mode\n"
        "warnings.simplefilter('error')\n"
        "step = jax.jit(lambda x, t: mpi4jax.allreduce(x, op=jaxmpi.SUM, token=t))\n"
        "value, token = step(jnp.ones(2), jax.lax.create_token())\n"
        "print('VERSION', mpi4jax.__version__, mpi4jax.allreduce.__module__)\n"
        "print('MODE', dispatch_mode()[0], value)\n"
    )
    done = run_alone(code, JAXMPI_AS_MPI4JAX="0.7.2")
    out = done.stdout + done.stderr
    assert "VERSION 0.7.2 jaxmpi" in done.stdout, out
    assert "MODE fast [1. 1.]" in done.stdout, out
