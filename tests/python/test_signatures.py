"""Each op is declared once, in the Rust handler table (`_native.signatures()`): the Python
primitives are checked against it at trace time, and a handler given attributes that do
not match its declaration returns an error naming the op and the attribute."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from helpers import allreduce_still_works
from jaxmpi import _comm, _native, _ops, _varcount
from jaxmpi._jax_shim import Primitive


def _primitives() -> dict:
    return {
        value.name.removeprefix("jaxmpi_"): value
        for module in (_ops, _varcount)
        for value in vars(module).values()
        if isinstance(value, Primitive)
    }


def _handle() -> int:
    return _comm.resolve_comm(None, "test").handle


def test_every_declared_op_has_a_primitive_and_handler_and_no_other_exists():
    declared = set(_native.signatures())
    assert declared == set(_primitives())
    assert {f"jaxmpi_{name}" for name in declared} == {n for n, _ in _native.handlers()}


def test_the_portable_encodings_come_from_the_extension():
    constants = _native.constants()
    assert (_comm.PEER_ANY, _comm.PEER_NULL, _comm.TAG_ANY, _comm.OP_USER) == tuple(
        constants[k] for k in ("PEER_ANY", "PEER_NULL", "TAG_ANY", "OP_USER")
    )
    assert _comm.encode_source(_comm.ANY_SOURCE, 1, "recv") == constants["PEER_ANY"]
    assert _comm.encode_dest(_comm.PROC_NULL, 1, "send") == constants["PEER_NULL"]


def test_same_names_at_every_layer():
    attrs = {name: [a for a, _ in s["attrs"]] for name, s in _native.signatures().items()}
    assert attrs["sendrecv"] == ["comm", "dest", "sendtag", "source", "recvtag", "status"]
    assert attrs["gatherv"] == ["comm", "root", "counts"]
    assert attrs["alltoallv"] == ["comm", "send_counts", "recv_counts"]
    assert attrs["allreduce"] == ["comm", "op", "user_op"]
    assert _native.signatures()["sendrecv"]["operands"] == ["sendbuf", "recvbuf"]


def test_an_undeclared_parameter_is_refused_at_trace_time_naming_op_and_parameter():
    x, comm = jnp.zeros(3), _handle()
    with pytest.raises(TypeError, match=r"jaxmpi\.allreduce: parameter 'tag' is neither"):
        jax.jit(
            lambda x: _ops._allreduce_p.bind(x, comm=comm, op=0, user_op=0, identity=False, tag=1)
        )(x)
    allreduce_still_works()


def test_a_missing_attribute_is_refused_at_trace_time_naming_op_and_attribute():
    x, comm = jnp.zeros(3), _handle()
    with pytest.raises(TypeError, match=r"jaxmpi\.bcast: attribute 'root' was not bound"):
        jax.jit(lambda x: _ops._bcast_p.bind(x, comm=comm, at_root=True))(x)
    with pytest.raises(TypeError, match=r"jaxmpi\.sendrecv: bound with 1 operands"):
        jax.jit(lambda x: _ops._sendrecv_p.bind(x, comm=comm))(x)
    allreduce_still_works()


def test_a_handler_missing_a_declared_attribute_names_op_and_attribute():
    # The FFI target called directly, bypassing the checked primitive: the handler
    # decodes before any MPI call, so every rank fails alike and nobody waits.
    call = jax.ffi.ffi_call("jaxmpi_allreduce", jax.ShapeDtypeStruct((3,), jnp.float32))
    with pytest.raises(Exception, match=r"allreduce.*attribute \"op\" is missing"):
        jax.block_until_ready(
            jax.jit(lambda x: call(x, comm=_ops._address(_handle())))(jnp.zeros(3, jnp.float32))
        )
    allreduce_still_works()
