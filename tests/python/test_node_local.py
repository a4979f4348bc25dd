"""Each rank's default GPU comes from its node-local rank, which MPI computes
(MPI_COMM_TYPE_SHARED) whatever the launcher: a rank's place among the ranks on its host.

JAXMPI_TEST_HOSTS=N (ci/multihost.sh) says the job was placed on N hosts: then the ranks
must see that many hostnames, so that the node-local ranks are really checked across hosts
(2 hosts x 2 ranks: 0, 1, 0, 1)."""

from __future__ import annotations

import os
import socket

import pytest

import jaxmpi
from helpers import RANK, SIZE, needs_ranks
from jaxmpi import _native
from jaxmpi._runtime import gpu

# Which ranks share a node: across hosts, with one rank and two on each.
pytestmark = [pytest.mark.across_hosts, pytest.mark.several_ranks_per_host]


def _hostnames() -> list[str]:
    """Every rank's hostname, in rank order."""
    mine = socket.gethostname().encode()
    width = max(int(n) for n in _native.allgather_bytes(_native.world(), b"%8d" % len(mine)))
    return [h.decode().strip() for h in _native.allgather_bytes(_native.world(), mine.ljust(width))]


def test_node_local_rank_of_world_is_the_place_among_the_ranks_of_the_host():
    got = _native.node_local_rank(_native.world())
    hosts = _hostnames()
    mine = hosts[RANK]
    expected = (hosts[:RANK].count(mine), hosts.count(mine))
    assert got == expected, f"hosts of the ranks: {hosts}"
    if "JAXMPI_TEST_HOSTS" in os.environ:
        assert len(set(hosts)) == int(os.environ["JAXMPI_TEST_HOSTS"]), hosts


@needs_ranks(2)
def test_node_local_rank_follows_the_communicator():
    # Odd and even ranks in two communicators: each rank's node-local rank there is its
    # place among the members of its half on its host.
    hosts = _hostnames()
    half = jaxmpi.COMM_WORLD.Split(color=RANK % 2, key=RANK)
    try:
        got = _native.node_local_rank(half.handle)
    finally:
        half.Free()
    members = [hosts[r] for r in range(RANK % 2, SIZE, 2)]
    mine = members[RANK // 2]
    assert got == (members[: RANK // 2].count(mine), members.count(mine)), hosts


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
    assert gpu._rank_gpu(devices=2, node_rank=3) == expected


def test_gpu_number_out_of_range_names_the_variable(monkeypatch):
    monkeypatch.setenv("JAXMPI_GPU", "2")
    with pytest.raises(ValueError, match="JAXMPI_GPU"):
        gpu._rank_gpu(devices=2, node_rank=0)
