"""Bad input gives a clear Python exception (type and a key phrase of the message checked)
and leaves the library usable: after every test here, an allreduce must still work.

Most mistakes are caught while tracing, the same way on every rank. Two are not: a wrong
scatter input is only seen on the root, and a too-small receive buffer only when MPI
runs; those tests take care that the other ranks are not left waiting.
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
    MPI,
    OP_DTYPES,
    OP_NAMES,
    RANK,
    SIZE,
    allreduce_still_works,
    call,
    check_raises,
    jaxmpi_op,
    mpi4py_op,
    needs_mpi4py,
    needs_ranks,
)

# Raised while tracing, before any MPI call.
pytestmark = [pytest.mark.same_on_every_mpi, pytest.mark.same_at_every_size]

#: Every op that takes an array, called with valid arguments apart from `x` or `comm`.
#: Peers are PROC_NULL and roots 0, so that a call that wrongly went through would not
#: wait for anybody.
ARRAY_OPS = {
    "allreduce": lambda x, **kw: jaxmpi.allreduce(x, jaxmpi.SUM, **kw),
    "reduce": lambda x, **kw: jaxmpi.reduce(x, jaxmpi.SUM, 0, **kw),
    "scan": lambda x, **kw: jaxmpi.scan(x, jaxmpi.SUM, **kw),
    "exscan": lambda x, **kw: jaxmpi.exscan(x, jaxmpi.SUM, **kw),
    "bcast": lambda x, **kw: jaxmpi.bcast(x, 0, **kw),
    "gather": lambda x, **kw: jaxmpi.gather(x, 0, **kw),
    "allgather": lambda x, **kw: jaxmpi.allgather(x, **kw),
    "scatter": lambda x, **kw: jaxmpi.scatter(x, 0, **kw),
    "alltoall": lambda x, **kw: jaxmpi.alltoall(x, **kw),
    "send": lambda x, **kw: jaxmpi.send(x, jaxmpi.PROC_NULL, **kw),
    "recv": lambda x, **kw: jaxmpi.recv(x, jaxmpi.PROC_NULL, **kw),
    "sendrecv": lambda x, **kw: jaxmpi.sendrecv(x, x, jaxmpi.PROC_NULL, jaxmpi.PROC_NULL, **kw),
}
ALL_OPS = {**ARRAY_OPS, "barrier": lambda x, **kw: jaxmpi.barrier(**kw)}


def valid_input():
    """Fits every op: alltoall and scatter (at root 0) want a leading axis of SIZE."""
    return np.zeros((SIZE, 2), np.float32)


@pytest.fixture(autouse=True)
def _library_still_usable():
    yield
    allreduce_still_works()


# ---------------------------------------------------------------------------------------
# Ranks out of range
# ---------------------------------------------------------------------------------------

ROOTED = {
    "bcast": lambda root: jaxmpi.bcast(valid_input(), root),
    "reduce": lambda root: jaxmpi.reduce(valid_input(), jaxmpi.SUM, root),
    "gather": lambda root: jaxmpi.gather(valid_input(), root),
    "scatter": lambda root: jaxmpi.scatter(valid_input(), root),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("root", [SIZE, -1, 1000], ids=["size", "minus-one", "1000"])
@pytest.mark.parametrize("op", list(ROOTED))
def test_root_out_of_range(op, root, mode):
    check_raises(ValueError, ["root", "out of range"], call, mode, lambda: ROOTED[op](root))


@pytest.mark.parametrize("root", [0.0, "0", None, True], ids=["float", "str", "none", "bool"])
def test_root_of_the_wrong_type(root):
    check_raises(TypeError, ["root", "int"], jaxmpi.bcast, valid_input(), root)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dest", [SIZE, -7], ids=["size", "negative"])
def test_dest_out_of_range(dest, mode):
    x = valid_input()
    check_raises(ValueError, ["dest", "out of range"], call, mode, lambda: jaxmpi.send(x, dest))
    check_raises(
        ValueError, ["dest", "out of range"], call, mode, lambda: jaxmpi.sendrecv(x, x, 0, dest)
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source", [SIZE, -7], ids=["size", "negative"])
def test_source_out_of_range(source, mode):
    x = valid_input()
    check_raises(ValueError, ["source", "out of range"], call, mode, lambda: jaxmpi.recv(x, source))
    check_raises(
        ValueError, ["source", "out of range"], call, mode, lambda: jaxmpi.sendrecv(x, x, source, 0)
    )


def test_any_source_is_not_a_destination():
    check_raises(ValueError, ["any_source"], jaxmpi.send, valid_input(), jaxmpi.ANY_SOURCE)


@pytest.mark.parametrize("tag", [-3, 1.5], ids=["negative", "float"])
def test_bad_tag(tag):
    check_raises(
        (ValueError, TypeError), ["tag"], jaxmpi.send, valid_input(), jaxmpi.PROC_NULL, tag=tag
    )


@pytest.mark.parametrize("tag", [2**31, 2**63, 2**64 + 3], ids=["2^31", "2^63", "2^64+3"])
def test_tag_too_large(tag):
    """MPI tags are C ints (and at most MPI_TAG_UB); a larger one is refused with a
    message naming it, not wrapped around to some other tag."""
    x = valid_input()
    check_raises(Exception, ["tag", str(tag)], jaxmpi.send, x, jaxmpi.PROC_NULL, tag=tag)
    check_raises(Exception, ["tag", str(tag)], jaxmpi.recv, x, jaxmpi.PROC_NULL, tag=tag)


def test_token_argument_is_refused():
    """mpi4jax >= 0.8 has no tokens; passing one raises its RuntimeError (every op and
    the exact text: test_mpi4jax_api.py)."""
    check_raises(RuntimeError, ["token"], jaxmpi.allreduce, 1.0, jaxmpi.SUM, token=object())


# ---------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(SIZE + 1, 2), (), (0, SIZE)], ids=["size+1", "scalar", "empty"])
def test_alltoall_needs_size_rows(shape, mode):
    x = np.zeros(shape, np.float32)
    check_raises(ValueError, ["(nproc, ...)"], call, mode, jaxmpi.alltoall, x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(SIZE + 1, 2), ()], ids=["size+1", "scalar"])
def test_scatter_needs_size_rows_on_the_root(shape, mode):
    """Only the root checks (on the other ranks x is a template of one slice), so only the
    root calls scatter here: the others must not wait for a scatter that never comes."""
    root = SIZE - 1
    if RANK == root:
        x = np.zeros(shape, np.float32)
        check_raises(ValueError, ["(nproc, ...)"], call, mode, lambda x: jaxmpi.scatter(x, root), x)


# ---------------------------------------------------------------------------------------
# Inputs that are not arrays, or of an unsupported dtype
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["abc", object(), {"a": "abc"}], ids=["str", "object", "pytree-of-str"]
)
@pytest.mark.parametrize("op", list(ARRAY_OPS))
def test_input_that_is_not_an_array(op, value):
    check_raises(TypeError, ["expected an array"], ARRAY_OPS[op], value)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "int4"])
@pytest.mark.parametrize("op", list(ARRAY_OPS))
def test_unsupported_dtype(op, dtype, mode):
    x = jnp.zeros((SIZE, 2), dtype)
    check_raises(TypeError, [dtype, "not supported"], call, mode, ARRAY_OPS[op], x)


# ---------------------------------------------------------------------------------------
# Communicators
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("comm", [42, "world", object()], ids=["int", "str", "object"])
@pytest.mark.parametrize("op", list(ALL_OPS))
def test_not_a_communicator(op, comm):
    check_raises(TypeError, ["comm must be"], ALL_OPS[op], valid_input(), comm=comm)


@needs_mpi4py
def test_mpi4py_object_that_is_not_a_communicator():
    group = MPI.COMM_WORLD.Get_group()
    try:
        check_raises(TypeError, ["comm must be"], jaxmpi.allreduce, 1.0, jaxmpi.SUM, comm=group)
    finally:
        group.Free()


@needs_mpi4py
@pytest.mark.parametrize("op", list(ALL_OPS))
def test_comm_null(op):
    check_raises(ValueError, ["COMM_NULL"], ALL_OPS[op], valid_input(), comm=MPI.COMM_NULL)


@needs_mpi4py
@needs_ranks(2)
@pytest.mark.parametrize("op", list(ALL_OPS))
def test_intercommunicator(op):
    """Even and odd ranks form two groups joined by an intercommunicator."""
    local = MPI.COMM_WORLD.Split(RANK % 2, RANK)
    remote_leader = 1 if RANK % 2 == 0 else 0  # world rank of the other group's rank 0
    inter = local.Create_intercomm(0, MPI.COMM_WORLD, remote_leader, tag=77)
    try:
        check_raises(ValueError, ["intercommunicator"], ALL_OPS[op], valid_input(), comm=inter)
    finally:
        inter.Free()
        local.Free()


# ---------------------------------------------------------------------------------------
# Reduction ops
# ---------------------------------------------------------------------------------------

UNSUPPORTED_PAIRS = [
    (op, dtype) for op in OP_NAMES for dtype in ALL_DTYPES if dtype not in OP_DTYPES[op]
]


@pytest.mark.parametrize("flavor", ["jaxmpi", "mpi4py"])
@pytest.mark.parametrize(("op", "dtype"), UNSUPPORTED_PAIRS)
def test_op_that_does_not_fit_the_dtype(op, dtype, flavor):
    """e.g. BAND on float32, SUM on bool, MAX on complex64."""
    if flavor == "mpi4py" and MPI is None:
        pytest.skip("needs mpi4py")
    mpi_op = jaxmpi_op(op) if flavor == "jaxmpi" else mpi4py_op(op)
    x = np.zeros(3, jnp.dtype(dtype))
    for reduction in (jaxmpi.allreduce, jaxmpi.scan, jaxmpi.exscan):
        check_raises(TypeError, [op, "not defined on", dtype], reduction, x, mpi_op)
    check_raises(TypeError, [op, "not defined on", dtype], jaxmpi.reduce, x, mpi_op, 0)


@pytest.mark.parametrize("op", ["sum", None, 3], ids=["str", "none", "int"])
def test_not_an_op(op):
    check_raises(TypeError, ["op must be"], jaxmpi.allreduce, 1.0, op)


@needs_mpi4py
def test_op_null():
    check_raises(ValueError, ["OP_NULL"], jaxmpi.allreduce, 1.0, MPI.OP_NULL)


@needs_mpi4py
@pytest.mark.parametrize("name", ["MAXLOC", "MINLOC", "REPLACE", "NO_OP"])
def test_unsupported_predefined_op(name):
    check_raises(ValueError, ["not supported"], jaxmpi.allreduce, 1.0, getattr(MPI, name))


@needs_mpi4py
def test_status_of_the_wrong_type():
    check_raises(TypeError, ["status"], jaxmpi.recv, 1.0, jaxmpi.PROC_NULL, status="status")


# ---------------------------------------------------------------------------------------
# Communicators that are freed or belong to another MPI library
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", list(ALL_OPS))
def test_freed_jaxmpi_communicator(op):
    comm = jaxmpi.COMM_WORLD.Dup()
    comm.Free()
    check_raises(ValueError, ["freed"], ALL_OPS[op], valid_input(), comm=comm)
    check_raises(ValueError, ["freed"], comm.Get_rank)


@needs_mpi4py
def test_freed_mpi4py_communicator_seen_through_another_reference():
    """Free() turns the freed object into COMM_NULL, but a second Python object still holds
    the old handle: MPI itself must refuse it, as a clear error."""
    comm = MPI.COMM_WORLD.Dup()
    alias = MPI.Intracomm(comm)
    comm.Free()
    check_raises(ValueError, ["freed"], jaxmpi.allreduce, 1.0, jaxmpi.SUM, comm=alias)


def test_communicator_of_another_mpi_family():
    """A handle of the other family's shape (an Open MPI pointer where MPICH is loaded, an
    MPICH integer handle where Open MPI is): refused, naming what it is, not a crash."""
    family = jaxmpi._runtime.library.info["family"]
    foreign = 0x7F00_1234_5000 if family == "mpich" else 0x4400_0000
    check_raises(ValueError, ["communicator"], jaxmpi.allreduce, 1.0, jaxmpi.SUM,
                 comm=jaxmpi.Comm(foreign))  # fmt: skip


# ---------------------------------------------------------------------------------------
# Ranks and tags that are traced values: they decide which MPI call is compiled
# ---------------------------------------------------------------------------------------

TRACED = {
    "root": lambda x, r: jaxmpi.bcast(x, r),
    "dest": lambda x, r: jaxmpi.send(x, r),
    "source": lambda x, r: jaxmpi.recv(x, r),
    "tag": lambda x, r: jaxmpi.send(x, jaxmpi.PROC_NULL, tag=r),
}


@pytest.mark.parametrize("what", list(TRACED))
def test_a_traced_rank_or_tag_is_refused_at_trace_time(what):
    program = jax.jit(TRACED[what])
    check_raises(TypeError, [what, "known at trace time", "static_argnums"], program,
                 valid_input(), np.int32(0))  # fmt: skip


def test_a_concrete_jax_scalar_is_a_valid_rank_and_tag():
    y = jaxmpi.bcast(np.float32(RANK), jnp.int32(0))
    assert float(y) == 0.0
    jaxmpi.send(valid_input(), jaxmpi.PROC_NULL, tag=jnp.int32(3))


def test_the_leading_axis_message_names_the_size_and_the_shape():
    x = np.zeros((SIZE + 1, 2), np.float32)
    check_raises(ValueError, ["jaxmpi.alltoall", f"({SIZE}, ...)", str((SIZE + 1, 2))],
                 jaxmpi.alltoall, x)  # fmt: skip
    check_raises(ValueError, ["jaxmpi.reduce_scatter", f"({SIZE}, ...)"],
                 jaxmpi.reduce_scatter, x, jaxmpi.SUM)  # fmt: skip
