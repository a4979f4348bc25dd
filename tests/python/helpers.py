"""Shared helpers of the jaxmpi test suite: ranks, markers, dtypes, inputs every rank can
compute for every other rank, expected results, and comparison.

Rules every test follows (the suite runs under an MPI launcher: every rank runs pytest over
the same list of tests, in the same order; see tests/run_pytest_mpi.sh):

* A test makes the same MPI calls in the same order on every rank (or, for point-to-point
  tests, matching calls on the ranks that talk to each other).
* Expected values are computed with numpy from RANK and SIZE (helpers below), never
  written out for one particular number of ranks.
* A test computes everything first and asserts at the end, so that a failed assertion on
  one rank cannot leave the other ranks waiting in a collective call.
* Tests that need several ranks are marked `@needs_ranks(n)`; they are skipped, with a
  reason, when the job has fewer.

Import them in a test module with `from helpers import ...` (pytest puts this folder on
sys.path); conftest.py holds only the fixtures and hooks.

The files go by concern, as the implementation does: values of every op (test_collectives,
test_varcount, test_p2p, test_dtypes), transforms (test_autodiff, test_vmap,
test_control_flow), errors at trace time (test_errors) and from MPI (test_mpi_errors),
copies (test_zero_copy), dispatch and threads (test_dispatch, test_threads), communicators
(test_comms), the drop-in API (test_mpi4jax_api), the declarations (test_signatures,
test_native), JAX's collectives by route (test_jax_collectives: jaxmpi's pass;
test_jax_partitioning: JAX 0.12.1's jax_partitioning mode through it; test_xla_plugin:
XLA's MPI backend through the plug-in), devices as ranks (test_mesh_comm:
a MeshComm's ops; test_device_layer, test_divergent_paths: the device-rank layer where
issues 50 and 57 found it wanting), GPUs (test_gpu_startup: the start-up, on the CPU, up
to a faked driver; test_cuda, test_cuda_order: on a GPU). Test ids carry the op names:
`pytest -k sendrecv` selects one op's tests.
Which CI cells run a file is what its markers declare (selection.py): a file that
declares nothing runs on every build at every number of ranks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import os
import re
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi

try:
    from mpi4py import MPI
except ImportError:  # jaxmpi works without mpi4py; tests that need it are skipped
    MPI = None

RANK: int = jaxmpi.COMM_WORLD.Get_rank()
SIZE: int = jaxmpi.COMM_WORLD.Get_size()

# pytest's capture of output, lifted before a hung process ends (conftest.py sets it).
CAPTURE = None


@contextlib.contextmanager
def within(what: str, seconds: float = 60):
    """Ends this process (exit 3, saying so, with every thread's stack) if the block takes
    longer than `seconds`: a call stuck in MPI cannot be interrupted, and the other ranks
    would wait on; their own timers end them. A hang so fails its cell, naming the test,
    instead of stalling it."""

    def hung() -> None:
        with contextlib.suppress(Exception):
            CAPTURE.suspend_global_capture(in_=False)
        print(f"\nHUNG: {what} took over {seconds} s on rank {RANK}", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(3)

    timer = threading.Timer(seconds, hung)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


# ---------------------------------------------------------------------------------------
# Markers
# ---------------------------------------------------------------------------------------


def needs_ranks(n: int):
    """Skips a test when the job has fewer than `n` ranks."""
    return pytest.mark.skipif(SIZE < n, reason=f"needs at least {n} MPI ranks, job has {SIZE}")


needs_mpi4py = pytest.mark.skipif(MPI is None, reason="needs mpi4py")


_LIBRARY = jaxmpi._runtime.library.info

#: Tests that make MPI fail on purpose: skipped on Intel MPI's MPI-5 ABI library (seen in
#: 2021.18), which accepts MPI_ERRORS_RETURN, reports it back, and still aborts the job at
#: the next error (the probe names the bug too: backends/src/bin/probe/known.rs).
needs_errors_return = pytest.mark.skipif(
    _LIBRARY["family"] == "mpiabi" and "Intel(R) MPI Library" in _LIBRARY["version_string"],
    reason="intel-mpi-abi-errors-return: this library aborts the job on an MPI error, "
    "whatever error handler the communicator has",
)


def _gpu_ready() -> bool:
    # has_cuda_support() first: asking a jaxlib without CUDA for "gpu" devices would raise.
    if not jaxmpi.has_cuda_support():
        return False
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


#: The CUDA tests: skipped, with a reason, where jaxmpi has no GPU to use. ci/gpu_run.sh
#: fails the GPU run on any such skip, so a GPU run cannot pass without running them.
needs_gpu = pytest.mark.skipif(
    not _gpu_ready(),
    reason="no CUDA GPU here: jaxlib without CUDA, JAX_PLATFORMS without cuda, or the CUDA "
    "driver cannot be loaded (see `python -m jaxmpi info`)",
)

# ---------------------------------------------------------------------------------------
# Dtypes and reduction ops
# ---------------------------------------------------------------------------------------

#: Every dtype jaxmpi promises to move.
ALL_DTYPES = [
    "bool",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64",
    "complex64", "complex128",
]  # fmt: skip

#: The dtypes kept where a cell thins a sweep (selection.py): each size from 1 to 16 bytes,
#: each kind, and float16, which jaxmpi reduces with its own MPI ops.
FEW_DTYPES = ["bool", "int32", "int64", "float16", "float64", "complex128"]

INT_DTYPES = [d for d in ALL_DTYPES if d.startswith(("int", "uint"))]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]
COMPLEX_DTYPES = ["complex64", "complex128"]

#: Which predefined reduction is defined on which dtypes (the MPI standard's table:
#: arithmetic on integers, floats and complex, except MIN/MAX on complex; logical ops on
#: integers and bool; bitwise ops on integers only).
OP_DTYPES = {
    "SUM": INT_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES,
    "PROD": INT_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES,
    "MIN": INT_DTYPES + FLOAT_DTYPES,
    "MAX": INT_DTYPES + FLOAT_DTYPES,
    "LAND": ["bool"] + INT_DTYPES,
    "LOR": ["bool"] + INT_DTYPES,
    "LXOR": ["bool"] + INT_DTYPES,
    "BAND": INT_DTYPES,
    "BOR": INT_DTYPES,
    "BXOR": INT_DTYPES,
}
OP_NAMES = list(OP_DTYPES)

#: numpy's version of each reduction (applied to two arrays at a time).
NUMPY_REDUCERS = {
    "SUM": np.add,
    "PROD": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "LAND": np.logical_and,
    "LOR": np.logical_or,
    "LXOR": np.logical_xor,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
}


def default_op_name(dtype) -> str:
    """The reduction the op-by-dtype matrix uses: SUM, or LXOR for bool (no SUM there)."""
    return "LXOR" if np.dtype(jnp.dtype(dtype)) == np.bool_ else "SUM"


def jaxmpi_op(name: str):
    """jaxmpi's own constant for a reduction, e.g. jaxmpi.SUM."""
    return getattr(jaxmpi, name)


def mpi4py_op(name: str):
    """mpi4py's constant for a reduction, e.g. MPI.SUM."""
    return getattr(MPI, name)


# ---------------------------------------------------------------------------------------
# Input data: deterministic, different on every rank, exact in every dtype
# ---------------------------------------------------------------------------------------


def rank_data(rank: int, dtype, shape=(3,)) -> np.ndarray:
    """The input rank `rank` contributes: small numbers, exactly representable in every
    dtype (float16 and bfloat16 included), and small enough that a sum over 4 ranks does
    not overflow int8. Any rank can compute any other rank's input, which is how tests
    compute expected results.

    bool: alternates with the rank; unsigned: 1, 2, ...; signed: also negatives;
    floats: multiples of 0.25 (so a wrong rounding or a bytes-as-integers reduction
    shows); complex: a non-zero imaginary part.
    """
    dtype = jnp.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    base = (np.arange(n, dtype=np.int64) + 5 * rank + 1).reshape(shape)
    if dtype == np.bool_:
        return (base % 2 == 1).astype(dtype)
    if jnp.issubdtype(dtype, jnp.unsignedinteger):
        return base.astype(dtype)
    if jnp.issubdtype(dtype, jnp.signedinteger):
        return (base - 8).astype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return ((base - 8) * 0.25 + 1j * (base % 3 - 1)).astype(dtype)
    return ((base - 8) * 0.25).astype(dtype)


def factor_data(rank: int, dtype, shape=(3,)) -> np.ndarray:
    """Input for PROD: factors 1 and 2 (and -1 where the dtype is signed; i and 1+i for
    complex, so a product that multiplied real and imaginary parts separately shows), so
    a product over 4 ranks stays exact in every dtype, int8 included."""
    dtype = jnp.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if jnp.issubdtype(dtype, jnp.complexfloating):
        values = np.array([1j, 2, 1 + 1j, -1])
    elif _signed(dtype):
        values = np.array([1, 2, 1, -1])
    else:
        values = np.array([1, 2, 1, 1])
    return values[(np.arange(n) + rank) % 4].reshape(shape).astype(dtype)


def _signed(dtype) -> bool:
    return not jnp.issubdtype(dtype, jnp.unsignedinteger) and dtype != np.bool_


def input_for(op_name: str, rank: int, dtype, shape=(3,)) -> np.ndarray:
    """The input a reduction test feeds `op_name` on `rank`."""
    return factor_data(rank, dtype, shape) if op_name == "PROD" else rank_data(rank, dtype, shape)


def all_inputs(op_name: str, dtype, shape=(3,)) -> list[np.ndarray]:
    """Every rank's input to a reduction, in rank order."""
    return [input_for(op_name, r, dtype, shape) for r in range(SIZE)]


# ---------------------------------------------------------------------------------------
# Expected results
# ---------------------------------------------------------------------------------------


def _widen(a: np.ndarray) -> np.ndarray:
    """`a` in a wide type, so numpy computes the exact result (bfloat16 has no numpy
    arithmetic of its own)."""
    if a.dtype == np.bool_:
        return a
    if jnp.issubdtype(a.dtype, jnp.integer):
        return a.astype(np.int64)
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        return a.astype(np.complex128)
    return a.astype(np.float64)


def reduce_arrays(op_name: str, arrays: list[np.ndarray]) -> np.ndarray:
    """`op_name` applied elementwise across `arrays`, in the dtype of the inputs. Logical
    ops on integers give 1 or 0, as in MPI."""
    dtype = arrays[0].dtype
    result = functools.reduce(NUMPY_REDUCERS[op_name], [_widen(a) for a in arrays])
    return np.asarray(result).astype(dtype)


def expected_allreduce(op_name: str, inputs: list[np.ndarray]) -> np.ndarray:
    return reduce_arrays(op_name, inputs)


def expected_reduce(op_name: str, inputs: list[np.ndarray], root: int, rank: int = RANK):
    """The root gets the reduction; every other rank gets its own input back."""
    return reduce_arrays(op_name, inputs) if rank == root else inputs[rank]


def expected_scan(op_name: str, inputs: list[np.ndarray], rank: int = RANK) -> np.ndarray:
    """Inclusive prefix: the reduction over ranks 0..rank."""
    return reduce_arrays(op_name, inputs[: rank + 1])


def expected_exscan(op_name: str, inputs: list[np.ndarray], rank: int = RANK) -> np.ndarray:
    """Exclusive prefix: the reduction over ranks 0..rank-1; rank 0 gets zeros."""
    if rank == 0:
        return np.zeros_like(inputs[0])
    return reduce_arrays(op_name, inputs[:rank])


def alltoall_block(sender: int, receiver: int, dtype, shape=()) -> np.ndarray:
    """The block `sender` sends to `receiver` in an alltoall: unique per (sender, receiver)."""
    return rank_data(sender * SIZE + receiver, dtype, shape)


def p2p_partner(rank: int = RANK) -> int | None:
    """Ranks talk in pairs (0, 1), (2, 3), ...; with an odd SIZE the last rank has no
    partner (None)."""
    partner = rank ^ 1
    return partner if partner < SIZE else None


def partner_or_skip() -> int:
    """This rank's partner (see `p2p_partner`); the rank without one skips the test (the
    others run it: conftest.py keeps their outcomes in step)."""
    partner = p2p_partner()
    if partner is None:
        pytest.skip("no partner: the last rank of an odd number of ranks")
    return partner


# ---------------------------------------------------------------------------------------
# Running and comparing
# ---------------------------------------------------------------------------------------

MODES = ["eager", "jit"]


def call(mode: str, fn, *args):
    """`fn(*args)` run eagerly or under jax.jit; the results as numpy arrays."""
    if mode == "jit":
        fn = jax.jit(fn)
    return jax.device_get(fn(*args))


def _comparable(a: np.ndarray) -> np.ndarray:
    # float16/bfloat16 compared as float64 (exact), the rest as they are.
    if jnp.issubdtype(a.dtype, jnp.floating):
        return a.astype(np.float64)
    return a


def assert_array(got, expected, what: str = "result") -> None:
    """`got` has exactly the dtype, shape and values of `expected`."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    np.testing.assert_array_equal(_comparable(got), _comparable(expected), err_msg=what)


def allreduce_still_works() -> None:
    """The library is still usable: a fresh allreduce gives the right sum on every rank."""
    got = jax.device_get(jaxmpi.allreduce(np.int32(RANK + 1), jaxmpi.SUM))
    assert int(got) == SIZE * (SIZE + 1) // 2, f"allreduce after the error gave {got}"


@contextlib.contextmanager
def count_python_dispatches():
    """Counts the jitted calls that JAX dispatches from Python (its slow path) instead of
    from C++, in a list of one int. JAX has no public counter: this patches its private
    Python dispatch function for the duration (tests and benches only)."""
    from jax._src import pjit

    original, count = pjit._pjit_call_impl_python, [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    pjit._pjit_call_impl_python = counting
    try:
        yield count
    finally:
        pjit._pjit_call_impl_python = original


def check_raises(exc_type, phrases, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` (run to completion) raises `exc_type` whose message contains every one
    of `phrases` (case-insensitive)."""
    with pytest.raises(exc_type) as info:
        jax.block_until_ready(fn(*args, **kwargs))
    message = str(info.value).lower()
    missing = [p for p in phrases if p.lower() not in message]
    assert not missing, f"message {str(info.value)!r} lacks {missing}"


# ---------------------------------------------------------------------------------------
# Compiled programs
# ---------------------------------------------------------------------------------------


def entry_lines(compiled_text: str) -> list[str]:
    """The lines of a compiled program's entry computation (`.compile().as_text()`)."""
    return compiled_text[compiled_text.index("ENTRY") :].splitlines()


def reads_call(entry: list[str], line: str, target: str) -> bool:
    """Whether the instruction `line` of `entry` reads a custom call to `target`, directly
    or through other instructions: what orders it after that call, however XLA names the
    call's results (JAX 0.6's XLA get-tuple-element.N, newer ones after the op)."""
    defined = {}
    for other in entry:
        if " = " in other:
            defined[other.split(" = ")[0].replace("ROOT", "").strip().lstrip("%")] = other
    pending, seen = [line], set()
    while pending:
        current = pending.pop()
        if f'custom_call_target="{target}"' in current:
            return True
        operands = re.search(r" [a-z][\w-]*\(([^)]*)\)", current.split(" = ", 1)[-1])
        for name in re.findall(r"%([\w.-]+)", operands.group(1) if operands else ""):
            if name not in seen and name in defined:
                seen.add(name)
                pending.append(defined[name])
    return False
