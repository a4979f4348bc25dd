"""Which tests each kind of cell of ./ci/test.sh runs. A cell passes `--jaxmpi-cell=KIND`
(conftest.py applies KINDS below); ci/matrix.sh's JAXMPI_SUITE_TABLE says which builds run
which kind, at how many ranks. What a test file declares with the markers of MARKERS (a
module's `pytestmark`, or a test's decorator) is all the selection reads; a file that
declares nothing runs wherever the suite runs: on every build of the matrix, at every
number of ranks. `ci/suite_cells.sh which FILE` says which cells run a file.

Three facts need no marker: the dtypes a test is parametrized over (the names of ALL_DTYPES
among its parameters' ids), whether it is the eager form of a test also collected under
jit (an "eager" among its parameters' ids, "jit" in the twin's), and whether its file
imports sharding.py or layouts.py (it needs jax.distributed started before any JAX
computation, so it runs in cells of its own, and elsewhere those modules skip it at
import).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path

from helpers import ALL_DTYPES, FEW_DTYPES

# What a test may declare, and what each kind of cell does with it.
MARKERS = {
    "same_on_every_mpi": "no MPI library can change the outcome: run where the whole suite "
    "runs (the first build, the oldest and newest JAX), not on the other MPIs",
    "same_at_every_size": "a number of ranks above 2 cannot change the outcome: not run at "
    "3 and 4 ranks",
    "dtype_sweep": "sweeps ops over every dtype: on the other MPIs only FEW_DTYPES (the "
    "dtype tables of test_dtypes run whole on every build)",
    "across_hosts": "also run across 2 simulated hosts (ci/multihost.sh), on HOSTS_DTYPES",
    "several_ranks_per_host": "also run with 2 ranks on each of 2 simulated hosts",
    "progress_thread": "also run with the progress thread forced (JAXMPI_PROGRESS=thread)",
    "large_messages": "messages over 2^31 elements, ~8 GiB a rank: only in cells of their own",
}

# Across hosts, where TCP replaces shared memory: one integer and one float dtype.
HOSTS_DTYPES = ("int32", "float64")


class Test:
    """What the selection knows of one collected test; `collected` holds the node ids of
    every test collected with it."""

    def __init__(self, item, collected: frozenset[str]) -> None:
        self.markers = {mark.name for mark in item.iter_markers()}
        callspec = getattr(item, "callspec", None)
        words = callspec.id.split("-") if callspec else []
        self.dtypes = set(words) & set(ALL_DTYPES)
        # The eager form of a test whose jit form was collected too: the same op and
        # arguments through JAX's other dispatch path.
        self.has_jit_twin = "eager" in words and jit_form(item.nodeid, words) in collected

    def has(self, marker: str) -> bool:
        assert marker in MARKERS, f"{marker}: not one of MARKERS"
        return marker in self.markers

    @property
    def more_dtypes(self) -> bool:
        """Parametrized over a dtype outside FEW_DTYPES."""
        return not self.dtypes <= set(FEW_DTYPES)

    @property
    def suite(self) -> bool:
        """Runs in the suite's own cells (not only in cells of its own)."""
        return not self.has("large_messages")


def jit_form(nodeid: str, words: list[str]) -> str:
    """The node id of the jit form of the test `nodeid`, whose parameters' id is `words`
    joined by "-": "jit" for "eager"."""
    jit_id = "-".join("jit" if word == "eager" else word for word in words)
    return nodeid.removesuffix(f"[{'-'.join(words)}]") + f"[{jit_id}]"


@functools.cache
def imports(path: Path, module: str) -> bool:
    """Whether the test file at `path` imports the helper `module` (read with ast, not run)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False  # pytest reports the file itself
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == module for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == module and not node.level:
            return True
    return False


def imports_sharding(path: Path) -> bool:
    return imports(path, "sharding")


def imports_layouts(path: Path) -> bool:
    return imports(path, "layouts")


class Kind:
    """A kind of cell: the test files it reads (`reads`, from the path alone: a file read is
    imported) and, of their tests, those it runs (`runs`)."""

    def __init__(self, runs: Callable[[Test], bool], reads: Callable[[Path], bool]) -> None:
        self.runs, self.reads = runs, reads


def suite_files(path: Path) -> bool:
    """The files the suite's own cells read: all but those under jax.distributed, which
    must start before any JAX computation (another file could run one at import)."""
    return not imports_sharding(path) and not imports_layouts(path)


KINDS: dict[str, Kind] = {
    # The first build at 2 ranks, the oldest and newest JAX.
    "whole": Kind(lambda t: t.suite, suite_files),
    # The other family's first build, with the first build's JAX: all that its MPI can
    # change, every dtype (its handles and datatypes are its own); what no MPI changes has
    # run whole on the first build, with the same JAX and Python.
    "family": Kind(lambda t: t.suite and not t.has("same_on_every_mpi"), suite_files),
    # Another MPI: what the library can change (its family's tables and errors, threads,
    # how it is found and started, transfers of every kind). Eager and jit are JAX's two
    # ways to the same handler call with the same arguments: the jit form runs.
    "other-mpi": Kind(
        lambda t: (
            t.suite
            and not t.has("same_on_every_mpi")
            and not (t.has("dtype_sweep") and t.more_dtypes)
            and not t.has_jit_twin
        ),
        suite_files,
    ),
    # A JAX between the oldest and newest, over the first build's MPI: the dtype does not
    # meet JAX's version.
    "other-jax": Kind(lambda t: t.suite and not t.more_dtypes, suite_files),
    # The first build at 1 rank (a world of one: sends to itself, every root and count its
    # own): the dtype meets no peer, and eager and jit hand an op the same arguments.
    "one-rank": Kind(lambda t: t.suite and not t.more_dtypes and not t.has_jit_twin, suite_files),
    # 3 ranks (odd, and more ranks than cores): what the number of ranks can change. Eager
    # and jit hand an op the same arguments, which is where the number of ranks enters:
    # the jit form runs.
    "ranks": Kind(
        lambda t: (
            t.suite and not t.has("same_at_every_size") and not t.more_dtypes and not t.has_jit_twin
        ),
        suite_files,
    ),
    "hosts": Kind(lambda t: t.has("across_hosts") and t.dtypes <= set(HOSTS_DTYPES), suite_files),
    "hosts-several-ranks": Kind(lambda t: t.has("several_ranks_per_host"), suite_files),
    "progress-thread": Kind(lambda t: t.suite and t.has("progress_thread"), suite_files),
    "large": Kind(lambda t: t.has("large_messages"), suite_files),
    # Under jax.distributed, in a process of its own.
    "sharded": Kind(lambda t: True, imports_sharding),
    "sharded-ranks": Kind(lambda t: not t.has("same_at_every_size"), imports_sharding),
    # JAX's collectives through jaxmpi's pass, in one layout of devices per process.
    "layouts": Kind(lambda t: True, imports_layouts),
    # The same on another MPI or in another layout: FEW_DTYPES (ci/matrix.sh says why).
    "layouts-few": Kind(lambda t: not t.more_dtypes, imports_layouts),
    # JAXMPI_MESH_REDUCTIONS=ordered: the MeshComm's results compared bit for bit with the
    # rank-order fold (the other cells compare reductions to rounding).
    "ordered": Kind(lambda t: True, lambda path: path.name == "test_mesh_comm.py"),
}


def ignores(kind: str, path: Path) -> bool:
    """Whether a cell of `kind` leaves the test file at `path` unread."""
    return not KINDS[kind].reads(path)


def split(kind: str, items: list) -> tuple[list, list]:
    """The collected tests a cell of `kind` runs, and those it leaves out."""
    kept, left = [], []
    collected = frozenset(item.nodeid for item in items)
    for item in items:
        (kept if KINDS[kind].runs(Test(item, collected)) else left).append(item)
    return kept, left
