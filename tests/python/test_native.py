"""The compiled extension module must not link any MPI or CUDA library: jaxmpi loads
them at run time, so one wheel works with whatever MPI the machine has."""

from __future__ import annotations

import re
import shutil
import subprocess

import jaxmpi._native
import pytest
from helpers import RANK

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
def test_extension_module_links_no_mpi_or_cuda():
    path = jaxmpi._native.__file__
    needed = needed_libraries(path)
    assert needed, f"readelf found no DT_NEEDED entries at all in {path}; parsing broke?"
    forbidden = [lib for lib in needed if lib.startswith(FORBIDDEN_PREFIXES)]
    assert not forbidden, f"{path} links {forbidden} (all: {needed})"
