"""No silent wrong answers: a message shorter than the receive buffer is an error (or, with
`status=`, a count and zeros), and in checked mode (`JAXMPI_CHECK=1`) ranks that call
different things (dtype, size, root, reduction, op) fail alike, naming each rank's call,
instead of returning garbage or hanging.

Checked mode is switched on for the tests that need it, on every rank at the same point
(`checked` fixture), as `JAXMPI_CHECK=1` would at start; `python -m jaxmpi info` reporting
it is tested in test_startup.py.
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
    allreduce_still_works,
    call,
    needs_mpi4py,
    needs_ranks,
    partner_or_skip,
)

LEFT, RIGHT = (RANK - 1) % SIZE, (RANK + 1) % SIZE


def raised(fn, *args):
    """What `fn(*args)` raised, as the MPIError it stands for (None if nothing was)."""
    try:
        jax.block_until_ready(fn(*args))
    except Exception as err:
        return jaxmpi.MPIError.from_exception(err) or err
    return None


def pair_still_talks(partner: int) -> None:
    """After an error between a pair (the other ranks skipped the test: no collective
    here), nothing is left in between: a fresh exchange gets the partner's value."""
    after = jax.device_get(jaxmpi.sendrecv(np.int32(RANK), np.int32(0), partner, partner))
    assert int(after) == partner


# --- Short messages -----------------------------------------------------------------------


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_a_short_message_is_an_error_naming_op_ranks_tag_and_counts(mode):
    partner = partner_or_skip()
    err = None
    if RANK % 2 == 0:
        call(mode, lambda x: jaxmpi.send(x, partner, tag=7), np.arange(4, dtype=np.float32))
    else:
        receive = lambda t: call(mode, lambda t: jaxmpi.recv(t, partner, tag=7), t)  # noqa: E731
        err = raised(receive, np.zeros(1000, np.float32))
    pair_still_talks(partner)
    if RANK % 2 == 1:
        assert isinstance(err, jaxmpi.MPIError), repr(err)
        assert (err.op, err.step, err.peer, err.tag) == ("recv", "short message", partner, 7)
        assert f"received 4 of 1000 float32 elements from rank {partner}" in err.error_string


@needs_ranks(2)
@needs_mpi4py
@pytest.mark.parametrize("mode", MODES)
def test_a_short_message_with_status_gives_the_count_and_zeros(mode):
    partner = partner_or_skip()
    if RANK % 2 == 0:
        call(mode, lambda x: jaxmpi.send(x, partner, tag=3), np.arange(1, 5, dtype=np.float32))
        return
    status = MPI.Status()
    got = call(
        mode, lambda t: jaxmpi.recv(t, partner, tag=3, status=status), np.ones(9, np.float32)
    )
    expected = np.zeros(9, np.float32)
    expected[:4] = np.arange(1, 5)
    np.testing.assert_array_equal(got, expected)
    assert status.Get_count(MPI.FLOAT) == 4 and status.Get_source() == partner


@pytest.mark.parametrize("mode", MODES)
def test_sendrecv_short_message_is_an_error_on_every_rank(mode):
    """Every rank sends 3 numbers right and offers room for 5 from the left."""
    err = raised(
        lambda x, t: call(mode, lambda x, t: jaxmpi.sendrecv(x, t, LEFT, RIGHT, sendtag=2), x, t),
        np.arange(3, dtype=np.float64),
        np.zeros(5, np.float64),
    )
    allreduce_still_works()
    assert isinstance(err, jaxmpi.MPIError), repr(err)
    assert (err.op, err.step) == ("sendrecv", "short message")
    assert f"received 3 of 5 float64 elements from rank {LEFT} (tag 2)" in err.error_string


@needs_mpi4py
def test_sendrecv_short_message_with_status_gives_the_count_and_zeros():
    status = MPI.Status()
    mine = np.arange(6, dtype=np.int32) + 10 * RANK

    def exchange(x):
        # Every rank sends its first 2 numbers and offers room for 6: a shorter message.
        return jaxmpi.sendrecv(x[:2], jnp.zeros_like(x), LEFT, RIGHT, status=status)

    got = jax.device_get(jax.jit(exchange)(mine))
    expected = np.zeros(6, np.int32)
    expected[:2] = np.arange(2) + 10 * LEFT
    np.testing.assert_array_equal(got, expected)
    assert status.Get_count(MPI.INT32_T) == 2


# --- Checked mode: collectives --------------------------------------------------------------

# Per test: what rank 0 does and what every other rank does; the ranks differ in one way.
MISMATCHES = {
    "dtype": (
        lambda: jaxmpi.allreduce(np.ones(4, np.float32), jaxmpi.SUM),
        lambda: jaxmpi.allreduce(np.ones(4, np.int32), jaxmpi.SUM),
        ["rank 0: allreduce float32[4] SUM", "allreduce int32[4] SUM"],
    ),
    "count": (
        lambda: jaxmpi.allreduce(np.ones(4, np.float64), jaxmpi.SUM),
        lambda: jaxmpi.allreduce(np.ones(5, np.float64), jaxmpi.SUM),
        ["rank 0: allreduce float64[4] SUM", "allreduce float64[5] SUM"],
    ),
    "root": (
        lambda: jaxmpi.bcast(np.ones(3, np.int64), 0),
        lambda: jaxmpi.bcast(np.ones(3, np.int64), SIZE - 1),
        ["rank 0: bcast int64[3] root 0", f"bcast int64[3] root {SIZE - 1}"],
    ),
    "reduction": (
        lambda: jaxmpi.reduce(np.ones(2, np.int32), jaxmpi.SUM, 0),
        lambda: jaxmpi.reduce(np.ones(2, np.int32), jaxmpi.MAX, 0),
        ["rank 0: reduce int32[2] root 0 SUM", "reduce int32[2] root 0 MAX"],
    ),
    "collective": (
        lambda: jaxmpi.allreduce(np.ones(3, np.float32), jaxmpi.SUM),
        lambda: jaxmpi.allgather(np.ones(3, np.float32)),
        ["rank 0: allreduce float32[3] SUM", "allgather float32[3]"],
    ),
    # Each rank's own entry matches its input (else it would fail alone, at trace time);
    # the others believe rank 0 sends 2 rows.
    "counts": (
        lambda: jaxmpi.allgatherv(np.ones((1, 2), np.float32), [1] * SIZE),
        lambda: jaxmpi.allgatherv(np.ones((1, 2), np.float32), [2] + [1] * (SIZE - 1)),
        [
            f"rank 0: allgatherv float32 rows of 2, counts of {SIZE} rows",
            f"allgatherv float32 rows of 2, counts of {SIZE + 1} rows",
        ],
    ),
}


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("what", list(MISMATCHES))
def test_ranks_that_differ_fail_alike_naming_each_call(checked, what, mode):
    first, others, phrases = MISMATCHES[what]
    mine = first if RANK == 0 else others
    run = jax.jit(mine) if mode == "jit" else mine
    err = raised(run)
    allreduce_still_works()
    assert isinstance(err, jaxmpi.MPIError), repr(err)
    assert err.step == "JAXMPI_CHECK", err
    for phrase in phrases:
        assert phrase in str(err), (phrase, str(err))


def _block(rows: int):
    """Rank 0's float32 block or every other rank's int32 one: same size, other dtype."""
    return np.ones((rows, 2), np.float32 if RANK == 0 else np.int32)


ONES = [1] * SIZE
# Every collective, called the same way on every rank but with rank 0's dtype different.
EVERY_COLLECTIVE = {
    "allreduce": lambda: jaxmpi.allreduce(_block(SIZE), jaxmpi.SUM),
    "reduce": lambda: jaxmpi.reduce(_block(SIZE), jaxmpi.SUM, 0),
    "scan": lambda: jaxmpi.scan(_block(SIZE), jaxmpi.SUM),
    "exscan": lambda: jaxmpi.exscan(_block(SIZE), jaxmpi.SUM),
    "reduce_scatter": lambda: jaxmpi.reduce_scatter(_block(SIZE), jaxmpi.SUM),
    "bcast": lambda: jaxmpi.bcast(_block(SIZE), 0),
    "gather": lambda: jaxmpi.gather(_block(SIZE), 0),
    "allgather": lambda: jaxmpi.allgather(_block(SIZE)),
    "scatter": lambda: jaxmpi.scatter(_block(SIZE) if RANK == 0 else _block(1)[0], 0),
    "alltoall": lambda: jaxmpi.alltoall(_block(SIZE)),
    "gatherv": lambda: jaxmpi.gatherv(_block(1), ONES, 0),
    "allgatherv": lambda: jaxmpi.allgatherv(_block(1), ONES),
    "scatterv": lambda: jaxmpi.scatterv(_block(SIZE if RANK == 0 else 1), ONES, 0),
    "alltoallv": lambda: jaxmpi.alltoallv(_block(SIZE), ONES, ONES),
}


@needs_ranks(2)
@pytest.mark.parametrize("op", list(EVERY_COLLECTIVE))
def test_every_collective_names_a_dtype_mismatch_on_every_rank(checked, op):
    err = raised(EVERY_COLLECTIVE[op])
    allreduce_still_works()
    assert isinstance(err, jaxmpi.MPIError), repr(err)
    assert (err.op, err.step) == (op, "JAXMPI_CHECK"), (err.op, err.step)
    assert f"rank 0: {op} float32" in str(err) and f"{op} int32" in str(err), str(err)


@needs_ranks(2)
def test_a_barrier_against_another_collective_is_named(checked):
    err = raised(lambda: jaxmpi.barrier() if RANK == 0 else jaxmpi.allgather(np.ones(2)))
    allreduce_still_works()
    assert isinstance(err, jaxmpi.MPIError), repr(err)
    assert "rank 0: barrier on" in str(err) and "allgather float64[2]" in str(err), str(err)


@pytest.mark.parametrize("mode", MODES)
def test_matching_calls_give_the_right_values_in_checked_mode(checked, mode):
    def program(x):
        total = jaxmpi.allreduce(x, jaxmpi.SUM)
        every = jaxmpi.allgather(x)
        rows = jaxmpi.allgatherv(jnp.tile(x, (1, 1)), [1] * SIZE)
        shifted = jaxmpi.sendrecv(x, x, LEFT, RIGHT)
        root = jaxmpi.bcast(x, SIZE - 1)
        return total, every, rows, shifted, root

    x = np.full(3, RANK + 1, np.float32)
    total, every, rows, shifted, root = call(mode, program, x)
    ranks = np.arange(1, SIZE + 1, dtype=np.float32)
    np.testing.assert_array_equal(total, np.full(3, ranks.sum()))
    np.testing.assert_array_equal(every, np.repeat(ranks[:, None], 3, axis=1))
    np.testing.assert_array_equal(rows, every)
    np.testing.assert_array_equal(shifted, np.full(3, LEFT + 1))
    np.testing.assert_array_equal(root, np.full(3, SIZE))


# --- Checked mode: point to point -----------------------------------------------------------


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "sent, template, phrase",
    [
        (
            np.ones(4, np.float32),
            np.zeros(4, np.int32),
            "sent float32[4] (tag 5), but this receive expects int32[4]",
        ),
        (
            np.ones(4, np.float32),
            np.zeros(6, np.float32),
            "sent float32[4] (tag 5), but this receive expects float32[6]",
        ),
    ],
    ids=["dtype", "count"],
)
def test_a_receive_that_differs_from_the_send_is_named(checked, mode, sent, template, phrase):
    partner = partner_or_skip()
    if RANK % 2 == 0:
        call(mode, lambda x: jaxmpi.send(x, partner, tag=5), sent)
        err = None
    else:
        err = raised(lambda t: call(mode, lambda t: jaxmpi.recv(t, partner, tag=5), t), template)
    pair_still_talks(partner)
    if RANK % 2 == 1:
        assert isinstance(err, jaxmpi.MPIError), repr(err)
        assert (err.op, err.step) == ("recv", "JAXMPI_CHECK")
        assert f"rank {partner} {phrase}" in err.error_string, err.error_string


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_checked_sendrecv_names_a_dtype_mismatch_on_the_receiving_side(checked, mode):
    """Rank 0 sends int32 where its right neighbour expects float32: that rank fails."""
    x = np.zeros(4, np.int32 if RANK == 0 else np.float32)
    t = np.zeros(4, np.float32)
    err = raised(
        lambda x, t: call(mode, lambda x, t: jaxmpi.sendrecv(x, t, LEFT, RIGHT), x, t), x, t
    )
    allreduce_still_works()
    if RANK == 1 % SIZE:
        assert isinstance(err, jaxmpi.MPIError), repr(err)
        assert "rank 0 sent int32[4]" in err.error_string
    elif SIZE > 1:
        assert err is None, repr(err)


@needs_ranks(2)
def test_checked_receive_from_any_source_gets_the_message_its_header_announced(checked):
    """Rank 0 receives from every other rank with ANY_SOURCE: each header names the
    message that follows it, whatever order the messages arrive in."""
    if RANK == 0:
        got = sorted(
            int(jaxmpi.recv(np.zeros(2, np.int64), jaxmpi.ANY_SOURCE, tag=jaxmpi.ANY_TAG)[0])
            for _ in range(SIZE - 1)
        )
        assert got == list(range(1, SIZE))
    else:
        jaxmpi.send(np.full(2, RANK, np.int64), 0, tag=RANK)
    allreduce_still_works()
