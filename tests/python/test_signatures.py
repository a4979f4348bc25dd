"""Each op is declared once, in the Rust handler table (`_native.signatures()`): the Python
primitives (`_primitive.PRIMITIVES`) are checked against it at trace time, every one has
its row of rules (`_rules.RULES`), and a handler given attributes that do not match its
declaration returns an error naming the op and the attribute."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxmpi
from helpers import allreduce_still_works
from jaxmpi import _args, _comm, _native
from jaxmpi._binding import primitives as _primitive
from jaxmpi._binding import rules as _rules
from jaxmpi._binding.primitives import PRIMITIVES
from jaxmpi._runtime import encodings

# The declarations, checked in Python and Rust, whatever the MPI.
pytestmark = [pytest.mark.same_on_every_mpi, pytest.mark.same_at_every_size]

# The one primitive without a handler: allreduce-SUM's transpose, which calls no MPI.
WITHOUT_HANDLER = {"allreduce_transposed"}


def _handle() -> int:
    return _comm.resolve_comm(None, "test").handle


def test_every_declared_op_has_a_primitive_and_handler_and_no_other_exists():
    declared = set(_native.signatures())
    # XLA's collectives have no primitive: the HLO pass calls their handlers.
    called_by_the_pass = {target.removeprefix("jaxmpi_") for _, target in _native.hlo_targets()}
    assert called_by_the_pass <= declared
    assert declared - called_by_the_pass == set(PRIMITIVES) - WITHOUT_HANDLER
    assert {f"jaxmpi_{name}" for name in declared} == {n for n, _ in _native.handlers()}
    assert all(PRIMITIVES[name].name == f"jaxmpi_{name}" for name in PRIMITIVES)


def test_every_primitive_has_its_row_of_rules_and_no_row_is_left_over():
    assert set(_rules.RULES) == set(PRIMITIVES)
    for name, rules in _rules.RULES.items():
        differentiable = name != "barrier"  # the only op with no operand
        assert (rules.jvp is not None) == differentiable, name
        assert (rules.transpose is not None) == differentiable, name


def test_the_portable_encodings_come_from_the_extension():
    constants = _native.constants()
    assert (encodings.PEER_ANY, encodings.PEER_NULL, encodings.TAG_ANY, encodings.OP_USER) == tuple(
        constants[k] for k in ("PEER_ANY", "PEER_NULL", "TAG_ANY", "OP_USER")
    )
    assert _args.encode_source(_comm.ANY_SOURCE, 1, "recv") == constants["PEER_ANY"]
    assert _args.encode_dest(_comm.PROC_NULL, 1, "send") == constants["PEER_NULL"]


def test_same_names_at_every_layer():
    attrs = {name: [a for a, _ in s["attrs"]] for name, s in _native.signatures().items()}
    assert attrs["sendrecv"] == [
        "comm", "dest", "sendtag", "source", "recvtag", "status", "tree", "recv_tree"
    ]  # fmt: skip
    assert attrs["gatherv"] == ["comm", "root", "counts", "tree"]
    assert attrs["alltoallv"] == ["comm", "send_counts", "recv_counts", "tree"]
    assert attrs["allreduce"] == ["comm", "op", "user_op", "tree"]
    assert _native.signatures()["sendrecv"]["operands"] == ["sendbuf", "recvbuf"]


def test_an_undeclared_parameter_is_refused_at_trace_time_naming_op_and_parameter():
    x, comm = jnp.zeros(3), _handle()
    with pytest.raises(TypeError, match=r"jaxmpi\.allreduce: parameter 'tag' is neither"):
        jax.jit(lambda x: _primitive.allreduce.bind(x, comm=comm, op=0, user_op=0, tag=1))(x)
    allreduce_still_works()


def test_a_missing_attribute_is_refused_at_trace_time_naming_op_and_attribute():
    x, comm = jnp.zeros(3), _handle()
    with pytest.raises(TypeError, match=r"jaxmpi\.bcast: attribute 'root' was not bound"):
        jax.jit(lambda x: _primitive.bcast.bind(x, comm=comm, at_root=True))(x)
    with pytest.raises(TypeError, match=r"jaxmpi\.sendrecv: bound with 1 operands"):
        jax.jit(lambda x: _primitive.sendrecv.bind(x, comm=comm))(x)
    allreduce_still_works()


def test_a_handler_missing_a_declared_attribute_names_op_and_attribute():
    # The FFI target called directly, bypassing the checked primitive: the handler
    # decodes before any MPI call, so every rank fails alike and nobody waits.
    call = jax.ffi.ffi_call("jaxmpi_allreduce", jax.ShapeDtypeStruct((3,), jnp.float32))
    with pytest.raises(Exception, match=r"allreduce.*attribute \"op\" is missing"):
        jax.block_until_ready(
            jax.jit(lambda x: call(x, comm=_primitive._comm_id(_handle())))(
                jnp.zeros(3, jnp.float32)
            )
        )
    allreduce_still_works()


def test_a_single_arrays_call_carries_no_fingerprint_and_a_pytrees_does():
    # An attribute at its default stays out of the call (one attribute fewer for XLA to
    # copy into every call); a pytree's fingerprint, which checked mode compares, goes in.
    def attributes(f, x):
        text = jax.jit(f).lower(x).as_text()
        calls = [line for line in text.splitlines() if "jaxmpi_allreduce" in line]
        assert calls, text
        return calls

    single = attributes(lambda x: jaxmpi.allreduce(x, jaxmpi.SUM), jnp.zeros(3))
    assert not any("tree" in line for line in single), single
    tree = attributes(
        lambda t: jaxmpi.allreduce(t, jaxmpi.SUM), {"a": jnp.zeros(3), "b": jnp.ones(2)}
    )
    assert all("tree = " in line for line in tree), tree
