"""Non-blocking point to point: isend, irecv, wait, waitall and after, eager and under jit.

Ranks talk in pairs (0, 1), (2, 3), ... (`partner_or_skip`); with an odd number of ranks
the last one sits these tests out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import (
    ALL_DTYPES,
    MODES,
    RANK,
    assert_array,
    call,
    check_raises,
    entry_lines,
    needs_errors_return,
    needs_mpi4py,
    needs_ranks,
    partner_or_skip,
    rank_data,
    reads_call,
)
from jaxmpi import _native

# The cells leave the progress thread to jaxmpi (none on 2 cores at 2 ranks):
# run again with it forced.
pytestmark = pytest.mark.progress_thread

# 1 MiB of float32: larger than every eager-protocol limit (the transfer needs the
# receiver, and progress, to complete).
BIG = 1 << 18


def exchange(x, partner, tag=0):
    """Both directions at once: the received array."""
    rs = jaxmpi.isend(x, partner, tag=tag)
    rr = jaxmpi.irecv(x, partner, tag=tag)
    received, sent = jaxmpi.waitall([rr, rs])
    assert sent is None
    return received


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_exchange_moves_every_dtype(mode, dtype):
    partner = partner_or_skip()
    x = jnp.asarray(rank_data(RANK, dtype, (2, 3)))
    got = call(mode, lambda x: exchange(x, partner), x)
    assert_array(got, rank_data(partner, dtype, (2, 3)))


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_many_large_requests_in_flight_complete_in_any_wait_order(mode):
    """Eight 1 MiB messages each way, all started before any wait; the odd rank waits in
    reverse order, and its receives are posted before its sends."""
    partner = partner_or_skip()
    count = 8

    def many(x):
        sends = [jaxmpi.isend(x + k, partner, tag=k) for k in range(count)]
        recvs = [jaxmpi.irecv(x, partner, tag=k) for k in range(count)]
        order = list(range(count)) if RANK % 2 == 0 else list(reversed(range(count)))
        got = {k: jaxmpi.wait(recvs[k]) for k in order}
        jaxmpi.waitall(sends)
        return [got[k] for k in range(count)]

    x = jnp.full(BIG, float(RANK), jnp.float32)
    got = call(mode, many, x)
    for k, array in enumerate(got):
        assert_array(array, np.full(BIG, partner + k, np.float32), f"message {k}")


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_rank_asymmetric_one_way_traffic(mode):
    """The even rank only sends (three tags), the odd rank only receives them, in another
    order than they were sent."""
    partner = partner_or_skip()
    x = jnp.arange(5.0)

    def one_way(x):
        if RANK % 2 == 0:
            requests = [jaxmpi.isend(x * k, partner, tag=k) for k in range(3)]
            jaxmpi.waitall(requests)
            return []
        requests = [jaxmpi.irecv(x, partner, tag=k) for k in (2, 0, 1)]
        return jaxmpi.waitall(requests)

    got = call(mode, one_way, x)
    if RANK % 2 == 1:
        for k, array in zip((2, 0, 1), got, strict=True):
            assert_array(array, np.asarray(x) * k)


@pytest.mark.parametrize("mode", MODES)
def test_proc_null_moves_nothing_and_returns_the_template(mode):
    x = jnp.arange(6.0)

    def f(x):
        sent = jaxmpi.isend(x, jaxmpi.PROC_NULL)
        (got,) = jaxmpi.waitall([jaxmpi.irecv(x * 2, jaxmpi.PROC_NULL)])
        jaxmpi.wait(sent)
        return got

    assert_array(call(mode, f, x), np.asarray(x) * 2)


@needs_ranks(2)
@needs_mpi4py
def test_status_names_source_and_tag_of_any_source_receive():
    from mpi4py import MPI

    partner = partner_or_skip()
    status = MPI.Status()

    @jax.jit
    def f(x):
        rs = jaxmpi.isend(x, partner, tag=10 + RANK)
        rr = jaxmpi.irecv(x, status=status)
        jaxmpi.wait(rs)
        return jaxmpi.wait(rr)

    f(jnp.zeros(4)).block_until_ready()
    assert (status.Get_source(), status.Get_tag()) == (partner, 10 + partner)


@needs_ranks(2)
@pytest.mark.parametrize("construct", ["fori_loop", "scan", "cond"])
def test_inside_control_flow(construct):
    """Started and waited inside each iteration or branch; the carry travels around."""
    partner = partner_or_skip()
    x = jnp.full(4, float(RANK))

    def step(u):
        return exchange(u, partner) + 1.0

    if construct == "fori_loop":
        f = lambda x: jax.lax.fori_loop(0, 5, lambda i, u: step(u), x)  # noqa: E731
        expected = [RANK, partner][5 % 2] + 5.0
    elif construct == "scan":
        f = lambda x: jax.lax.scan(lambda u, _: (step(u), None), x, length=4)[0]  # noqa: E731
        expected = float(RANK) + 4.0
    else:
        f = lambda x: jax.lax.cond(x[0] >= 0, step, lambda u: u, x)  # noqa: E731
        expected = partner + 1.0
    assert_array(jax.jit(f)(x), np.full(4, expected, x.dtype))


def halo_step(u, partner, overlap):
    """One step of a 1-D stencil whose left halo comes from the partner: overlapped
    (non-blocking, the interior between start and wait) or blocking (sendrecv)."""
    if overlap:
        rs = jaxmpi.isend(u[-1:], partner, tag=3)
        rr = jaxmpi.irecv(u[:1], partner, tag=3)
        v = jaxmpi.after([rs, rr], u)
        interior = jnp.sin(v[1:]) * v[:-1]
        halo = jaxmpi.wait(rr, after=interior)
        jaxmpi.wait(rs, after=interior)
    else:
        interior = jnp.sin(u[1:]) * u[:-1]
        halo = jaxmpi.sendrecv(u[-1:], u[:1], source=partner, dest=partner, sendtag=3)
    return jnp.concatenate([halo * u[:1], interior])


def readme_step(u, rank, size, overlap):
    """README.md's non-blocking example (overlap) and the same step with sendrecv."""
    up, down = (rank + 1) % size, (rank - 1) % size
    if not overlap:
        low = jaxmpi.sendrecv(u[-2], u[0], source=down, dest=up, sendtag=0, recvtag=0)
        high = jaxmpi.sendrecv(u[1], u[-1], source=up, dest=down, sendtag=1, recvtag=1)
        inner = (u[1:-3] + u[2:-2] + u[3:-1]) / 3
    else:
        reqs = [jaxmpi.isend(u[-2], up, tag=0), jaxmpi.isend(u[1], down, tag=1),
                jaxmpi.irecv(u[0], down, tag=0), jaxmpi.irecv(u[-1], up, tag=1)]  # fmt: skip
        v = jaxmpi.after(reqs, u)
        inner = (v[1:-3] + v[2:-2] + v[3:-1]) / 3
        _, _, low, high = jaxmpi.waitall(reqs, after=inner)
    first, last = (low + u[1] + u[2]) / 3, (u[-3] + u[-2] + high) / 3
    return jnp.concatenate([low[None], first[None], inner, last[None], high[None]])


def test_readme_example_gives_the_blocking_results_bit_for_bit():
    size = jaxmpi.COMM_WORLD.Get_size()
    u = jnp.asarray(rank_data(RANK, "float32", (12, 5)))
    results = []
    for overlap in (True, False):
        step = jax.jit(lambda u, o=overlap: readme_step(u, RANK, size, o))
        v = u
        for _ in range(4):
            v = step(v)
        results.append(np.asarray(v))
    np.testing.assert_array_equal(results[0], results[1])


@needs_ranks(2)
def test_grad_and_jvp_through_an_overlapped_halo_exchange_match_the_blocking_one():
    partner = partner_or_skip()
    x = jnp.linspace(0.5, 1.5, 16) + RANK

    def loss(u, overlap):
        for _ in range(3):
            u = halo_step(u, partner, overlap)
        return jnp.sum(u**2)

    grads = [jax.jit(jax.grad(loss), static_argnums=1)(x, o) for o in (True, False)]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6)
    t = jnp.cos(x)
    jvps = [jax.jvp(lambda u, o=o: loss(u, o), (x,), (t,)) for o in (True, False)]
    np.testing.assert_allclose(jvps[0], jvps[1], rtol=1e-6)


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_vmap_sends_one_message_per_batch(mode):
    partner = partner_or_skip()
    batch = jnp.stack([rank_data(RANK, "float32", (3,)) + k for k in range(4)])
    got = call(mode, jax.vmap(lambda u: exchange(u, partner)), batch)
    expected = np.stack([rank_data(partner, "float32", (3,)) + k for k in range(4)])
    assert_array(got, expected)


@needs_ranks(2)
def test_the_interior_is_scheduled_between_start_and_wait():
    """In the compiled program the interior (the sine) is one kernel that reads the starts'
    results and is read by the waits: XLA can neither hoist it above the starts nor sink
    it (fused into a later kernel) below the waits. Without `after`, XLA:CPU does both."""
    partner = partner_or_skip()
    u = jnp.linspace(0.0, 1.0, 1 << 12)
    # Where nothing moves a transfer while the program computes (progress mode at-start,
    # this 2-core machine's), `after` places nothing: here, what it places.
    _native.set_collectives_at_start(False)
    try:
        text = jax.jit(lambda u: halo_step(u, partner, True)).lower(u).compile().as_text()
    finally:
        _native.set_collectives_at_start(None)
    bodies = {}  # computation name -> its text
    for block in text.split("\n\n"):
        header = block.strip().splitlines()[0] if block.strip() else ""
        if header.startswith(("%", "ENTRY %")):
            bodies[header.removeprefix("ENTRY ").split()[0].lstrip("%")] = block
    entry = entry_lines(text)

    def name_of(line):
        return line.split("=")[0].replace("ROOT", "").strip().lstrip("%")

    def index(target):
        return [i for i, line in enumerate(entry) if f'custom_call_target="{target}"' in line]

    starts, waits = index("jaxmpi_isend") + index("jaxmpi_irecv"), index("jaxmpi_wait")
    kernels = {
        name_of(line): (i, line)
        for i, line in enumerate(entry)
        if " fusion(" in line and "sine(" in bodies.get(line.split("calls=%")[1].split(",")[0], "")
    }
    assert len(starts) == 2 and len(waits) == 2 and len(kernels) == 1, entry
    ((name, (i, line)),) = kernels.items()
    started = reads_call(entry, line, "jaxmpi_isend") or reads_call(entry, line, "jaxmpi_irecv")
    assert started, f"the interior does not read a start: {line}"
    assert max(starts) < i < min(waits), entry
    for w in waits:
        assert f"%{name}" in entry[w], f"a wait does not read the interior: {entry[w]}"


@needs_ranks(2)
@needs_errors_return
def test_a_failed_transfer_is_raised_at_its_wait():
    """A message larger than the receive buffer (MPI_ERR_TRUNCATE) fails the wait, named,
    and MPI stays usable."""
    partner = partner_or_skip()

    @jax.jit
    def f(x):
        rs = jaxmpi.isend(x, partner, tag=4)
        rr = jaxmpi.irecv(x[:2], partner, tag=4)
        jaxmpi.wait(rs)
        return jaxmpi.wait(rr)

    with pytest.raises(jaxmpi.MPIError) as info, jaxmpi.raise_mpi_errors():
        jax.block_until_ready(f(jnp.arange(8.0)))
    assert info.value.op == "wait" and "irecv" in str(info.value), str(info.value)
    assert "truncat" in str(info.value).lower(), str(info.value)
    assert_array(exchange(jnp.ones(3), partner), np.ones(3, jnp.ones(3).dtype))


@needs_ranks(2)
@needs_mpi4py
def test_a_short_message_is_an_error_at_its_wait_or_zeros_with_a_status():
    """As recv: a message shorter than the template fails the wait, named; with `status=`
    the count is there and the rest of the result is zeros."""
    from mpi4py import MPI

    partner = partner_or_skip()
    status = MPI.Status()

    @jax.jit
    def f(x):
        rs = jaxmpi.isend(x[:3], partner, tag=5)
        rr = jaxmpi.irecv(x, partner, tag=5)
        jaxmpi.wait(rs)
        return jaxmpi.wait(rr)

    @jax.jit
    def g(x):
        rs = jaxmpi.isend(x[:3], partner, tag=6)
        rr = jaxmpi.irecv(x, partner, tag=6, status=status)
        jaxmpi.wait(rs)
        return jaxmpi.wait(rr)

    x = jnp.arange(8.0) + 10 * partner
    with pytest.raises(jaxmpi.MPIError) as info, jaxmpi.raise_mpi_errors():
        jax.block_until_ready(f(jnp.arange(8.0)))
    got = jax.device_get(g(jnp.arange(8.0) + 10 * RANK))
    assert info.value.step == "short message", str(info.value)
    assert "received 3 of 8" in str(info.value), str(info.value)
    assert_array(got, np.concatenate([np.asarray(x[:3]), np.zeros(5)]).astype(x.dtype))
    assert status.Get_count(MPI.DOUBLE if x.dtype == np.float64 else MPI.FLOAT) == 3


# --- Misuse: refused while tracing -------------------------------------------------------


@needs_ranks(2)
def test_misuse_is_refused_at_trace_time():
    partner = partner_or_skip()
    x = jnp.ones(3)

    def twice(x):
        r = jaxmpi.irecv(x, partner)
        jaxmpi.wait(r)
        return jaxmpi.wait(r)

    def never_waited(x):
        jaxmpi.isend(x, partner)
        return x

    def other_branch(x):
        r = jaxmpi.irecv(x, partner)
        return jax.lax.cond(x[0] > 0, lambda y: jaxmpi.wait(r), lambda y: y, x)

    def across_iterations(x):
        r = jaxmpi.irecv(x, partner)
        return jax.lax.fori_loop(0, 2, lambda i, y: jaxmpi.wait(r), x)

    def returned(x):
        return jaxmpi.isend(x, partner)

    def same_twice(x):
        r = jaxmpi.irecv(x, partner)
        return jaxmpi.waitall([r, r])

    check_raises(ValueError, ["waited for already"], jax.jit(twice), x)
    check_raises(ValueError, ["never waited for", "test_nonblocking.py"], jax.jit(never_waited), x)
    for f in (other_branch, across_iterations):
        check_raises(
            ValueError, ["started in another function, branch or loop body"], jax.jit(f), x
        )
    check_raises(TypeError, ["Request"], jax.jit(returned), x)
    check_raises(ValueError, ["appears twice"], jax.jit(same_twice), x)
    check_raises(TypeError, ["expected a jaxmpi.Request"], jaxmpi.wait, x)
    # Nothing was started by the refused programs: MPI is in step on both ranks.
    assert_array(exchange(x, partner), np.ones(3, x.dtype))
