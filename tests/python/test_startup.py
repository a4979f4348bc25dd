"""How jaxmpi starts in a fresh process: the thread-level refusal, a bad JAXMPI_MPI,
working without mpi4py, and `python -m jaxmpi info`. Each case is its own singleton MPI
process (MPI can be initialized once per process), started from rank 0 only."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import MPI, RANK

# Processes started alone.
pytestmark = pytest.mark.same_at_every_size

# Variables through which a launcher makes a process a rank of its job; the child must
# not inherit them, or it would try to join this job instead of starting alone.
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDI_", "HYDRA_", "I_MPI_", "MPI_LOCALNRANKS")


def run_alone(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    clean.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **env)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


rank_0_only = pytest.mark.skipif(RANK != 0, reason="starts its own processes; rank 0 does it")


@rank_0_only
@pytest.mark.skipif(MPI is None, reason="needs mpi4py to initialize MPI with a low thread level")
def test_a_thread_level_below_serialized_is_refused_clearly():
    result = run_alone(
        "import mpi4py; mpi4py.rc.thread_level = 'funneled'\n"
        "from mpi4py import MPI\n"
        "try:\n"
        "    import jaxmpi\n"
        "except RuntimeError as err:\n"
        "    print('REFUSED', type(err).__name__, err)\n"
    )
    assert "REFUSED MPIError" in result.stdout, result.stdout + result.stderr
    assert "MPI_THREAD_FUNNELED" in result.stdout
    assert "MPI_THREAD_MULTIPLE" in result.stdout


@rank_0_only
def test_an_unknown_jaxmpi_mpi_value_names_the_valid_ones():
    result = run_alone(
        "try:\n    import jaxmpi\nexcept ValueError as err:\n    print('REFUSED', err)\n",
        JAXMPI_MPI="intel",
    )
    assert 'REFUSED JAXMPI_MPI: unknown value "intel"' in result.stdout, result.stderr
    assert "auto, mpich, openmpi, mpiabi" in result.stdout


@rank_0_only
def test_without_mpi4py_jaxmpi_has_its_own_world_and_ops():
    result = run_alone(
        "import sys; sys.modules['mpi4py'] = None  # as if mpi4py were not installed\n"
        "import jax.numpy as jnp, jaxmpi\n"
        "comm = jaxmpi.COMM_WORLD.Clone()\n"
        "x = jaxmpi.allreduce(jnp.arange(3), jaxmpi.MAX, comm=comm)\n"
        "print('OK', comm.Get_size(), x.tolist(), type(jaxmpi._comm.default_comm()).__name__)\n"
    )
    assert "OK 1 [0, 1, 2] Comm" in result.stdout, result.stdout + result.stderr


@rank_0_only
def test_info_names_the_library_and_how_it_was_chosen():
    result = run_alone(
        "import runpy, sys; sys.argv = ['jaxmpi', 'info']; runpy.run_module('jaxmpi', run_name='__main__')"
    )
    out = result.stdout
    assert result.returncode == 0, result.stderr
    for field in (
        "MPI library",
        "family",
        "chosen",
        "thread level",
        "MPI_THREAD_MULTIPLE",
        "jaxlib",
    ):
        assert field in out, out


INFO = "import runpy, sys; sys.argv = ['jaxmpi', 'info']; runpy.run_module('jaxmpi', run_name='__main__')"


@rank_0_only
@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"JAXMPI_CUDA_AWARE": "1"}, "CUDA-aware    yes: JAXMPI_CUDA_AWARE=1 (set by the user)"),
        # Each family reads its own hint; with all of them off, whichever it reads stages.
        (
            {
                "MPICH_GPU_SUPPORT_ENABLED": "0",
                "I_MPI_OFFLOAD": "0",
                "OMPI_MCA_opal_cuda_support": "0",
            },
            "=0 switches the library's GPU support off",
        ),
        ({}, "CUDA-aware    no: "),  # the MPIs here are built without CUDA
    ],
)
def test_info_says_why_device_pointers_are_passed_or_staged(env, line):
    result = run_alone(INFO, **env)
    assert result.returncode == 0, result.stderr
    assert line in result.stdout, result.stdout
