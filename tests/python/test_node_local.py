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
from jaxmpi._runtime import gpu_choice

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


# --- The GPU each rank uses, chosen before MPI_Init (jaxmpi/_runtime/gpu_choice.py) ------
# The rule runs here on the launcher's real environment, with a GPU count given: the same
# code the GPU path runs, minus the driver.


def _clean(**env: str) -> dict[str, str]:
    """This rank's environment without the settings the rule reads, plus `env`."""
    kept = {k: v for k, v in os.environ.items() if k not in ("JAXMPI_GPU", "CUDA_VISIBLE_DEVICES")}
    return {**kept, **env}


def test_the_launcher_says_each_rank_its_place_on_its_node_before_mpi_init():
    """What the GPU is chosen from before MPI_Init must be what MPI says after it."""
    local = gpu_choice.launcher_local_rank(os.environ)
    if SIZE > 1:
        assert local is not None, "this launcher sets none of gpu_choice.LAUNCHERS"
    if local is not None:
        mpi_rank, mpi_size = _native.node_local_rank(_native.world())
        assert local.rank == mpi_rank, local
        assert local.size in (None, mpi_size), local


def test_four_gpus_listed_for_every_task_give_each_rank_its_own():
    """srun --gres=gpu:4 without binding: every task sees CUDA_VISIBLE_DEVICES=0,1,2,3.
    That is no choice of one GPU: each rank takes the one of its node-local rank."""
    env = _clean(CUDA_VISIBLE_DEVICES="0,1,2,3")
    choice = gpu_choice.plan(env, 4, "all", gpu_choice.launcher_local_rank(env))
    node_rank, node_size = _native.node_local_rank(_native.world())
    if gpu_choice.launcher_local_rank(env) is None:  # no launcher: a singleton's place
        assert choice.needs_mpi and choice.gpu is None
        return
    assert (choice.gpu, choice.jax_option) == (node_rank % 4, str(node_rank % 4)), choice
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in choice.why
    hosts = _hostnames()
    gpus = _native.allgather_bytes(_native.world(), b"%4d" % choice.gpu)
    mine = [int(g) for g, h in zip(gpus, hosts, strict=True) if h == hosts[RANK]]
    assert len(set(mine)) == min(node_size, 4), f"GPUs of this node's ranks: {mine}"


@pytest.mark.parametrize(
    ("env", "jax_visible", "local", "expected"),
    [
        ({}, "all", 3, (1, "1")),
        ({"JAXMPI_GPU": "auto"}, "all", 3, (1, "1")),
        ({"JAXMPI_GPU": "0"}, "all", 3, (0, "0")),
        ({"JAXMPI_GPU": "jax"}, "all", 3, (None, None)),
        # One GPU visible: the process sees it as GPU 0, whatever its number on the node.
        ({"CUDA_VISIBLE_DEVICES": "3"}, "all", 3, (0, "0")),
        # The user's jax_cuda_visible_devices is theirs: never overwritten.
        ({}, "1", 0, (1, None)),
        ({"JAXMPI_GPU": "1"}, "1", 0, (1, None)),
        ({}, "0,1", 3, (None, None)),
        # No launcher variable: chosen after MPI_Init, from MPI's answer.
        ({}, "all", None, (None, None)),
    ],
)
def test_the_gpu_rule(env, jax_visible, local, expected):
    place = None if local is None else gpu_choice.LocalRank(local, 4, "TEST_LOCAL_RANK")
    devices = 1 if "CUDA_VISIBLE_DEVICES" in env else 2
    choice = gpu_choice.plan(env, devices, jax_visible, place)
    assert (choice.gpu, choice.jax_option) == expected, choice
    assert choice.needs_mpi == (local is None and not env and jax_visible == "all")


def test_slurms_variable_yields_to_the_launcher_inside_a_batch_script():
    """mpirun in a batch script: every rank inherits the script's SLURM_LOCALID=0."""
    env = {"SLURM_LOCALID": "0", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
    assert gpu_choice.launcher_local_rank(env) == gpu_choice.LocalRank(2, 4, "MPI_LOCALRANKID")
    assert gpu_choice.launcher_local_rank({"SLURM_LOCALID": "1"}).rank == 1


@pytest.mark.parametrize(
    ("env", "jax_visible", "match"),
    [
        ({"JAXMPI_GPU": "2"}, "all", "JAXMPI_GPU='2': use a GPU number below 2"),
        ({"JAXMPI_GPU": "first"}, "all", "JAXMPI_GPU='first'"),
        ({"JAXMPI_GPU": "0"}, "1", "JAXMPI_GPU=0 and jax_cuda_visible_devices='1'"),
    ],
)
def test_a_gpu_setting_that_cannot_work_names_the_variable(env, jax_visible, match):
    with pytest.raises(ValueError, match=match):
        gpu_choice.plan(env, 2, jax_visible, gpu_choice.LocalRank(0, 1, "TEST"))


@pytest.mark.parametrize(
    ("platforms", "excluded"),
    [
        (None, False),
        ("", False),
        ("cpu", True),
        ("cuda,cpu", False),
        ("gpu", False),
        ("CPU,tpu", True),
    ],
)
def test_jax_platforms_without_cuda_leave_the_driver_unloaded(platforms, excluded):
    assert gpu_choice.excluded_by_platforms(platforms) is excluded
