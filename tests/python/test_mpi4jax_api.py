"""jaxmpi as an exact drop-in for mpi4jax 0.9: its names and its version attribute."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import jaxmpi

MPI4JAX_OPS = [
    "allgather", "allreduce", "alltoall", "barrier", "bcast", "gather", "recv", "reduce",
    "scan", "scatter", "send", "sendrecv",
]  # fmt: skip
MPI4JAX_OTHERS = ["has_cuda_support", "has_sycl_support"]


def test_every_mpi4jax_name_exists():
    missing = [name for name in [*MPI4JAX_OPS, *MPI4JAX_OTHERS] if name not in jaxmpi.__all__]
    assert not missing


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
