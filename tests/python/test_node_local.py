"""Each rank's default GPU comes from its node-local rank, which MPI computes
(MPI_COMM_TYPE_SHARED) whatever the launcher; on this one-node job it is the world rank."""

from __future__ import annotations

import pytest

import jaxmpi
from helpers import RANK, SIZE, needs_ranks
from jaxmpi import _native, _runtime


def test_node_local_rank_of_world_is_the_rank_on_one_node():
    assert _native.node_local_rank(_native.world()) == (RANK, SIZE)


@needs_ranks(2)
def test_node_local_rank_follows_the_communicator():
    # Odd and even ranks in two communicators: each rank's node-local rank there is its
    # rank in the split, since all its members share this node.
    half = jaxmpi.COMM_WORLD.Split(color=RANK % 2, key=RANK)
    try:
        got = _native.node_local_rank(half.handle)
        expected = (half.Get_rank(), half.Get_size())
    finally:
        half.Free()
    assert got == expected
    assert expected == (RANK // 2, (SIZE - RANK % 2 + 1) // 2)


def test_node_local_rank_refuses_a_handle_that_is_no_communicator():
    with pytest.raises(ValueError, match="communicator"):
        _native.node_local_rank(0)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 3 % 2),
        ({"JAXMPI_GPU": "auto"}, 3 % 2),
        ({"JAXMPI_GPU": "0"}, 0),
        ({"JAXMPI_GPU": "jax"}, None),
        ({"CUDA_VISIBLE_DEVICES": "1"}, None),
        ({"CUDA_VISIBLE_DEVICES": "1", "JAXMPI_GPU": "1"}, 1),
    ],
)
def test_default_gpu_is_node_local_rank_modulo_gpu_count(monkeypatch, env, expected):
    for name in ("JAXMPI_GPU", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _runtime._rank_gpu(devices=2, node_rank=3) == expected


def test_gpu_number_out_of_range_names_the_variable(monkeypatch):
    monkeypatch.setenv("JAXMPI_GPU", "2")
    with pytest.raises(ValueError, match="JAXMPI_GPU"):
        _runtime._rank_gpu(devices=2, node_rank=0)
