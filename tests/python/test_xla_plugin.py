"""JAX's collectives through XLA's MPI backend, which reaches jaxmpi's MPI through the
plug-in (`jaxmpi.distributed.initialize(collectives="mpi")`): every collective XLA sends to
MPI against numpy, the collectives XLA inserts into a jit over sharded arrays, JAX's and
jaxmpi's collectives in one program, many in one jit, and the choice `collectives=` makes
(with each refusal).

Runs with test_sharded.py in its cell (JAXMPI_TEST_SHARDED=1; see sharding.py). Jobs of
their own (import and initialization orders, exit status, the debug lines proving the
traffic went through MPI, the watchdog) are in tests/jax_collectives_jobs.sh.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sharding import MESH, mesh_2d, sharded

import jaxmpi
import jaxmpi.distributed
from helpers import RANK, SIZE, assert_array, check_raises, needs_ranks
from jaxmpi._binding import jax_collectives as _jax_collectives
from jaxmpi._runtime import gpu, library

pytestmark = needs_ranks(2)

# What XLA's MPI backend reduces (MPI_INT8_T ... MPI_C_DOUBLE_COMPLEX; bool as UINT8_T,
# bfloat16 widened by XLA first). float16 it refuses itself, before any MPI call
# ("Unsupported primitive type for reduction: f16"): see the README.
REDUCED = [
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "bfloat16", "float32", "float64", "complex64", "complex128",
]  # fmt: skip


def values(rank: int, dtype: str) -> np.ndarray:
    """This rank's 5 values of `dtype`: distinct per rank and element, small enough that
    a sum over 4 ranks fits every type."""
    base = np.arange(5) + 3 * rank
    if dtype == "bool":
        return (base + rank) % 3 == 0
    if dtype.startswith("complex"):
        return (base + 1j * (base[::-1] - rank)).astype(dtype)
    if dtype == "bfloat16":
        return np.asarray(base, jnp.bfloat16)
    return np.asarray(base, dtype)


def test_jax_collectives_run_over_xla_s_mpi_backend_as_asked():
    assert _jax_collectives.chosen is not None
    assert _jax_collectives.chosen[0] == "mpi", _jax_collectives.chosen
    assert jax.config.jax_cpu_collectives_implementation == "mpi"


def test_psum_pmax_pmin_of_every_dtype_xla_reduces_in_one_program():
    """One program of 14 x 3 reductions (XLA may combine some of them into one call)."""

    def body(*xs):
        out = []
        for dtype, x in zip(REDUCED, xs):
            out.append(jax.lax.psum(x, "x"))
            if not dtype.startswith("complex"):  # XLA has no MIN/MAX on complex numbers
                out.extend([jax.lax.pmax(x, "x"), jax.lax.pmin(x, "x")])
        return tuple(out)

    got = iter(sharded(body, *(values(RANK, d) for d in REDUCED)))
    for dtype in REDUCED:
        # In float64 (exact for these values), then back to the type of JAX's result:
        # int32 for a sum of booleans, the input's otherwise.
        everyone = np.stack([np.asarray(values(r, dtype), np.complex128) for r in range(SIZE)])
        back = np.int32 if dtype == "bool" else values(0, dtype).dtype
        total = np.sum(everyone, axis=0)
        total = total if dtype.startswith("complex") else total.real
        assert_array(next(got), total.astype(back), f"psum {dtype}")
        if not dtype.startswith("complex"):
            real, kind = everyone.real, values(0, dtype).dtype
            assert_array(next(got), np.max(real, axis=0).astype(kind), f"pmax {dtype}")
            assert_array(next(got), np.min(real, axis=0).astype(kind), f"pmin {dtype}")


def nan_values(rank: int, dtype: str, holder: int) -> np.ndarray:
    """`values`, with +inf and -inf in the last two elements, and NaN in the last three
    on rank `holder`."""
    x = values(rank, dtype)
    x[3:] = np.inf, -np.inf
    if rank == holder:
        x[2:] = np.nan
    return x


def test_pmax_and_pmin_give_nan_whichever_rank_holds_it():
    """As XLA on one device: a NaN on any rank makes pmax and pmin NaN. XLA's MPI backend
    reduces with MPI_MAX/MPI_MIN, which keep or drop a NaN by which rank holds it; the
    plug-in hands them to jaxmpi's own ops."""
    floats = ("bfloat16", "float32", "float64")

    def body(*xs):
        return tuple(f(x, "x") for x in xs for f in (jax.lax.pmax, jax.lax.pmin))

    for holder in range(SIZE):
        got = iter(sharded(body, *(nan_values(RANK, d, holder) for d in floats)))
        for dtype in floats:
            everyone = np.stack(
                [nan_values(r, dtype, holder).astype(np.float64) for r in range(SIZE)]
            )
            for name, reducer in (("pmax", np.max), ("pmin", np.min)):
                expected = reducer(everyone, axis=0).astype(values(0, dtype).dtype)
                assert np.isnan(expected[2:]).all(), expected
                assert_array(next(got), expected, f"{name} {dtype}, NaN on rank {holder}")


def test_all_gather_psum_scatter_all_to_all_and_ppermute():
    table = np.arange(SIZE * 4, dtype=np.float32).reshape(SIZE, 4)
    mine = table[RANK] + 100 * RANK
    ring = [(r, (r + 1) % SIZE) for r in range(SIZE)]

    def body(x, blocks):
        return (
            jax.lax.all_gather(x, "x"),
            jax.lax.psum_scatter(blocks, "x", scatter_dimension=0, tiled=True),
            jax.lax.all_to_all(blocks, "x", 0, 0, tiled=True),
            jax.lax.ppermute(x, "x", ring),
            # Only rank 0 sends, to rank 1: the others receive nothing, which is zeros.
            jax.lax.ppermute(x, "x", [(0, 1)]),
        )

    # Rank r's blocks: row s is what it has for rank s.
    blocks = table + 1000 * RANK
    gathered, scattered, exchanged, shifted, one_way = sharded(body, mine, blocks)
    assert_array(gathered, np.stack([table[r] + 100 * r for r in range(SIZE)]))
    assert_array(scattered, (SIZE * table[RANK] + 1000 * sum(range(SIZE)))[None])
    assert_array(exchanged, np.stack([table[RANK] + 1000 * s for s in range(SIZE)]))
    assert_array(shifted, table[(RANK - 1) % SIZE] + 100 * ((RANK - 1) % SIZE))
    assert_array(one_way, table[0] if RANK == 1 else np.zeros(4, np.float32))


def test_large_messages():
    """4 Mi float32 (16 MiB) through psum, all_gather and ppermute."""
    n = 4 * 1024 * 1024
    x = np.full(n, RANK + 1, np.float32)

    def body(v):
        ring = [(r, (r + 1) % SIZE) for r in range(SIZE)]
        return (
            jax.lax.psum(v, "x")[::4096],
            jax.lax.all_gather(v[:8], "x"),
            jax.lax.ppermute(v, "x", ring)[::4096],
        )

    total, gathered, shifted = sharded(body, x)
    assert_array(total, np.full(n // 4096, SIZE * (SIZE + 1) / 2, np.float32))
    assert_array(gathered, np.repeat(np.arange(1, SIZE + 1, dtype=np.float32), 8).reshape(SIZE, 8))
    assert_array(shifted, np.full(n // 4096, (RANK - 1) % SIZE + 1, np.float32))


@needs_ranks(4)
def test_one_axis_collectives_of_a_2x2_mesh_split_the_world():
    """Ranks (y, x) = (r // 2, r % 2): a psum over "x" pairs ranks 0+1 and 2+3, over "y"
    0+2 and 1+3; XLA splits MPI_COMM_WORLD once per group of each."""
    if SIZE != 4:
        pytest.skip("a 2 x 2 mesh needs 4 ranks")
    mesh = mesh_2d(2, 2)
    y, x = divmod(RANK, 2)

    def body(v):
        return (
            jax.lax.psum(v, "x"),
            jax.lax.psum(v, "y"),
            jax.lax.all_gather(v, "y"),
            jax.lax.ppermute(v, "x", [(0, 1), (1, 0)]),
            jax.lax.psum(v, ("y", "x")),
        )

    value = lambda r: np.arange(3.0) + 10 * r  # noqa: E731
    over_x, over_y, gathered, swapped, everyone = sharded(body, value(RANK), mesh=mesh)
    assert_array(over_x, value(2 * y) + value(2 * y + 1))
    assert_array(over_y, value(x) + value(2 + x))
    assert_array(gathered, np.stack([value(x), value(2 + x)]))
    assert_array(swapped, value(2 * y + (1 - x)))
    assert_array(everyone, sum(value(r) for r in range(4)))


def test_a_collective_xla_inserts_into_a_jit_over_sharded_arrays():
    """A matmul whose contraction axis is split over the processes: no collective written
    anywhere, XLA adds the all-reduce (checked in the compiled program)."""
    k = 4 * SIZE
    # Whole numbers: every partial sum is exact, whatever order XLA adds them in.
    a_full = np.arange(3 * k, dtype=np.float64).reshape(3, k) - 5
    b_full = np.arange(k * 2, dtype=np.float64).reshape(k, 2) % 7
    mine = slice(4 * RANK, 4 * RANK + 4)
    a = jax.make_array_from_process_local_data(NamedSharding(MESH, P(None, "x")), a_full[:, mine])
    b = jax.make_array_from_process_local_data(NamedSharding(MESH, P("x", None)), b_full[mine])
    replicated = NamedSharding(MESH, P())
    matmul = jax.jit(jnp.matmul, out_shardings=replicated)
    assert "all-reduce" in matmul.lower(a, b).compile().as_text()
    got = matmul(a, b)
    assert_array(got.addressable_data(0), a_full @ b_full)


def test_jax_and_jaxmpi_collectives_in_one_program():
    def body(x):
        ours = jaxmpi.allreduce(x, jaxmpi.SUM)
        theirs = jax.lax.psum(x, "x")
        halo = jaxmpi.sendrecv(x, x, source=(RANK - 1) % SIZE, dest=(RANK + 1) % SIZE)
        shifted = jax.lax.ppermute(x, "x", [(r, (r + 1) % SIZE) for r in range(SIZE)])
        return ours - theirs, halo - shifted, jaxmpi.allgather(theirs)

    x = np.arange(3.0) + 10 * RANK
    zero, also_zero, gathered = sharded(body, x)
    total = sum(np.arange(3.0) + 10 * r for r in range(SIZE))
    assert_array(zero, np.zeros(3))
    assert_array(also_zero, np.zeros(3))
    assert_array(gathered, np.stack([total] * SIZE))


def test_forty_collectives_in_one_jit():
    """A chain of 40 all-reduces XLA cannot combine (each needs the one before), plus
    gathers and permutes: XLA creates its communicators on its worker threads, whose
    thread-main check jaxmpi's plug-in answers under MPI_THREAD_MULTIPLE."""

    def body(x):
        for i in range(40):
            x = jax.lax.psum(x, "x") / SIZE + i
        ring = [(r, (r + 1) % SIZE) for r in range(SIZE)]
        return x, jax.lax.all_gather(jax.lax.ppermute(x, "x", ring), "x")

    chain, gathered = sharded(body, np.arange(3.0) + RANK)
    expected = np.arange(3.0) + (SIZE - 1) / 2 + sum(range(40))  # the mean, then + i each
    assert_array(chain, expected)
    assert_array(gathered, np.stack([expected] * SIZE))


def test_collectives_take_the_choices_refusals():
    check_raises(ValueError, ["collectives='nccl'", "'auto'"], _jax_collectives.choose, "nccl")
    check_raises(
        RuntimeError,
        ["collectives='mpi'", "one CPU device per process", "would have 2"],
        _jax_collectives.choose,
        "mpi",
        [0, 1],
    )
    route, why = _jax_collectives.choose("auto", [0, 1])
    # Two devices per process: jaxmpi's pass where JAX has the hook, else gloo.
    if _jax_collectives.hlo_pass.available():
        assert route == "jaxmpi" and "the fastest route that works" in why, why
        assert _jax_collectives.choose("auto")[0] == "jaxmpi"
    else:
        assert route == "gloo" and "one CPU device per process" in why, why
        assert _jax_collectives.choose("auto")[0] == "mpi"
        check_raises(
            RuntimeError, ["collectives='jaxmpi'", "no hook"], _jax_collectives.choose, "jaxmpi"
        )
    assert _jax_collectives.choose("gloo")[0] == "gloo"
    assert _jax_collectives.choose("mpi")[0] == "mpi"


def test_a_jaxlib_without_mpi_collectives_is_refused(monkeypatch):
    monkeypatch.setattr(_jax_collectives.jax_shim, "jaxlib_has_mpi_collectives", lambda: False)
    check_raises(
        RuntimeError, ["cannot run XLA's collectives over MPI"], _jax_collectives.choose, "mpi"
    )


def test_why_jaxlib_did_not_load_the_plug_in(monkeypatch, tmp_path):
    """What `collectives="mpi"` says where jaxlib did not load the plug-in, for each cause."""
    import _jaxmpi_startup as hook

    monkeypatch.delenv("MPITRAMPOLINE_LIB", raising=False)
    assert (
        "MPITRAMPOLINE_LIB was not set when jax was imported"
        in _jax_collectives._plugin_not_loaded()
    )
    monkeypatch.setattr(hook, "checked_jaxlib", lambda: False)
    newer = _jax_collectives._plugin_not_loaded()
    assert "newer than the newest" in newer and "set MPITRAMPOLINE_LIB=" in newer, newer
    monkeypatch.setenv("MPITRAMPOLINE_LIB", str(tmp_path / "libmpiwrapper.so"))
    assert "gives jaxlib another MPI library" in _jax_collectives._plugin_not_loaded()


def test_a_gpu_process_is_refused(monkeypatch):
    """As a process whose jaxlib has CUDA and whose driver sees a GPU sees it (no GPU
    needed: only the choice is made). Without a GPU, JAX runs on the CPU, and XLA's MPI
    backend serves it (test_gpu_startup.py runs with JAX's CUDA plugin and no GPU)."""
    for found, value in (("plugin", True), ("driver", True), ("devices", 1)):
        monkeypatch.setitem(gpu.cuda, found, value)
    platforms = jax.config.jax_platforms  # read when JAX starts: changing it does nothing
    jax.config.update("jax_platforms", "cuda,cpu")
    try:
        check_raises(RuntimeError, ["on GPUs", "NCCL"], _jax_collectives.choose, "mpi")
    finally:
        jax.config.update("jax_platforms", platforms)


def test_a_thread_level_below_multiple_is_refused(monkeypatch):
    monkeypatch.setitem(library.info, "thread_level", "MPI_THREAD_SERIALIZED")
    check_raises(
        RuntimeError, ["MPI_THREAD_SERIALIZED", "worker threads"], _jax_collectives.choose, "mpi"
    )


def test_a_function_xla_never_calls_fails_naming_itself(capfd):
    """Called for real through the symbol jaxlib would resolve: an error code, the message
    on stderr and from MPI_Error_string, no crash."""
    import ctypes

    module = ctypes.CDLL(_jax_collectives.plugin_path())
    code = module.MPIABI_Bsend(None, 0, 0, 0, 0, 0)
    assert code == ctypes.c_int.in_dll(module, "MPIABI_ERR_UNSUPPORTED_OPERATION").value
    text = ctypes.create_string_buffer(1024)
    length = ctypes.c_int()
    assert module.MPIABI_Error_string(code, text, ctypes.byref(length)) == 0
    assert b"MPI_Bsend was called through jaxlib's MPI interface" in text.value[: length.value]
    assert "MPI_Bsend was called" in capfd.readouterr().err


def test_the_startup_hook_sets_mpitrampoline_lib_only_where_it_can_work(monkeypatch, tmp_path):
    import _jaxmpi_startup as hook

    from jaxmpi._runtime import support as _support

    newest = _support.release(_support.NEWEST_TESTED)[:2]
    assert hook.CHECKED_JAXLIB[1] == newest, "keep the hook's newest jaxlib in step"
    assert hook.plugin() == _jax_collectives.plugin_path()
    assert hook.checked_jaxlib()
    for version, checked in [("0.12.9", True), ("0.13.0", False), ("0.5.3", False)]:
        (tmp_path / "jaxlib").mkdir(exist_ok=True)
        (tmp_path / "jaxlib" / "__init__.py").write_text("")
        (tmp_path / "jaxlib" / "version.py").write_text(f'_version: str = "{version}"\n')
        assert hook.checked_jaxlib(beside=str(tmp_path)) is checked, version
    # Set already (the user's plug-in), or too late (jax imported): left alone.
    monkeypatch.setenv("MPITRAMPOLINE_LIB", "/elsewhere/libmpiwrapper.so")
    hook.install()
    assert os.environ["MPITRAMPOLINE_LIB"] == "/elsewhere/libmpiwrapper.so"
    monkeypatch.delenv("MPITRAMPOLINE_LIB")
    hook.install()
    assert "MPITRAMPOLINE_LIB" not in os.environ


def test_info_says_which_and_why():
    from jaxmpi.__main__ import info_lines

    line = next(line for line in info_lines() if line.startswith("JAX collectives"))
    assert "mpi: asked for: jaxlib sends XLA's MPI calls" in line, line
