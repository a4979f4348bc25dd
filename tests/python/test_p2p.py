"""Point-to-point: program order, tags, ANY_SOURCE, PROC_NULL and MPI.Status.

Ranks talk in pairs (0, 1), (2, 3), ... (`p2p_partner`); with an odd number of ranks the
last one sits these tests out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import (
    MODES,
    MPI,
    RANK,
    SIZE,
    assert_array,
    call,
    needs_mpi4py,
    needs_ranks,
    partner_or_skip,
    rank_data,
)

# Across hosts, a transport of its own.
pytestmark = pytest.mark.across_hosts

# 1 MiB of float32 per message: larger than any eager-protocol limit, so a send does not
# complete before the matching receive has been posted.
BIG = 1 << 18


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_exchange_that_deadlocks_if_reordered(mode):
    """A ping-pong of large messages in one program: the even rank sends then receives,
    the odd rank receives then sends, six times, with a different tag each time. The sends
    and receives do not depend on each other's data, so only jaxmpi's ordering keeps them
    in program order; any reordering (e.g. two receives first on both ranks, or a send
    with tag 2 before the one with tag 0) deadlocks or swaps the payloads."""
    partner = partner_or_skip()
    rounds = 6
    template = jnp.zeros(BIG, jnp.float32)

    def payload(sender, k):
        return jnp.full(BIG, 1000.0 * sender + k, jnp.float32)

    def exchange(template):
        received = []
        for k in range(rounds):
            if (RANK + k) % 2 == 0:  # the roles alternate every round
                jaxmpi.send(payload(RANK, k), partner, tag=k)
            else:
                received.append(jaxmpi.recv(template, partner, tag=k))
        return received

    got = call(mode, exchange, template)
    expected_rounds = [k for k in range(rounds) if (RANK + k) % 2 == 1]
    for k, array in zip(expected_rounds, got, strict=True):
        assert_array(array, np.full(BIG, 1000.0 * partner + k, np.float32), f"round {k}")


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_messages_arrive_in_program_order(mode):
    """Eight small messages with the same tag, received in the order they were sent
    (MPI's non-overtaking rule holds only if the sends are issued in program order)."""
    partner = partner_or_skip()
    count = 8

    def talk(template):
        if RANK % 2 == 0:
            for k in range(count):
                jaxmpi.send(template + k, partner, tag=1)
            return []
        return [jaxmpi.recv(template, partner, tag=1) for _ in range(count)]

    got = call(mode, talk, jnp.float64(0.0))
    if RANK % 2 == 1:
        assert [float(v) for v in got] == [float(k) for k in range(count)]


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_receive_by_tag_out_of_send_order(mode):
    """The receiver asks for tag 2 before tag 1; small messages are buffered, so MPI
    matches them by tag regardless of arrival order."""
    partner = partner_or_skip()

    def talk(x):
        if RANK % 2 == 0:
            jaxmpi.send(x + 1, partner, tag=1)
            jaxmpi.send(x + 2, partner, tag=2)
            return []
        second = jaxmpi.recv(x, partner, tag=2)
        first = jaxmpi.recv(x, partner, tag=1)
        return [first, second]

    got = call(mode, talk, jnp.zeros(3, jnp.int32))
    if RANK % 2 == 1:
        assert_array(got[0], np.full(3, 1, np.int32), "tag 1")
        assert_array(got[1], np.full(3, 2, np.int32), "tag 2")


@needs_mpi4py
@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_recv_any_source_fills_status(mode):
    """Every rank but 0 sends its rank to rank 0, which receives them with ANY_SOURCE and
    learns the senders from the statuses (written at run time, also under jit)."""
    others = SIZE - 1
    statuses = [MPI.Status() for _ in range(others)]

    def talk(x):
        if RANK != 0:
            jaxmpi.send(x, 0, tag=10 + RANK)
            return []
        return [jaxmpi.recv(x, status=s) for s in statuses]

    got = call(mode, talk, jnp.int32(RANK))
    if RANK == 0:
        sources = [s.Get_source() for s in statuses]
        tags = [s.Get_tag() for s in statuses]
        assert sorted(sources) == list(range(1, SIZE))
        assert tags == [10 + src for src in sources]
        assert [int(v) for v in got] == sources  # each value came with its own status
        assert all(s.Get_count(MPI.BYTE) == 4 for s in statuses)


@needs_mpi4py
@pytest.mark.parametrize("mode", MODES)
def test_sendrecv_fills_status(mode):
    left, right = (RANK - 1) % SIZE, (RANK + 1) % SIZE
    status = MPI.Status()
    x = rank_data(RANK, "float64", (5,))
    got = call(
        mode,
        lambda x: jaxmpi.sendrecv(
            x, x, source=left, dest=right, sendtag=40 + RANK, recvtag=40 + left, status=status
        ),
        x,
    )
    assert_array(got, rank_data(left, "float64", (5,)))
    assert status.Get_source() == left
    assert status.Get_tag() == 40 + left
    assert status.Get_count(MPI.BYTE) == x.nbytes


@needs_mpi4py
def test_status_is_refilled_on_every_call():
    """A jitted function holding a Status writes it on each run, not only the first."""
    left, right = (RANK - 1) % SIZE, (RANK + 1) % SIZE
    status = MPI.Status()
    exchange = jax.jit(lambda x: jaxmpi.sendrecv(x, x, left, right, sendtag=7, status=status))
    exchange(jnp.float32(RANK)).block_until_ready()
    status.Set_source(-12345)
    status.Set_tag(-12345)
    exchange(jnp.float32(RANK)).block_until_ready()
    assert (status.Get_source(), status.Get_tag()) == (left, 7)


@pytest.mark.parametrize("mode", MODES)
def test_proc_null(mode):
    """Talking to PROC_NULL is a no-op: the send returns [], the receive returns the
    template unchanged, and sendrecv returns the receive buffer unchanged."""
    template = np.arange(4, dtype=np.float32) + 10

    def talk(x, t):
        sent = jaxmpi.send(x, jaxmpi.PROC_NULL)
        received = jaxmpi.recv(t, jaxmpi.PROC_NULL)
        swapped = jaxmpi.sendrecv(x, t, source=jaxmpi.PROC_NULL, dest=jaxmpi.PROC_NULL)
        return sent, received, swapped

    sent, received, swapped = call(mode, talk, np.zeros(4, np.float32), template)
    assert sent == []
    assert_array(received, template, "recv")
    assert_array(swapped, template, "sendrecv")


@needs_mpi4py
@pytest.mark.parametrize("mode", MODES)
def test_status_of_a_receive_from_proc_null(mode):
    """MPI describes a receive from PROC_NULL as: source PROC_NULL, tag ANY_TAG, 0 bytes."""
    status = MPI.Status()
    call(mode, lambda t: jaxmpi.recv(t, jaxmpi.PROC_NULL, status=status), np.zeros(3))
    assert status.Get_source() == MPI.PROC_NULL
    assert status.Get_tag() == MPI.ANY_TAG
    assert status.Get_count(MPI.BYTE) == 0


@pytest.mark.parametrize("mode", MODES)
def test_shift_with_open_ends(mode):
    """A non-periodic shift to the right: rank 0 receives from PROC_NULL (keeps its
    buffer), the last rank sends to PROC_NULL."""
    source = RANK - 1 if RANK > 0 else jaxmpi.PROC_NULL
    dest = RANK + 1 if RANK < SIZE - 1 else jaxmpi.PROC_NULL
    keep = np.full(3, -1.0)
    got = call(
        mode, lambda x, t: jaxmpi.sendrecv(x, t, source, dest), rank_data(RANK, "float64"), keep
    )
    assert_array(got, rank_data(RANK - 1, "float64") if RANK > 0 else keep)


@needs_ranks(2)
def test_sendrecv_with_different_send_and_receive_shapes():
    """The sent and the received arrays only need the same number of elements."""
    left, right = (RANK - 1) % SIZE, (RANK + 1) % SIZE
    sendbuf = rank_data(RANK, "int32", (2, 3))
    got = jaxmpi.sendrecv(sendbuf, np.zeros(6, np.int32), source=left, dest=right)
    assert_array(got, rank_data(left, "int32", (2, 3)).reshape(6))


@needs_ranks(2)
def test_eager_send_recv_in_a_loop():
    """Many eager calls in a row (each a separate dispatch) keep their order."""
    partner = partner_or_skip()
    received = []
    for k in range(20):
        if (RANK + k) % 2 == 0:
            jaxmpi.send(np.int64(100 * RANK + k), partner, tag=k % 3)
        else:
            received.append(int(jaxmpi.recv(np.int64(0), partner, tag=k % 3)))
    expected = [100 * partner + k for k in range(20) if (RANK + k) % 2 == 1]
    assert received == expected


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["int8", "bfloat16", "complex128"])
def test_sendrecv_of_one_array_into_itself(mode, dtype):
    """`sendrecv(a, a)` sends and receives through one buffer (MPI_Sendrecv_replace);
    the program may still use `a` afterwards (XLA then hands MPI a copy)."""
    left, right = (RANK - 1) % SIZE, (RANK + 1) % SIZE
    mine = rank_data(RANK, dtype, (5, 3))

    def shift_and_keep(a):
        return jaxmpi.sendrecv(a, a, source=left, dest=right, sendtag=3), a

    shifted, kept = call(mode, shift_and_keep, mine)
    assert_array(shifted, rank_data(left, dtype, (5, 3)), "received")
    assert_array(kept, mine, "kept")


@pytest.mark.parametrize("mode", MODES)
def test_sendrecv_of_one_array_with_open_ends_and_status(mode):
    """In place with PROC_NULL: rank 0 receives nothing and keeps its array; the status
    describes what arrived."""
    status = MPI.Status() if MPI is not None else None
    source = RANK - 1 if RANK > 0 else jaxmpi.PROC_NULL
    dest = RANK + 1 if RANK < SIZE - 1 else jaxmpi.PROC_NULL
    mine = rank_data(RANK, "float64", (4,))
    got = call(mode, lambda a: jaxmpi.sendrecv(a, a, source, dest, status=status), mine)
    assert_array(got, rank_data(RANK - 1, "float64", (4,)) if RANK > 0 else mine)
    if status is not None:
        assert status.Get_source() == (RANK - 1 if RANK > 0 else MPI.PROC_NULL)


@pytest.mark.parametrize("mode", MODES)
def test_vmapped_sendrecv_of_one_array(mode):
    """One in-place MPI call for the whole batch, whichever axis is batched."""
    left, right = (RANK - 1) % SIZE, (RANK + 1) % SIZE
    batch = np.stack([rank_data(RANK, "float32", (3, 2)) * (k + 1) for k in range(4)], axis=1)
    shift = jax.vmap(lambda a: jaxmpi.sendrecv(a, a, left, right), in_axes=1, out_axes=1)
    got = call(mode, shift, batch)
    expected = np.stack([rank_data(left, "float32", (3, 2)) * (k + 1) for k in range(4)], axis=1)
    assert_array(got, expected)
