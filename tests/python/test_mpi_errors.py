"""MPI failures at run time become Python exceptions, never an abort, and leave the
library usable: a receive smaller than its message, a communicator freed since the program
was compiled, a user communicator whose handler aborts; and `jaxmpi.MPIError`, which names
the op, the step inside it, the rank and the MPI error, and how a user's own jit gets it.
Argument mistakes, found while tracing, are tested in test_errors.py."""

from __future__ import annotations

import jax
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
    check_raises,
    needs_errors_return,
    needs_mpi4py,
    needs_ranks,
    p2p_partner,
    partner_or_skip,
)

# MPI's own failures, between pairs of ranks.
pytestmark = [pytest.mark.same_at_every_size, needs_errors_return]


@pytest.fixture(autouse=True)
def _library_still_usable():
    yield
    allreduce_still_works()


# ---------------------------------------------------------------------------------------
# Errors MPI reports while running
# ---------------------------------------------------------------------------------------


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_receive_smaller_than_the_message(mode):
    """MPI_ERR_TRUNCATE on the receiving rank becomes a Python exception, not an abort."""
    partner = partner_or_skip()
    if RANK % 2 == 0:
        call(mode, lambda x: jaxmpi.send(x, partner, tag=9), np.arange(8, dtype=np.float32))
    else:
        small = np.zeros(4, np.float32)
        check_raises(
            RuntimeError, ["truncat"], call, mode, lambda t: jaxmpi.recv(t, partner, tag=9), small
        )


@pytest.mark.parametrize("mode", MODES)
def test_sendrecv_into_a_smaller_buffer(mode):
    """Every rank sends 8 numbers to the right but offers room for 4: all ranks fail."""
    left, right = (RANK - 1) % SIZE, (RANK + 1) % SIZE
    check_raises(
        RuntimeError,
        ["truncat"],
        call,
        mode,
        lambda x, t: jaxmpi.sendrecv(x, t, source=left, dest=right),
        np.arange(8, dtype=np.float64),
        np.zeros(4, np.float64),
    )


@needs_ranks(2)
def test_library_usable_after_a_runtime_error_inside_a_bigger_program():
    """A failed receive in the middle of a jitted program, then more jitted programs:
    the failure must not poison the ordering token of later calls."""
    partner = p2p_partner()
    if partner is not None and RANK % 2 == 0:
        jaxmpi.send(np.arange(8, dtype=np.int32), partner, tag=1)
    elif partner is not None:
        program = jax.jit(lambda t: jaxmpi.recv(t, partner, tag=1) + 1)
        check_raises(RuntimeError, ["truncat"], program, np.zeros(2, np.int32))
    # Every rank (the odd one out of an odd-sized job too) goes on with jitted and eager
    # collectives.
    summed = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM))(np.int32(RANK))
    gathered = jaxmpi.allgather(np.int32(RANK))
    assert int(summed) == sum(range(SIZE))
    assert jax.device_get(gathered).tolist() == list(range(SIZE))


# ---------------------------------------------------------------------------------------
# jaxmpi.MPIError: type, attributes, and how a user's own jit gets it
# ---------------------------------------------------------------------------------------


def truncated_receive(partner: int, receive):
    """The even rank of a pair sends 8 numbers with tag 9; the odd one calls
    `receive(template of 4, partner)`, which must fail with MPI_ERR_TRUNCATE. Returns what
    `receive` raised (None on the sending rank)."""
    if RANK % 2 == 0:
        jaxmpi.send(np.arange(8, dtype=np.float32), partner, tag=9)
        return None
    with pytest.raises(Exception) as info:
        jax.block_until_ready(receive(np.zeros(4, np.float32), partner))
    return info.value


def assert_truncation_error(err, partner: int) -> None:
    assert isinstance(err, jaxmpi.MPIError), type(err)
    assert isinstance(err, RuntimeError) and isinstance(err, jax.errors.JaxRuntimeError)
    assert err.op == "recv"
    assert err.step == "MPI_Recv", err.step  # the MPI function that failed
    assert err.rank == MPI_WORLD_RANK
    assert (err.peer, err.tag, err.nbytes) == (partner, 9, 16)
    assert isinstance(err.error_class, int) and err.error_class > 0
    assert "truncat" in err.error_string.lower()
    assert err.comm is not None


MPI_WORLD_RANK = jaxmpi.COMM_WORLD.Get_rank()


@needs_ranks(2)
def test_eager_mpi_failure_raises_mpi_error_with_its_attributes():
    partner = p2p_partner()
    if partner is not None:
        err = truncated_receive(partner, lambda t, p: jaxmpi.recv(t, p, tag=9))
        if err is not None:
            assert_truncation_error(err, partner)


@needs_ranks(2)
@pytest.mark.parametrize("how", ["decorator", "context manager", "from_exception"])
def test_mpi_error_from_a_users_own_jit(how):
    """Inside a user's jit JAX raises its JaxRuntimeError; jaxmpi turns it into MPIError."""
    partner = partner_or_skip()
    program = jax.jit(lambda t: jaxmpi.recv(t, partner, tag=9) * 2)

    def receive(t, p):
        if how == "decorator":
            return jaxmpi.raise_mpi_errors()(program)(t)
        if how == "context manager":
            with jaxmpi.raise_mpi_errors():
                return jax.block_until_ready(program(t))
        try:
            return jax.block_until_ready(program(t))
        except jax.errors.JaxRuntimeError as err:
            raise jaxmpi.MPIError.from_exception(err) from None

    err = truncated_receive(partner, receive)
    if err is not None:
        assert_truncation_error(err, partner)


def test_from_exception_ignores_errors_from_elsewhere():
    assert jaxmpi.MPIError.from_exception(ValueError("jaxmpi.recv failed: x")) is None
    assert jaxmpi.MPIError.from_exception(jax.errors.JaxRuntimeError("INTERNAL: oops")) is None
    with pytest.raises(KeyError), jaxmpi.raise_mpi_errors():
        raise KeyError("not an MPI error")


def test_a_compiled_call_on_a_communicator_freed_since_fails_in_the_error_handler_check():
    """A jitted function run again after its communicator was freed: the handler's first
    step, the error handler check, fails in MPI on every rank. JAX 0.10 raises that
    re-run's failure as a ValueError: `from_exception` and `raise_mpi_errors` must still
    recognize it, with the op and the step apart."""
    if jaxmpi._runtime.library.info["family"] != "mpich":
        pytest.skip("only MPICH's integer handles can be checked by MPI once freed")
    comm = jaxmpi.COMM_WORLD.Dup()
    program = jax.jit(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm))
    assert float(jax.block_until_ready(program(np.float32(1)))) == SIZE
    comm.Free()
    with pytest.raises(Exception) as info:
        jax.block_until_ready(program(np.float32(1)))
    err = jaxmpi.MPIError.from_exception(info.value)
    assert err is not None, f"not recognized as an MPI failure: {info.value!r}"
    assert (err.op, err.step, err.rank) == ("allreduce", "error handler check", RANK)
    assert err.error_class is not None and "error handler check" not in err.error_string
    with pytest.raises(jaxmpi.MPIError) as info, jaxmpi.raise_mpi_errors():
        jax.block_until_ready(program(np.float32(1)))
    assert (info.value.op, info.value.step) == ("allreduce", "error handler check")


def test_mpi_error_reads_the_step_and_failures_outside_any_op():
    err = jaxmpi.MPIError(
        "jaxmpi.allreduce (error handler check) failed: rank 1: Invalid communicator "
        "(MPI error class 5) [comm 0x84000004, 8 bytes]"
    )
    assert (err.op, err.step, err.rank, err.error_class) == ("allreduce", "error handler check",
                                                             1, 5)  # fmt: skip
    assert (err.error_string, err.comm, err.nbytes) == ("Invalid communicator", 0x84000004, 8)
    checked = jaxmpi.MPIError(
        "jaxmpi.bcast (communicator check): rank 0: the communicator is MPI_COMM_NULL"
    )
    assert (checked.op, checked.step, checked.rank, checked.error_class) == (
        "bcast", "communicator check", 0, None)  # fmt: skip
    outside = jaxmpi.MPIError(
        "jaxmpi.initialize MPI failed: MPI_Init_thread returned 5 (MPI error class 5)"
    )
    assert (outside.op, outside.step, outside.error_class) == (None, "initialize MPI", 5)
    assert outside.error_string == "MPI_Init_thread returned 5"
    plain = jaxmpi.MPIError("jaxmpi.recv failed: rank 0: Message truncated (MPI error class 15)")
    assert (plain.op, plain.step) == ("recv", None)
    rerun = ValueError("INTERNAL: jaxmpi.recv failed: rank 0: Message truncated "
                       "(MPI error class 15)")  # fmt: skip
    assert jaxmpi.MPIError.from_exception(rerun).op == "recv"


@needs_mpi4py
@needs_ranks(2)
def test_a_user_communicator_that_aborts_on_errors_returns_them_during_jaxmpi_calls():
    """The user's ERRORS_ARE_FATAL stays theirs: jaxmpi swaps it only for its own call."""
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    try:
        left, right = (RANK - 1) % SIZE, (RANK + 1) % SIZE
        with pytest.raises(jaxmpi.MPIError) as info:
            jaxmpi.sendrecv(np.zeros(8), np.zeros(4), left, right, comm=comm)
        assert info.value.op == "sendrecv" and info.value.peer == left
        handler = comm.Get_errhandler()
        assert handler == MPI.ERRORS_ARE_FATAL, "the user's error handler was not restored"
        handler.Free()
        summed = jaxmpi.allreduce(np.int32(1), jaxmpi.SUM, comm=comm)
        assert int(summed) == SIZE
    finally:
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        comm.Free()


def test_mpi_error_reads_every_field_of_the_message():
    err = jaxmpi.MPIError(
        "jaxmpi.sendrecv failed: rank 3: Message truncated, error stack:\nline two "
        "(MPI error class 15) [comm 0x44000000, dest 2, source ANY_SOURCE, sendtag 1, "
        "recvtag 4, 64 bytes]"
    )
    assert (err.op, err.rank, err.error_class, err.comm) == ("sendrecv", 3, 15, 0x44000000)
    assert (err.peer, err.tag, err.root, err.nbytes) == ("ANY_SOURCE", 4, None, 64)
    assert err.error_string == "Message truncated, error stack:\nline two"
    assert err.call["dest"] == 2
