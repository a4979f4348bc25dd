"""pytest setup for the jaxmpi test suite: 64-bit types, a fixture that drains pending
eager ops, the hook that keeps the ranks' outcomes in step, and the selection of a CI cell
(`--jaxmpi-cell=KIND`: selection.py). The helpers tests import live in helpers.py (its
docstring has the rules every test follows).

After every test all ranks compare notes (one allgather on a private communicator): a test
that failed on some other rank is reported as an error on this rank too. So every rank
sees the same outcome, and `pytest -x` stops all ranks at the same test instead of
leaving the others waiting.
"""

from __future__ import annotations

import jax
import pytest

# Before any test creates an array: the dtype tests need 64-bit types (int64, float64,
# complex128).
jax.config.update("jax_enable_x64", True)

import selection  # noqa: E402  (after the x64 switch, as every import of helpers)

import helpers  # noqa: E402
from helpers import MPI, RANK, SIZE  # noqa: E402

# ---------------------------------------------------------------------------------------
# The selection of a cell of ./ci/test.sh
# ---------------------------------------------------------------------------------------


def pytest_addoption(parser):
    parser.addoption(
        "--jaxmpi-cell",
        choices=sorted(selection.KINDS),
        help="run what this kind of CI cell runs (tests/python/selection.py); default: "
        "every test named",
    )


def pytest_configure(config):
    for name, meaning in selection.MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    # A misspelt marker would silently select nothing: an error, not pytest's warning.
    config.addinivalue_line("filterwarnings", "error::pytest.PytestUnknownMarkWarning")


def pytest_ignore_collect(collection_path, config):
    kind = config.getoption("--jaxmpi-cell")
    if kind and collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        return selection.ignores(kind, collection_path) or None
    return None


def pytest_collection_modifyitems(config, items):
    kind = config.getoption("--jaxmpi-cell")
    if kind:
        items[:], left = selection.split(kind, items)
        config.hook.pytest_deselected(items=left)


# ---------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _hang_reports_reach_the_log(pytestconfig):
    """`helpers.within` lifts pytest's capture before it ends a hung process."""
    helpers.CAPTURE = pytestconfig.pluginmanager.getplugin("capturemanager")


@pytest.fixture(autouse=True)
def _drain_pending_mpi_calls():
    """Eager ops run asynchronously; wait for them so a failure shows in its own test."""
    yield
    jax.effects_barrier()


# ---------------------------------------------------------------------------------------
# Keeping the ranks' outcomes in step
# ---------------------------------------------------------------------------------------

# A private communicator for the harness's own bookkeeping, so it never matches a test's
# messages. Without mpi4py there is no cheap host-side allgather: outcomes are not shared.
_HARNESS_COMM = MPI.COMM_WORLD.Dup() if MPI is not None else None
_FAILED_HERE = pytest.StashKey[bool]()


@pytest.fixture
def checked():
    """Checked mode (what JAXMPI_CHECK=1 sets at start) for one test, on every rank alike."""
    from jaxmpi import _native

    _native.set_checked_mode(True)
    try:
        yield
    finally:
        jax.effects_barrier()
        _native.set_checked_mode(False)


def pytest_report_header(config):
    return f"jaxmpi: rank {RANK} of {SIZE}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.stash[_FAILED_HERE] = True
    # Teardown is reported for every test, skipped ones included, on every rank: the one
    # place where all ranks can safely exchange their outcomes.
    if call.when == "teardown" and _HARNESS_COMM is not None:
        failed_here = item.stash.get(_FAILED_HERE, False)
        flags = _HARNESS_COMM.allgather(failed_here)
        failed_ranks = [r for r, failed in enumerate(flags) if failed]
        if failed_ranks and not failed_here:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} failed on rank(s) {failed_ranks} (it passed on rank {RANK}); "
                "see the output of those ranks"
            )
    return report
