"""What the CUDA tests share (test_cuda.py, test_cuda_order.py): the device they run on,
data no receive can fake, and the check that each op went the way the run asked for.

The device is the process's GPU. Where there is none and `JAXMPI_TEST_STANDIN=cpu` is set
(only `ci/gpu_run.sh --dry-run` sets it), the CPU stands in: the same tests run on CPU
arrays, which checks the tests and the run's scripts, not the GPU path, and no op may then
go through the device path (its counters stay still). Without either, the tests skip:
ci/gpu_run.sh fails a GPU run on any skip.

`JAXMPI_TEST_EXPECT` (staged or direct, set by ci/gpu_run.sh per leg) is the way every op
must go on the GPU, as `jaxmpi._native.gpu_counters()` counts it: a run that asked for
CUDA-aware MPI and silently staged (or the reverse) fails every op test.
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
import jaxmpi
from helpers import RANK
from jaxmpi import _native

STANDIN = os.environ.get("JAXMPI_TEST_STANDIN", "") == "cpu"
if STANDIN:
    DEVICE = jax.devices("cpu")[0]
else:
    DEVICE = jax.devices("gpu")[0] if helpers._gpu_ready() else None

#: Skips a whole file where there is neither a GPU nor a stand-in.
needs_device = pytest.mark.skipif(
    DEVICE is None,
    reason="no CUDA GPU here (jaxlib without CUDA, JAX_PLATFORMS without cuda, or no "
    "driver: see `python -m jaxmpi info`), and JAXMPI_TEST_STANDIN=cpu is not set",
)
#: A test of what only a GPU shows (a refusal on device arrays, NCCL): skipped when the CPU
#: stands in, never on a GPU.
gpu_only = pytest.mark.skipif(STANDIN, reason="the CPU stands in for the GPU (dry run)")

#: (3 << 20) + 5 float32: three whole 4 MiB staging chunks and a tail of 5 elements.
TAIL = (3 << 20) + 5
CHUNK_BYTES = 4 << 20


def expected_mode() -> str:
    """How ops on device arrays must go: host (no device path: the CPU stands in), staged
    or direct."""
    if STANDIN:
        return "host"
    wanted = os.environ.get("JAXMPI_TEST_EXPECT", "")
    if wanted:
        return wanted
    return "direct" if jaxmpi._runtime.library.info["cuda_aware"] else "staged"


def on_device(x):
    return jax.device_put(x, DEVICE)


def pattern(n: int, dtype, salt: int, rank: int = RANK) -> np.ndarray:
    """n values unlike any other test's (`salt`) or rank's, exact in every dtype (small
    integers: sums over a few ranks stay exact in bfloat16)."""
    i = np.arange(n, dtype=np.int64)
    v = (i * 7 + rank * 13 + salt * 5) % 61 - 30
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return (v % 3) == 0
    if np.issubdtype(dtype, np.complexfloating):
        return (v + 1j * ((i + rank + salt) % 17 - 8)).astype(dtype)
    return v.astype(dtype)


def poisoned(n: int, dtype) -> np.ndarray:
    """A receive template nothing real equals: NaN, the most negative integer, all True."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.ones(n, bool)
    if np.issubdtype(dtype, np.integer):
        return np.full(n, np.iinfo(dtype).min, dtype)
    return np.full(n, np.nan, dtype)


def exact(a) -> np.ndarray:
    """For comparison: 16-bit floats widened (exactly), the rest as they are."""
    a = np.asarray(a)
    if a.dtype in (np.dtype(jnp.bfloat16), np.dtype(np.float16)):
        return a.astype(np.float64)
    return a


def assert_same(got, want) -> None:
    np.testing.assert_array_equal(exact(got), exact(want))


def chunks(n: int, dtype) -> int:
    """MPI calls a staged allreduce or bcast of n elements makes."""
    return max(1, -(-n * np.dtype(dtype).itemsize // CHUNK_BYTES))


@contextlib.contextmanager
def went(
    ops: int = 1,
    *,
    host_code: bool = False,
    staged_chunks: int | None = None,
    in_place: int | None = None,
):
    """Checks that the ops run inside went the expected way (`expected_mode`), from the
    GPU counters: `ops` per rank; `host_code`: their reduction runs on the host, so a
    CUDA-aware run stages them too; `staged_chunks`: the pipeline's MPI calls, where
    staged. A CUDA-aware run stages in-place sendrecvs too (MPI_Sendrecv_replace copies
    through host memory), counted apart: `in_place` says how many there are, where the
    test knows. Results must be ready (blocked on) before the block ends."""
    before = _native.gpu_counters()
    yield
    after = _native.gpu_counters()
    delta = {k: after[k] - before[k] for k in after}
    mode = expected_mode()
    staged = mode == "staged" or (mode == "direct" and host_code)
    if mode == "host":
        assert delta["direct"] == delta["staged"] == 0, delta
        return
    if staged:
        assert delta["staged"] >= ops and delta["direct"] == 0, (mode, delta)
        if staged_chunks is not None:
            assert delta["staged_chunks"] == staged_chunks, (mode, delta)
        if mode == "direct":
            assert delta["staged_host_code"] >= ops, (mode, delta)
    else:
        moved = delta["direct"] + delta["staged_in_place"]
        assert moved >= ops and delta["staged"] == delta["staged_in_place"], (mode, delta)
        if in_place is not None:
            assert delta["staged_in_place"] == in_place, (mode, delta)
    assert delta["withheld"] == delta["pageable"] == 0, delta


def run(fn, *args):
    """fn under jit on device copies of args, finished; the results as numpy arrays, each
    checked to live on the device."""
    out = jax.block_until_ready(jax.jit(fn)(*[on_device(a) for a in args]))
    for leaf in jax.tree_util.tree_leaves(out):
        assert leaf.devices() == {DEVICE}, leaf.devices()
    return jax.tree_util.tree_map(np.asarray, out)
