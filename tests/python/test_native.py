"""The compiled extension module must not link any MPI or CUDA library: jaxmpi loads
them at run time, so one wheel works with whatever MPI the machine has."""

from __future__ import annotations

import ast
import inspect
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import jaxmpi._native
from helpers import RANK

# The extension module itself.
pytestmark = pytest.mark.same_at_every_size

PACKAGE = Path(jaxmpi.__file__).parent

FORBIDDEN_PREFIXES = ("libmpi", "libmpich", "libcuda")


def needed_libraries(path: str) -> list[str]:
    """The DT_NEEDED entries of an ELF file, from `readelf -d`."""
    output = subprocess.run(
        ["readelf", "-d", path], check=True, capture_output=True, text=True
    ).stdout
    # e.g. " 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]"
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", output)


@pytest.mark.skipif(RANK != 0, reason="checked once, on rank 0")
@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf (binutils)")
@pytest.mark.skipif(
    os.environ.get("JAXMPI_MPI") == "linked",
    reason="the linked backend's build links its MPI by design (ci/linked_python.sh)",
)
def test_extension_module_links_no_mpi_or_cuda():
    path = jaxmpi._native.__file__
    needed = needed_libraries(path)
    assert needed, f"readelf found no DT_NEEDED entries at all in {path}; parsing broke?"
    forbidden = [lib for lib in needed if lib.startswith(FORBIDDEN_PREFIXES)]
    assert not forbidden, f"{path} links {forbidden} (all: {needed})"


def _stub() -> dict[str, ast.stmt]:
    """The declarations of the installed package's _native.pyi, by name, without the
    stub-only types (`_LibraryInfo`, ...: private names the extension does not export)."""
    tree = ast.parse((PACKAGE / "_native.pyi").read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return {n: v for n, v in names.items() if not n.startswith("_") or n == "__version__"}


def test_the_info_dicts_have_exactly_the_keys_the_stub_types():
    tree = ast.parse((PACKAGE / "_native.pyi").read_text())
    typed = {
        node.name: {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)}
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name.startswith("_")
    }
    assert set(jaxmpi._native.info()) == typed["_LibraryInfo"]
    assert set(jaxmpi._native.constants()) == typed["_Constants"]
    assert set(jaxmpi._native.cuda_info()) == typed["_CudaInfo"]  # no GPU needed to ask
    assert set(jaxmpi._native.gpu_counters()) == typed["_GpuCounters"]
    assert all(set(s) == typed["_Signature"] for s in jaxmpi._native.signatures().values())


def test_a_buffer_is_described_by_the_driver_or_refused_naming_it():
    """Where the driver loads, address 0 is no allocation and the driver's error says so;
    where it does not, the refusal names the library jaxmpi loads (the one XLA uses)."""
    if jaxmpi._native.cuda_info()["driver"]:
        described = jaxmpi._native.cuda_buffer(0)
        assert "CUDA_ERROR" in str(described["is_legacy_cuda_ipc_capable"]), described
    else:
        with pytest.raises(jaxmpi.MPIError, match=r"libcuda\.so\.1"):
            jaxmpi._native.cuda_buffer(0)


def test_typing_files_are_shipped():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_native.pyi").is_file()


def test_stub_declares_exactly_what_the_extension_exports():
    exported = {n for n in dir(jaxmpi._native) if not n.startswith("_")} | {"__version__"}
    declared = _stub()
    assert sorted(declared) == sorted(exported)
    kinds = {
        name: "class" if isinstance(value, type) else "function" if callable(value) else "value"
        for name, value in vars(jaxmpi._native).items()
        if name in exported
    }
    stub_kinds = {
        name: {ast.ClassDef: "class", ast.FunctionDef: "function"}.get(type(node), "value")
        for name, node in declared.items()
    }
    assert stub_kinds == kinds


def test_stub_parameters_are_the_extension_s():
    """Names, kinds and defaults of every function's parameters, as PyO3 shows them."""
    mismatched = {}
    for name, node in _stub().items():
        if not isinstance(node, ast.FunctionDef):
            continue
        args = node.args
        positional = args.posonlyargs + args.args
        assert not (args.vararg or args.kwonlyargs or args.kwarg), f"{name}: only plain parameters"
        defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults)) + [
            ast.literal_eval(d) for d in args.defaults
        ]
        kinds = [inspect.Parameter.POSITIONAL_ONLY] * len(args.posonlyargs) + [
            inspect.Parameter.POSITIONAL_OR_KEYWORD
        ] * len(args.args)
        declared = list(zip([a.arg for a in positional], kinds, defaults))
        native = inspect.signature(getattr(jaxmpi._native, name)).parameters.values()
        actual = [(p.name, p.kind, p.default) for p in native]
        if declared != actual:
            mismatched[name] = (declared, actual)
    assert not mismatched
