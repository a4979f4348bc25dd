"""The GPU start-up, run on a machine without a GPU up to the driver's answer, which is
faked: the rank's GPU chosen before MPI_Init (`gpu_choice.before_mpi_init`) from what each
launcher says, checked after it against MPI's node-local rank (`gpu._after_mpi_init`),
the user's own choice kept, a choice that came too late refused, and every op lowered for
CUDA. The driver (`_native.cuda_info`, `use_gpu`, `set_rank_gpu`) is the only fake:
JAX's options are read and set for real, as a GPU user's start-up reads them.

With JAX's real CUDA plugin installed (ci/gpu_startup.sh sets JAXMPI_TEST_CUDA_PLUGIN=1),
the plugin is also found for real and the process's own start-up is checked."""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings

import jax
import jax.numpy as jnp
import pytest

import jaxmpi
from jaxmpi import _native
from jaxmpi._binding import primitives
from jaxmpi._runtime import gpu, gpu_choice

pytestmark = [pytest.mark.same_on_every_mpi, pytest.mark.same_at_every_size]

#: Every variable a launcher sets that the choice reads, cleared before each test: the
#: suite itself runs under a launcher.
LAUNCHER_VARIABLES = [v for pair in gpu_choice.LAUNCHERS for v in pair if v] + [
    "JAXMPI_GPU",
    "CUDA_VISIBLE_DEVICES",
]

#: What launchers put in a rank's environment (the 4th rank of a node of 4 or more),
#: as seen from mpiexec, mpirun and srun; the variables the rule does not read are there
#: to show that they change nothing.
LAUNCHED = {
    "Open MPI (prterun)": {
        "OMPI_COMM_WORLD_LOCAL_RANK": "3",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "OMPI_COMM_WORLD_RANK": "7",
        "PMIX_RANK": "7",
        "PMIX_NAMESPACE": "prterun-node-1@1",
    },
    "MPICH / Intel MPI (hydra)": {
        "MPI_LOCALRANKID": "3",
        "MPI_LOCALNRANKS": "4",
        "PMI_RANK": "7",
        "PMI_SIZE": "8",
    },
    "Slurm (srun --mpi=pmi2)": {"SLURM_LOCALID": "3", "SLURM_PROCID": "7", "PMI_RANK": "7"},
    "Slurm (srun --mpi=pmix)": {
        "SLURM_LOCALID": "3",
        "PMIX_RANK": "7",
        "PMIX_NAMESPACE": "slurm.pmix.5.0",
    },
    # mpirun inside a batch script: the script's SLURM_LOCALID (0 on every rank) is wrong.
    "Open MPI's mpirun under sbatch": {"SLURM_LOCALID": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "3"},
}


class FakeDriver:
    """The extension's CUDA side, answering as a driver that sees `devices` GPUs would."""

    def __init__(self, devices: int, loads: bool = True) -> None:
        self.devices, self.loads = devices, loads
        self.current: int | None = None
        self.rank_device: int | None = -1

    def cuda_info(self) -> dict:
        return {
            "driver": self.loads,
            "driver_error": None if self.loads else "libcuda.so.1: cannot open shared object",
            "devices": self.devices if self.loads else 0,
            "driver_version": 13000,
            "libcuda": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "libcuda_was_loaded": False,
            "libcudas_mapped": [],
        }

    def use_gpu(self, ordinal: int) -> None:
        assert 0 <= ordinal < self.devices, ordinal
        self.current = ordinal

    def set_rank_gpu(self, ordinal: int | None) -> None:
        self.rank_device = ordinal


@pytest.fixture
def start(monkeypatch):
    """Runs `before_mpi_init` as at import, on a faked driver of `devices` GPUs, with
    `environ` as the launcher's and JAX's platforms letting CUDA run; JAX's options come
    back as they were."""
    visible = gpu_choice.jax_option("jax_cuda_visible_devices")
    platforms = gpu_choice.jax_option("jax_platforms")
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # As where jaxmpi is imported first (the suite's own process has mpi4py loaded).
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)

    def run(devices: int, environ: dict | None = None, loads: bool = True, users: str = "all"):
        driver = FakeDriver(devices, loads)
        monkeypatch.setattr(gpu_choice, "_native", driver)
        monkeypatch.setattr(gpu_choice, "cuda_plugin", lambda: True)
        for name, value in (environ or {}).items():
            monkeypatch.setenv(name, value)
        jax.config.update("jax_platforms", "cuda,cpu")
        jax.config.update("jax_cuda_visible_devices", users)
        return gpu_choice.before_mpi_init(), driver

    yield run
    jax.config.update("jax_platforms", platforms)
    jax.config.update("jax_cuda_visible_devices", visible)


def test_jax_options_are_read_as_jax_allows_each():
    """jax_platforms refuses `config.read` (the import failure of every GPU user with JAX's
    CUDA plugin installed); jax_cuda_visible_devices is a plain flag."""
    assert gpu_choice.jax_option("jax_platforms") == jax.config.jax_platforms
    assert gpu_choice.jax_option("jax_cuda_visible_devices") == jax.config.read(
        "jax_cuda_visible_devices"
    )


@pytest.mark.parametrize("devices", [1, 4, 8])
@pytest.mark.parametrize("launcher", LAUNCHED)
def test_the_launchers_node_local_rank_chooses_before_mpi_init(start, launcher, devices):
    early, driver = start(devices, LAUNCHED[launcher])
    gpu_number = 3 % devices
    assert early.unused is None and early.local is not None and early.local.rank == 3
    assert (early.choice.gpu, early.choice.jax_option) == (gpu_number, str(gpu_number))
    assert not early.choice.needs_mpi
    # Made current (MPIs that set up CUDA in MPI_Init bind to it), shown to JAX and checked.
    assert (driver.current, driver.rank_device) == (gpu_number, gpu_number)
    assert gpu_choice.jax_option("jax_cuda_visible_devices") == str(gpu_number)
    assert early.choice.why.startswith(f"node-local rank 3 (from {early.local.source}) mod")


def test_a_launcher_without_the_node_local_rank_waits_for_mpi(start):
    early, driver = start(4, {"PMIX_RANK": "5", "PMIX_NAMESPACE": "prterun"})
    assert early.choice.needs_mpi and early.choice.gpu is None
    assert driver.current is None and driver.rank_device == -1  # nothing applied yet
    choice, when = gpu._after_mpi_init(early, (2, 4))
    assert (choice.gpu, driver.current, driver.rank_device) == (2, 2, 2)
    assert when.startswith("after MPI_Init (no launcher variable gave the node-local rank")


def test_mpi_overrules_a_launcher_that_said_another_place(start):
    early, driver = start(4, LAUNCHED["MPICH / Intel MPI (hydra)"])
    with pytest.warns(RuntimeWarning, match="the launcher said this rank is number 3"):
        choice, when = gpu._after_mpi_init(early, (1, 4))
    assert (choice.gpu, driver.current) == (1, 1)
    assert "MPI_LOCALRANKID=3, but MPI says node-local rank 1" in when


def test_a_launcher_that_agrees_with_mpi_keeps_the_early_choice(start):
    early, driver = start(8, LAUNCHED["Open MPI (prterun)"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choice, when = gpu._after_mpi_init(early, (3, 4))
    assert (choice, when, driver.current) == (early.choice, "before MPI_Init", 3)


def test_mpi_initialized_first_by_mpi4py_is_said(start, monkeypatch):
    """mpi4py imported before jaxmpi ran MPI_Init already: the choice is applied all the
    same, and `info` says it came after MPI_Init."""
    environ = LAUNCHED["Slurm (srun --mpi=pmi2)"]
    start(4, environ)  # the fixture's own set-up first: mpi4py not loaded
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", object())
    early, driver = start(4, environ)
    assert early.mpi_was_up and driver.current == 3
    choice, when = gpu._after_mpi_init(early, (3, 4))
    assert choice.gpu == 3
    assert when == "after MPI_Init (MPI was initialized before jaxmpi was imported)"


@pytest.mark.parametrize(
    ("users", "gpu_number", "current"),
    [("2", 2, 2), ("1,2", None, None)],
)
def test_the_users_own_jax_cuda_visible_devices_is_kept(start, users, gpu_number, current):
    early, driver = start(8, LAUNCHED["Open MPI (prterun)"], users=users)
    assert (early.choice.gpu, early.choice.jax_option) == (gpu_number, None)
    assert "(the user's)" in early.choice.why
    assert driver.current == current
    assert gpu_choice.jax_option("jax_cuda_visible_devices") == users


def test_jaxmpi_gpu_chooses_or_leaves_the_choice_to_jax(start, monkeypatch):
    monkeypatch.setenv("JAXMPI_GPU", "5")
    early, driver = start(8, LAUNCHED["Open MPI (prterun)"])
    assert (early.choice.gpu, driver.current) == (5, 5)
    monkeypatch.setenv("JAXMPI_GPU", "jax")
    early, driver = start(8, LAUNCHED["Open MPI (prterun)"])
    assert early.choice.gpu is None and driver.current is None
    monkeypatch.setenv("JAXMPI_GPU", "8")
    with pytest.raises(ValueError, match=r"JAXMPI_GPU='8': use a GPU number below 8"):
        start(8)
    monkeypatch.setenv("JAXMPI_GPU", "1")
    with pytest.raises(ValueError, match="choose different GPUs: set one of them"):
        start(8, users="2")


def test_no_driver_or_no_gpu_chooses_nothing(start):
    early, driver = start(4, LAUNCHED["Open MPI (prterun)"], loads=False)
    assert early.unused is None and early.choice is None and driver.current is None
    early, driver = start(0, LAUNCHED["Open MPI (prterun)"])
    assert early.choice.gpu is None and early.choice.why == "the driver sees no GPU"


def test_platforms_without_cuda_load_no_driver(start):
    start(4)
    jax.config.update("jax_platforms", "cpu")
    early = gpu_choice.before_mpi_init()
    assert early.unused == "JAX_PLATFORMS=cpu leaves CUDA out" and early.cuda == {}


def test_a_choice_after_jaxs_gpu_client_started_is_refused_by_name():
    ignored = primitives.gpu_choice_ignored
    assert ignored("1", True, [0, 1, 2, 3]).startswith("jaxmpi chose GPU 1 for this rank")
    assert "JAXMPI_GPU=jax" in ignored("1", True, [0, 1, 2, 3])
    assert ignored("1", True, [1]) is None  # it started on the chosen GPU: no harm
    assert ignored("1", False, [0, 1]) is None  # not started: the option takes
    assert ignored(None, True, [0, 1]) is None  # jaxmpi set nothing
    assert ignored("0", True, []) is None  # JAX runs no GPU client


# --- Start verdicts -------------------------------------------------------------------------


def test_start_verdicts_are_off_in_a_job_without_gpus():
    """No rank here can run ops on GPUs: no collective pays for an agreement."""
    assert not _native.start_verdicts()


def test_start_verdicts_on_change_no_result_of_cpu_ranks():
    """In a job where some rank can run ops on GPUs, every blocking collective of every
    rank first agrees that all can start it; CPU ranks take part, and nothing else changes
    (started collectives and point to point take no verdict)."""
    rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
    x = jnp.arange(4.0) + rank
    _native.set_start_verdicts(True)  # every rank runs this test: on alike
    try:
        total = jax.jit(lambda a: jaxmpi.allreduce(a, jaxmpi.SUM))(x)
        gathered = jaxmpi.allgather(x)
        jaxmpi.barrier()
        swapped = jaxmpi.sendrecv(x, x, source=(rank - 1) % size, dest=(rank + 1) % size)
        started = jaxmpi.wait(jaxmpi.iallreduce(x, jaxmpi.MAX))
        jax.block_until_ready((total, gathered, swapped, started))
    finally:
        _native.set_start_verdicts(False)
    ranks = jnp.arange(size, dtype=jnp.float32)[:, None]
    assert (total == size * jnp.arange(4.0) + ranks.sum()).all(), total
    assert (gathered == jnp.arange(4.0) + ranks).all(), gathered
    assert (swapped == jnp.arange(4.0) + (rank - 1) % size).all(), swapped
    assert (started == jnp.arange(4.0) + size - 1).all(), started


# --- Lowered for CUDA, on the CPU ----------------------------------------------------------


def _lowered_for_cuda(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _cuda_calls(size: int, rank: int) -> dict:
    """A call of each op jaxmpi lowers, by the op's name in the table: (the public function,
    its arguments). Rooted ops are rooted here (only lowered: no MPI call is made)."""
    x, rows = jnp.arange(4.0), jnp.ones((size, 4))
    ones = [1] * size
    return {
        "allreduce": (jaxmpi.allreduce, (x, jaxmpi.SUM), {}),
        "reduce": (jaxmpi.reduce, (x, jaxmpi.SUM, rank), {}),
        "scan": (jaxmpi.scan, (x, jaxmpi.SUM), {}),
        "exscan": (jaxmpi.exscan, (x, jaxmpi.SUM), {}),
        "reduce_scatter": (jaxmpi.reduce_scatter, (rows, jaxmpi.SUM), {}),
        "bcast": (jaxmpi.bcast, (x, rank), {}),
        "gather": (jaxmpi.gather, (x, rank), {}),
        "allgather": (jaxmpi.allgather, (x,), {}),
        "scatter": (jaxmpi.scatter, (rows, rank), {}),
        "alltoall": (jaxmpi.alltoall, (rows,), {}),
        "gatherv": (jaxmpi.gatherv, (x[:1], ones, rank), {}),
        "allgatherv": (jaxmpi.allgatherv, (x[:1], ones), {}),
        "scatterv": (jaxmpi.scatterv, (rows, ones, rank), {}),
        "alltoallv": (jaxmpi.alltoallv, (rows, ones, ones), {}),
        "send": (jaxmpi.send, (x, rank), {}),
        "recv": (jaxmpi.recv, (x,), {"source": rank}),
        "sendrecv": (jaxmpi.sendrecv, (x, x), {"source": rank, "dest": rank}),
        "barrier": (jaxmpi.barrier, (), {}),
        # Counts computed inside jit.
        "ragged_alltoallv": (
            jaxmpi.alltoallv,
            (rows, jnp.ones(size, jnp.int32), jnp.ones(size, jnp.int32)),
            {"recv_capacity": size},
        ),
    }


def _waited(start, *args, **kwargs):
    return jaxmpi.wait(start(*args, **kwargs))


def _call_lowered_for_cuda(function, args: tuple) -> str:
    """`function(*args)` lowered for CUDA, its array arguments traced (counts computed
    inside jit stay so) and the others fixed."""
    arrays = [i for i, a in enumerate(args) if isinstance(a, jax.Array)]

    def call(*traced):
        return function(*(dict(zip(arrays, traced)).get(i, a) for i, a in enumerate(args)))

    return _lowered_for_cuda(call, *(args[i] for i in arrays))


def test_every_op_lowers_for_cuda_to_its_own_target_or_refuses_saying_why():
    """What lowers for CUDA is what the table declares runs there (no `host_only` reason);
    every other op (a started one: its wait is never reached) refuses with its reason."""
    comm = jaxmpi.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    calls = _cuda_calls(size, rank)
    # The HLO pass's ops have no primitive (the pass writes their calls), and the wait
    # lowers only after a started op.
    lowered_by_jaxmpi = {
        name for name, s in primitives.SIGNATURES.items() if name in primitives.PRIMITIVES
    }
    assert set(calls) == {
        name for name in lowered_by_jaxmpi if not primitives.SIGNATURES[name]["starts"]
    } - {"wait"}, "a new op: give it a call here"
    lowered, refused = set(), set()
    for name, (function, args, kwargs) in calls.items():
        forms = {name: functools.partial(function, **kwargs)}
        started = primitives.SIGNATURES[name]["started"]
        if started:
            forms[started] = functools.partial(_waited, getattr(jaxmpi, started), **kwargs)
        for target, call in forms.items():
            why = primitives.SIGNATURES[target]["host_only"]
            if not why:
                assert f"@jaxmpi_{target}(" in _call_lowered_for_cuda(call, args), target
                lowered.add(target)
                continue
            with pytest.raises(NotImplementedError, match=re.escape(f"jaxmpi.{target}: {why}")):
                _call_lowered_for_cuda(call, args)
            refused.add(target)
    runs_on_gpus = {name for name, s in primitives.SIGNATURES.items() if not s["host_only"]}
    assert lowered == runs_on_gpus, lowered ^ runs_on_gpus
    assert len(lowered) == 18 and len(refused) == 15, (lowered, refused)
    # Lowering for a platform this process lacks claims no dispatch platform, and leaves
    # nothing for the exit's drain to wait on there: the CPU keeps running MPI ops.
    jax.effects_barrier()
    x = jnp.arange(4.0)
    assert float(jax.jit(lambda a: jaxmpi.allreduce(a, jaxmpi.SUM))(x)[1]) == size


# --- This process's own start-up, where JAX's CUDA plugin is installed ---------------------

with_cuda_plugin = pytest.mark.skipif(
    os.environ.get("JAXMPI_TEST_CUDA_PLUGIN") != "1",
    reason="JAX's CUDA plugin is installed only in ci/gpu_startup.sh's runs",
)


@with_cuda_plugin
def test_cuda_registers_exactly_the_ops_that_run_on_gpus():
    """The handlers registered for CUDA at import (this process has JAX's CUDA plugin): one
    for each op that lowers there, none for an op that cannot run there (a started op, the
    wait, run-time counts, the HLO pass's collectives, which run on XLA:CPU only)."""
    assert gpu.cuda["plugin"]
    registered = {target for target, _ in _native.handlers("CUDA")}
    on_host = {target for target, _ in _native.handlers("cpu")}
    runs_on_gpus = {name for name, s in primitives.SIGNATURES.items() if not s["host_only"]}
    assert registered == {f"jaxmpi_{name}" for name in runs_on_gpus}, registered
    assert registered < on_host and on_host == {f"jaxmpi_{name}" for name in primitives.SIGNATURES}
    for name in (
        "hlo_all_reduce",
        "hlo_communicators",
        "ragged_alltoallv",
        "wait",
        "iallreduce",
        "isend",
    ):
        assert f"jaxmpi_{name}" in on_host - registered, name
        assert primitives.SIGNATURES[name]["host_only"], name


@with_cuda_plugin
def test_the_cuda_plugin_is_found_and_the_reason_it_is_unused_is_said():
    from jaxmpi.__main__ import _cuda_line

    cuda = gpu.cuda
    assert gpu_choice.cuda_plugin() and cuda["plugin"]
    assert not jaxmpi.has_cuda_support() and jax.default_backend() == "cpu"
    if gpu_choice.excluded_by_platforms(gpu_choice.jax_option("jax_platforms")):
        assert cuda["unused"].endswith("leaves CUDA out"), cuda
    else:  # no GPU here: the driver does not load, and JAX falls back to the CPU
        assert cuda["unused"] is None and not cuda["driver"], cuda
        assert "libcuda" in cuda["driver_error"], cuda
    assert _cuda_line(cuda).startswith("not used (")
