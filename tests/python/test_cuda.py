"""Every op on device arrays under jit, checked against values computed with numpy, and
against the GPU counters: each op must have gone the way the run asked for (staged, or
direct to a CUDA-aware MPI; direct runs stage reductions computed on the host, and in-place
sendrecvs, which MPI_Sendrecv_replace copies through host memory). The data
differ per test and per rank, and receives land in NaN-filled templates, so a receive
that writes nothing, or writes what an earlier test left, fails.

Covered: tail chunks ((3 << 20) + 5 elements: three 4 MiB staging chunks and a remainder),
float32/float64/complex64/bfloat16/float16/bool/int64, every op family (the reductions
with exscan and reduce_scatter, the movers, the v-ops, barrier), roots other than 0,
status and short messages, in-place sendrecv, grad/vmap/fori_loop on device arrays, an MPI
error followed by a good call, pinned allocations flat over repeated calls; and beside the
ops: JAX's own collectives over MPI (refused on GPUs: XLA runs them over NCCL), jaxlib
loading jaxmpi's MPI plug-in beside its CUDA plugin, an mpi4jax 0.7 token program.

Run at 2 ranks sharing one GPU by ci/gpu_run.sh; see device_helpers.py for the CPU stand-in
of its dry run and for JAXMPI_TEST_EXPECT."""

from __future__ import annotations

import os
import re
import time

import _jaxmpi_startup
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from device_helpers import (
    DEVICE,
    TAIL,
    assert_same,
    chunks,
    expected_mode,
    gpu_only,
    needs_device,
    on_device,
    pattern,
    poisoned,
    run,
    went,
)
from jax import lax
from test_mpi4jax_name import presenting  # noqa: F401  (a fixture)

import jaxmpi
from helpers import MPI, RANK, SIZE, check_raises, needs_mpi4py, needs_ranks, partner_or_skip
from jaxmpi import COMM_WORLD as comm
from jaxmpi import _native
from jaxmpi._binding import jax_collectives as _jax_collectives
from jaxmpi._binding.primitives import SIGNATURES

pytestmark = [needs_device, needs_ranks(2)]

LEFT, RIGHT = (RANK - 1) % SIZE, (RANK + 1) % SIZE
LAST = SIZE - 1
HALF = ("float16", "bfloat16")


def host_code(dtype, op: str) -> bool:
    """Whether jaxmpi reduces with its own MPI op, host code that stages device buffers:
    float16/bfloat16, and MIN/MAX on every float type (they propagate NaN)."""
    return dtype.name in HALF or (op in ("MIN", "MAX") and jnp.issubdtype(dtype, jnp.floating))


NUMPY_OPS = {"SUM": np.add, "MAX": np.maximum, "LOR": np.logical_or}


def fold(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """`op` over the arrays, in the dtype they have (16-bit floats reduced in float64:
    exact for these patterns, as jaxmpi's own reductions are)."""
    dtype = arrays[0].dtype
    wide = [a.astype(np.float64) if dtype.name in HALF else a for a in arrays]
    out = wide[0]
    for a in wide[1:]:
        out = NUMPY_OPS[op](out, a)
    return out.astype(dtype)


def everyone(n: int, dtype, salt: int) -> list[np.ndarray]:
    return [pattern(n, dtype, salt, rank) for rank in range(SIZE)]


def test_the_run_got_the_mode_it_asked_for():
    """JAXMPI_CUDA_AWARE as the run set it decided the mode, `info` says so, the rank's GPU
    was made current before MPI_Init, and the process has one libcuda: XLA's."""
    mode = expected_mode()
    library, cuda = jaxmpi._runtime.library.info, jaxmpi._runtime.gpu.cuda
    asked = os.environ.get("JAXMPI_CUDA_AWARE", "").strip()
    if asked in ("0", "1"):
        assert library["cuda_aware"] == (asked == "1"), library["cuda_aware_reason"]
        assert not library["cuda_aware_checks_buffers"]
    if mode == "host":  # the CPU stands in: no device path at all
        assert cuda["mode"] is None and cuda["unused"], cuda
        assert not _native.start_verdicts()
        return
    # Every rank can run ops on the GPU: collectives agree first that all can start them.
    assert _native.start_verdicts()
    assert library["cuda_aware"] == (mode == "direct"), library["cuda_aware_reason"]
    assert cuda["mode"].startswith(mode), cuda["mode"]
    assert (cuda["rank_gpu"], cuda["when"]) == (0, "before MPI_Init"), cuda
    # Asked now, after JAX's client and the MPI's CUDA support started: still one.
    driver = _native.cuda_info()
    assert driver["libcudas_mapped"] == [driver["libcuda"]], driver


# --- Reductions ----------------------------------------------------------------------------

ALLREDUCE = [
    ("float32", 1, "SUM"),
    ("float32", 1000, "SUM"),
    ("float32", TAIL, "SUM"),
    ("float64", 1000, "SUM"),
    ("float32", 1000, "MAX"),
    ("float64", TAIL // 2, "SUM"),
    ("complex64", TAIL // 2, "SUM"),
    ("bfloat16", 1000, "SUM"),
    ("bfloat16", TAIL, "SUM"),
    ("float16", 1000, "MAX"),
    ("float16", TAIL, "SUM"),
    ("int64", 1000, "MAX"),
    ("int64", TAIL // 2, "SUM"),
    ("bool", 1000, "LOR"),
]


@pytest.mark.parametrize(("dtype", "n", "op"), ALLREDUCE)
def test_allreduce(dtype, n, op):
    dtype = jnp.dtype(dtype)
    data = everyone(n, dtype, salt=1)
    with went(host_code=host_code(dtype, op), staged_chunks=chunks(n, dtype)):
        got = run(lambda a: jaxmpi.allreduce(a, getattr(jaxmpi, op)), data[RANK])
    assert_same(got, fold(op, data))


@needs_mpi4py
def test_allreduce_with_a_user_op_is_computed_on_the_host():
    def plus_one(inbuf, inoutbuf, datatype):
        a = np.frombuffer(inbuf, np.float32)
        b = np.frombuffer(inoutbuf, np.float32)
        b[:] = a + b + 1

    op = MPI.Op.Create(plus_one, commute=True)
    data = everyone(1000, np.float32, salt=2)
    try:
        with went(host_code=True, staged_chunks=1):
            got = run(lambda a: jaxmpi.allreduce(a, op), data[RANK])
    finally:
        jax.effects_barrier()
        op.Free()
    assert_same(got, sum(data) + (SIZE - 1))


@pytest.mark.parametrize("root", [0, LAST])
@pytest.mark.parametrize(("dtype", "n"), [("float32", TAIL), ("bfloat16", 1000)])
def test_reduce(dtype, n, root):
    dtype = jnp.dtype(dtype)
    data = everyone(n, dtype, salt=3)
    with went(host_code=dtype.name in HALF):
        got = run(lambda a: jaxmpi.reduce(a, jaxmpi.SUM, root), data[RANK])
    assert_same(got, fold("SUM", data) if RANK == root else data[RANK])


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_scan_and_exscan(dtype):
    data = everyone(1000, dtype, salt=4)
    with went(ops=2):
        inclusive, exclusive = run(
            lambda a: (jaxmpi.scan(a, jaxmpi.SUM), jaxmpi.exscan(a, jaxmpi.SUM)), data[RANK]
        )
    assert_same(inclusive, fold("SUM", data[: RANK + 1]))
    before = fold("SUM", data[:RANK]) if RANK else np.zeros(1000, dtype)
    assert_same(exclusive, before)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_reduce_scatter(dtype):
    dtype = jnp.dtype(dtype)
    data = [pattern(SIZE * 1000, dtype, 5, r).reshape(SIZE, 1000) for r in range(SIZE)]
    with went(host_code=dtype.name in HALF):
        got = run(lambda a: jaxmpi.reduce_scatter(a, jaxmpi.SUM), data[RANK])
    assert_same(got, fold("SUM", [d[RANK] for d in data]))


# --- Moving data ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "n", "root"),
    [("float32", TAIL, LAST), ("complex64", 1000, 0), ("bool", 1000, LAST), ("int64", 7, 0)],
)
def test_bcast(dtype, n, root):
    data = everyone(n, dtype, salt=6)
    with went(staged_chunks=chunks(n, dtype)):
        got = run(lambda a: jaxmpi.bcast(a, root), data[RANK])
    assert_same(got, data[root])


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_gather_and_allgather(dtype):
    data = everyone(1000, dtype, salt=7)
    with went(ops=2):
        gathered, everywhere = run(
            lambda a: (jaxmpi.gather(a, LAST), jaxmpi.allgather(a)), data[RANK]
        )
    assert_same(gathered, np.stack(data) if RANK == LAST else data[RANK])
    assert_same(everywhere, np.stack(data))


@pytest.mark.parametrize("dtype", ["float64", "bool"])
def test_scatter_and_alltoall(dtype):
    rows = [pattern(SIZE * 100, dtype, 8, r).reshape(SIZE, 100) for r in range(SIZE)]
    template = poisoned(100, dtype)
    root = LAST
    with went(ops=2):
        mine = run(lambda a: jaxmpi.scatter(a, root), rows[root] if RANK == root else template)
        swapped = run(lambda a: jaxmpi.alltoall(a), rows[RANK])
    assert_same(mine, rows[root][RANK])
    assert_same(swapped, np.stack([rows[r][RANK] for r in range(SIZE)]))


def test_the_v_ops_with_uneven_counts():
    counts = tuple(r + 1 for r in range(SIZE))  # rank r gives r + 1 rows of 3
    rows = [pattern(3 * (r + 1), np.float32, 9, r).reshape(r + 1, 3) for r in range(SIZE)]
    stacked = np.concatenate(rows)

    def movers(a):
        everywhere = jaxmpi.allgatherv(a, counts)
        # Root 0 scatters the stack back; the others pass a template of their block.
        back = jaxmpi.scatterv(everywhere if RANK == 0 else a, counts, 0)
        return jaxmpi.gatherv(a, counts, LAST), everywhere, back

    with went(ops=3):
        gathered, everywhere, back = run(movers, rows[RANK])
    assert_same(gathered, stacked if RANK == LAST else rows[RANK])
    assert_same(everywhere, stacked)
    assert_same(back, rows[RANK])
    # alltoallv: rank s sends s + d + 1 rows to rank d.
    send_counts = tuple(RANK + d + 1 for d in range(SIZE))
    recv_counts = tuple(s + RANK + 1 for s in range(SIZE))
    outgoing = pattern(sum(send_counts) * 2, np.int64, 10).reshape(-1, 2)
    with went():
        got = run(lambda a: jaxmpi.alltoallv(a, send_counts, recv_counts), outgoing)
    expected = []
    for s in range(SIZE):
        theirs = pattern(sum(s + d + 1 for d in range(SIZE)) * 2, np.int64, 10, s).reshape(-1, 2)
        start = sum(s + d + 1 for d in range(RANK))
        expected.append(theirs[start : start + s + RANK + 1])
    assert_same(got, np.concatenate(expected))


def test_barrier_waits_for_the_last_rank():
    late = 0.3 * RANK  # rank r reaches the barrier r * 0.3 s after the others
    step = jax.jit(lambda x: (jaxmpi.barrier(), x + 1)[1])
    x = on_device(np.zeros(4, np.float32))
    step(x).block_until_ready()  # compiled and warmed
    comm.Barrier()
    start = time.monotonic()
    time.sleep(late)
    with went(ops=0):
        out = step(x).block_until_ready()
    waited = time.monotonic() - start
    assert_same(out, np.ones(4, np.float32))
    assert waited >= 0.3 * LAST - 0.05, f"left the barrier after {waited:.3f} s"


# --- Point to point ------------------------------------------------------------------------

ON_GPU = DEVICE is not None and DEVICE.platform == "gpu"
# A few ms of device work per delay on a GPU; a token amount where the CPU stands in.
WORK, DELAY = (1024, 200) if ON_GPU else (64, 5)
busy = jax.jit(lambda m, reps: lax.fori_loop(0, reps, lambda _, a: jnp.tanh(a @ m), m))


def test_send_and_recv_after_real_delays():
    """The receiver's device is busy before its receive is posted (same stream: the
    receive waits for it), the sender's before its send; neither may lose or stale the
    message, received into a NaN template."""
    partner = partner_or_skip()
    m = on_device(np.eye(WORK, dtype=np.float32) * 0.5)
    sent = pattern(TAIL, np.float32, 11, rank=partner if RANK % 2 else RANK)
    send = jax.jit(lambda a, k: jaxmpi.send(a * k, partner, tag=31))
    recv = jax.jit(lambda t: jaxmpi.recv(t, partner, tag=31))
    for k in (1.0, 2.0, 3.0):
        busy(m, DELAY)  # not waited for: the op after it on the stream must be
        with went():
            if RANK % 2 == 0:
                jax.block_until_ready(send(on_device(sent), np.float32(k)))
            else:
                got = np.asarray(recv(on_device(poisoned(TAIL, np.float32))))
        if RANK % 2:
            assert_same(got, sent * np.float32(k))


@needs_mpi4py
def test_a_short_message_fills_its_status_and_zeros_the_rest():
    partner = partner_or_skip()
    status = MPI.Status()
    message = pattern(5, np.float64, 12, rank=partner)
    with went():
        if RANK % 2 == 0:
            run(lambda a: jaxmpi.send(a, partner, tag=32), pattern(5, np.float64, 12))
        else:
            got = run(lambda t: jaxmpi.recv(t, tag=32, status=status), poisoned(8, np.float64))
    if RANK % 2:
        assert_same(got, np.concatenate([message, np.zeros(3)]))
        assert (status.Get_source(), status.Get_tag()) == (partner, 32)
        assert status.Get_count(MPI.DOUBLE) == 5


@pytest.mark.parametrize("dtype", ["float32", "complex64", "bfloat16"])
def test_sendrecv_around_the_ring_and_in_place(dtype):
    data = everyone(TAIL // 4, dtype, salt=13)
    template = poisoned(TAIL // 4, dtype)
    with went(ops=2, in_place=1):
        got, swapped = run(
            lambda a, t: (
                jaxmpi.sendrecv(a, t, source=LEFT, dest=RIGHT),
                jaxmpi.sendrecv(a, a, source=RIGHT, dest=LEFT),  # in place
            ),
            data[RANK],
            template,
        )
    assert_same(got, data[LEFT])
    assert_same(swapped, data[RIGHT])


def unreceived_message_from(on, partner: int, tag: int, seconds: float = 10.0) -> bool:
    """Whether a message from `partner` with `tag` arrives on mpi4py communicator `on`
    and waits there, unreceived."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if on.Iprobe(source=partner, tag=tag):
            return True
        time.sleep(0.05)
    return False


def test_an_mpi_error_then_a_good_call():
    """A receive smaller than its message fails on the receiver (MPI_ERR_TRUNCATE), as an
    exception; the next exchange still works on every rank.

    Under ordered dispatch (the GPU default) the error may poison JAX's runtime token: the
    next program then fails on that rank without calling MPI, while its partner waits in
    the exchange. So that this fails the test instead of hanging the job, every rank makes
    the exchange whatever happened before it, and a rank whose exchange failed with its
    partner's message still unreceived answers that message from the host, then fails.
    (ci/gpu_run.sh runs this test in a job of its own, under JAXMPI_TIMEOUT, all the same.)"""
    partner = partner_or_skip()
    failed_before = None
    try:
        if RANK % 2 == 0:
            with went():
                run(lambda a: jaxmpi.send(a, partner, tag=33), pattern(8, np.float32, 14))
        else:
            recv = jax.jit(lambda t: jaxmpi.recv(t, partner, tag=33))
            check_raises(RuntimeError, ["truncat"], recv, on_device(poisoned(4, np.float32)))
    except (Exception, pytest.fail.Exception) as err:
        failed_before = err
    data = everyone(100, np.float32, salt=15)
    on = MPI.COMM_WORLD if MPI is not None else None  # a communicator the host can answer on

    def exchange(a):
        return jaxmpi.sendrecv(a, a * 0, source=partner, dest=partner, comm=on)

    try:
        with went():
            got = run(exchange, data[RANK])
    except Exception:
        if on is not None and unreceived_message_from(on, partner, tag=0):  # sendrecv's sendtag
            on.Sendrecv(data[RANK], partner, recvbuf=poisoned(100, np.float32), source=partner)
        raise
    if failed_before is not None:
        raise failed_before
    assert_same(got, data[partner])


# --- Transformations on device arrays ------------------------------------------------------


def test_grad_through_allreduce_and_sendrecv():
    def loss(x):
        total = jaxmpi.allreduce(x * x, jaxmpi.SUM)
        passed = jaxmpi.sendrecv(x, x, source=LEFT, dest=RIGHT)
        return jnp.sum(total) + jnp.sum(passed * jnp.arange(x.size, dtype=x.dtype))

    x = pattern(1000, np.float32, 16)
    # The forward sendrecv is in place; its transpose, sending the cotangent back, is not.
    with went(ops=3, in_place=1):
        g = run(jax.grad(loss), x)
    # allreduce-SUM transposes to the identity (mpi4jax's convention): 2x from the first
    # term; the ring term's cotangent, the weights, comes back from the right neighbour.
    assert_same(g, 2 * x + np.arange(1000, dtype=np.float32))


def test_vmap_of_allreduce_is_one_call_for_the_batch():
    data = [pattern(4 * 1000, np.float32, 17, r).reshape(4, 1000) for r in range(SIZE)]
    with went(ops=1, staged_chunks=1):
        got = run(jax.vmap(lambda row: jaxmpi.allreduce(row, jaxmpi.SUM)), data[RANK])
    assert_same(got, fold("SUM", data))


def test_fori_loop_of_exchanges():
    """Each round passes the array on to the right, plus one: after 5 rounds rank r holds
    rank r - 5's start plus 5."""
    rounds = 5
    data = everyone(1000, np.float32, salt=18)
    with went(ops=rounds):
        got = run(
            lambda a: lax.fori_loop(
                0, rounds, lambda _, b: jaxmpi.sendrecv(b + 1, b, source=LEFT, dest=RIGHT), a
            ),
            data[RANK],
        )
    assert_same(got, data[(RANK - rounds) % SIZE] + rounds)


def test_pinned_allocations_stay_flat_over_repeated_calls():
    data = everyone(TAIL, np.float32, salt=19)
    step = jax.jit(lambda a: (jaxmpi.allreduce(a, jaxmpi.SUM), jaxmpi.sendrecv(a, a, LEFT, RIGHT)))
    x = on_device(data[RANK])
    jax.block_until_ready(step(x))
    first = _native.gpu_counters()
    for _ in range(10):
        jax.block_until_ready(step(x))
    after = _native.gpu_counters()
    assert after["pinned_allocations"] == first["pinned_allocations"], (first, after)
    assert after["pinned_bytes"] == first["pinned_bytes"], (first, after)
    if expected_mode() == "staged":
        assert after["pinned_allocations"] > 0 and after["staged"] - first["staged"] == 20
    if expected_mode() == "direct":  # the sendrecv, in place, staged
        assert after["direct"] - first["direct"] == 10
        assert after["staged_in_place"] - first["staged_in_place"] == 10


# --- Beside the ops ------------------------------------------------------------------------


@gpu_only
def test_non_blocking_ops_refuse_gpu_arrays_at_trace_time():
    """Not built for GPU memory yet: a clear refusal naming the op, before any MPI."""
    x = on_device(np.ones(8, np.float32))

    def exchange(a):
        request = jaxmpi.irecv(a, source=LEFT, comm=comm)
        return jaxmpi.wait(request)

    refusal = re.escape(f"jaxmpi.irecv: {SIGNATURES['irecv']['host_only']}")
    with pytest.raises(NotImplementedError, match=refusal):
        jax.jit(exchange)(x)


@gpu_only
def test_jax_collectives_over_mpi_are_refused_on_gpus():
    """Before anything starts: no jax.distributed, no MPI call."""
    with pytest.raises(RuntimeError, match="on GPUs, whose collectives XLA runs over NCCL"):
        jaxmpi.distributed.initialize(collectives="mpi")
    implementation, why = _jax_collectives.choose("auto")
    assert (implementation, "NCCL" in why) == ("gloo", True), why


def test_jaxlib_loads_the_plugin_beside_its_cuda_plugin():
    """As from an installed wheel: the startup hook ran at this process's start (ci/gpu_run.sh
    processes the wheel's .pth), and jaxlib either loaded jaxmpi's MPI plug-in at `import jax`
    -- the GPU ops above ran with it loaded -- or is a release the plug-in was not checked
    against, where the hook must leave MPITRAMPOLINE_LIB unset."""
    if _jaxmpi_startup.checked_jaxlib():
        loaded = os.path.realpath(os.environ.get("MPITRAMPOLINE_LIB", ""))
        assert loaded == os.path.realpath(_jax_collectives.plugin_path())
        assert _native.xla_plugin_loaded()
    else:
        assert "MPITRAMPOLINE_LIB" not in os.environ


def test_an_mpi4jax_0_7_token_program_on_the_device(presenting):  # noqa: F811
    mpi4jax = presenting("0.7.2")

    def step(a):
        token = jax.lax.create_token()
        total, token = mpi4jax.allreduce(a, op=jaxmpi.SUM, comm=comm, token=token)
        swapped, token = mpi4jax.sendrecv(a, a, LEFT, RIGHT, comm=comm, token=token)
        token = mpi4jax.barrier(comm=comm, token=token)
        return total, swapped

    data = everyone(1000, np.float32, salt=20)
    with went(ops=2):
        total, swapped = run(step, data[RANK])
    assert_same(total, fold("SUM", data))
    assert_same(swapped, data[LEFT])
