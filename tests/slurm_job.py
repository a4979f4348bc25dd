"""The job of tests/slurm_cases.sh, started by srun, by mpirun/mpiexec inside salloc, or by
srun in an sbatch script. Every rank checks what it sees; rank 0 prints a line per rank and
`SLURM JOB PASS`, or `SLURM JOB FAIL: ...` naming what was wrong (exit status 1).

usage: python tests/slurm_job.py --nodes N [--env NAME=VALUE]... [--disagree NAME]
                                 [--hold SECONDS]

Checked on every rank:
  world     the world holds every rank started (the launcher's count) on N distinct hosts
  local     MPI's node-local rank (MPI_COMM_TYPE_SHARED) is the rank's place among the
            ranks of its host, and equals the launcher's own (SLURM_LOCALID for srun's
            tasks, MPI_LOCALRANKID for hydra's, OMPI_COMM_WORLD_LOCAL_RANK for PRRTE's);
            the place jaxmpi reads before MPI_Init to choose the rank's GPU is the same,
            and with four GPUs listed for every task each rank of a node takes its own
  progress  jaxmpi's progress default follows the ranks per node: a thread where each
            rank has 2+ cores of its node, none where they fill it
  ops       jitted allreduce, allgather and a ring sendrecv across the nodes
  jax       jaxmpi.distributed.initialize(): JAX's process index and count are MPI's rank
            and size, and JAX's own Slurm detection (whose SLURM_* values are wrong for
            ranks that mpirun started) changed nothing (jax_cuda_visible_devices)
  sharded   a shard_map program: a halo by jaxmpi's sendrecv, a sum by JAX's psum, which
            runs over MPI (JAX's collectives: "mpi")
  env       every --env NAME=VALUE reached every rank; no disagreement was reported at
            import, or, with --disagree NAME, rank 0's warning names NAME
--hold SECONDS: then rounds of allreduce + sendrecv every 0.2 s for that long, rank 0
printing `holding: round N` (the fault cases stop the job meanwhile); exit status 3 if
nobody stopped it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import warnings

parser = argparse.ArgumentParser()
parser.add_argument("--nodes", type=int, required=True)
parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
parser.add_argument("--disagree", metavar="NAME")
parser.add_argument("--hold", type=float, default=0.0)
args = parser.parse_args()

import jax  # noqa: E402  (after the arguments: a usage error costs no JAX start)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

cuda_devices_before = jax.config.values["jax_cuda_visible_devices"]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import jaxmpi
    import jaxmpi.distributed
    from jaxmpi import _native
    from jaxmpi._binding import jax_collectives as _jax_collectives
    from jaxmpi._runtime import gpu_choice, library
import_warnings = [str(w.message) for w in caught if "jaxmpi" in str(w.message)]

rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
print(f"rank {rank}: pid {os.getpid()} on {socket.gethostname()}", flush=True)
env = os.environ
# The launcher's own view of the job: srun's tasks carry SLURM_PROCID/SLURM_LOCALID of
# their step; ranks of mpirun/mpiexec carry the launcher's, and SLURM_* of its daemons.
if "OMPI_COMM_WORLD_SIZE" in env:
    launcher, launched = "mpirun", int(env["OMPI_COMM_WORLD_SIZE"])
    launcher_local = env.get("OMPI_COMM_WORLD_LOCAL_RANK")
elif "MPI_LOCALRANKID" in env:
    launcher, launched, launcher_local = "mpiexec", int(env["PMI_SIZE"]), env["MPI_LOCALRANKID"]
else:
    launcher, launched = "srun", int(env.get("SLURM_STEP_NUM_TASKS", "0"))
    launcher_local = env.get("SLURM_LOCALID")

node_rank, node_size = _native.node_local_rank(_native.world())
progress = library.info["progress"]
cores = os.cpu_count() or 1
wanted_progress = "thread" if cores / node_size >= 2 else "none"

jaxmpi.distributed.initialize()
problems: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        problems.append(what)


check(size == launched, f"MPI's world has {size} ranks, {launcher} started {launched}")
check(str(node_rank) == launcher_local, f"{launcher}'s local rank is {launcher_local}")
before_init = gpu_choice.launcher_local_rank(env)
check(getattr(before_init, "rank", None) == node_rank, f"read before MPI_Init: {before_init}")
# srun --gres=gpu:4 without binding: CUDA_VISIBLE_DEVICES=0,1,2,3 for every task.
listed = {k: v for k, v in env.items() if k != "JAXMPI_GPU"} | {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
gpu = gpu_choice.plan(listed, 4, "all", before_init).gpu
check(gpu == node_rank % 4, f"with 4 GPUs listed for every task, GPU {gpu}")
check(progress == wanted_progress, f"progress {progress}, {node_size} ranks on {cores} cores")
check(
    (jax.process_index(), jax.process_count()) == (rank, size),
    f"JAX process {jax.process_index()} of {jax.process_count()}",
)
cuda_devices = jax.config.values["jax_cuda_visible_devices"]
check(cuda_devices == cuda_devices_before, f"jax_cuda_visible_devices became {cuda_devices!r}")
collectives = _jax_collectives.explain()[0]
check(collectives == "mpi", f"JAX's collectives run over {collectives}")
for setting in args.env:
    name, value = setting.split("=", 1)
    check(env.get(name) == value, f"{name}={env.get(name)!r}, launched with {value!r}")

# jaxmpi's ops across the nodes, jitted.
left, right = (rank - 1) % size, (rank + 1) % size


@jax.jit
def ops(x):
    total = jaxmpi.allreduce(x, jaxmpi.SUM)
    everyone = jaxmpi.allgather(x[:1])
    from_left = jaxmpi.sendrecv(x, x, source=left, dest=right)
    return total, everyone, from_left


total, everyone, from_left = ops(jnp.full(4, float(rank)))
check(np.all(np.asarray(total) == size * (size - 1) / 2), f"allreduce gave {total}")
check(np.array_equal(np.asarray(everyone)[:, 0], np.arange(size)), f"allgather gave {everyone}")
check(np.all(np.asarray(from_left) == left), f"sendrecv from rank {left} gave {from_left}")

# A shard_map program over every rank's device: a periodic halo by MPI, a sum by JAX.
try:
    from jax import shard_map
except ImportError:  # JAX < 0.7
    from jax.experimental.shard_map import shard_map
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

mesh = Mesh(np.array(jax.devices()), ("x",))


def relax(u):
    halo = jaxmpi.sendrecv(u[-1:], u[:1], source=left, dest=right)
    return halo, jax.lax.psum(jnp.sum(u), "x")


program = jax.jit(shard_map(relax, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())))
u = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), np.arange(2.0) + 2 * rank)
halo, whole = program(u)
check(float(halo.addressable_data(0)[0]) == 2 * left + 1, "shard_map: wrong halo")
check(float(whole) == sum(range(2 * size)), f"shard_map: psum gave {float(whole)}")

# Rank 0 judges: every rank's report, gathered over MPI.
mine = {
    "host": socket.gethostname(),
    "slurm": f"{env.get('SLURM_PROCID', '-')}/{env.get('SLURM_NTASKS', '-')}",
    "slurm_local": env.get("SLURM_LOCALID", "-"),
    "node": f"{node_rank}/{node_size}",
    "progress": progress,
    "problems": problems,
    "warnings": import_warnings,
}
width = 4096
data = json.dumps(mine).encode().ljust(width)
gathered = np.asarray(jaxmpi.allgather(jnp.frombuffer(data, np.uint8)))
reports = [json.loads(bytes(row).decode()) for row in gathered]
if rank == 0:
    hosts = [r["host"] for r in reports]
    failed = []
    for r, report in enumerate(reports):
        place = f"{hosts[:r].count(report['host'])}/{hosts.count(report['host'])}"
        if report["node"] != place:
            report["problems"].append(f"node-local rank {report['node']}, its place {place}")
        print(
            f"rank {r} on {report['host']}: MPI rank {r}/{size}, node-local {report['node']},"
            f" SLURM_PROCID/SLURM_NTASKS {report['slurm']} (what JAX's own Slurm detection "
            f"would use), SLURM_LOCALID {report['slurm_local']}, progress {report['progress']}"
            + "".join(f"; PROBLEM: {p}" for p in report["problems"])
        )
        failed += [f"rank {r}: {p}" for p in report["problems"]]
    if len(set(hosts)) != args.nodes:
        failed.append(f"{len(set(hosts))} hosts ({sorted(set(hosts))}), expected {args.nodes}")
    said = "\n".join(reports[0]["warnings"])
    if args.disagree:
        print(f"rank 0's warning: {said}")
        if args.disagree not in said:
            failed.append(f"no warning naming {args.disagree} at import")
    elif said:
        failed.append(f"a warning at import: {said}")
    print(f"SLURM JOB {'FAIL: ' + '; '.join(failed) if failed else 'PASS'}", flush=True)
    if failed:
        sys.exit(1)

if args.hold:
    start, rounds = time.monotonic(), 0
    x = jnp.full(1024, float(rank))
    step = jax.jit(
        lambda x: jaxmpi.sendrecv(jaxmpi.allreduce(x, jaxmpi.SUM) / size, x, left, right)
    )
    while time.monotonic() - start < args.hold:
        x = jax.block_until_ready(step(x))
        rounds += 1
        if rank == 0:
            print(f"holding: round {rounds}", flush=True)
        time.sleep(0.2)
    print(f"rank {rank}: still running after {args.hold} s: nobody stopped the job", flush=True)
    sys.exit(3)
