"""jaxmpi's ops on a MeshComm (ranks are devices) against JAX's `ppermute`, through jaxmpi
and (`--collectives gloo`, a job of its own: jaxmpi refuses a MeshComm beside gloo) over
gloo: a halo exchange step on a 2-D domain split by rows over every device of the job
(periodic), inside `shard_map`, in whatever layout of processes x devices the launch gives
(XLA_FLAGS' --xla_force_host_platform_device_count sets the devices per process). With
one device per process, also `jaxmpi.sendrecv` on the MPI communicator, as before
MeshComm. `benches/bench_mesh_comm.sh` runs it at 4 x 1, 2 x 2 and 1 x 4.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        mpiexec -n 2 python benches/bench_mesh_comm.py [--rounds 7] [--steps 200]
        [--collectives jaxmpi|gloo]

Also an allreduce of `--allreduce` float32 per device (1 Mi, 4 MiB, by default) on the
MeshComm, and with one device per process on the MPI communicator: the reference the
MeshComm's is held to in the other layouts.

Each case is a jitted `fori_loop` of `--steps` steps (`--allreduce-steps` for the
allreduce); time per step is the slowest process's, best of `--rounds` (the cases
alternate within a round). Prints one line per case on process 0: `RESULT layout bytes
case microseconds` (bytes: the halo's, or the allreduce's per device).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmpi
from jaxmpi import distributed

try:  # public from JAX 0.7 on
    from jax import shard_map

    UNCHECKED = {"check_vma": False}
except ImportError:
    from jax.experimental.shard_map import shard_map

    UNCHECKED = {"check_rep": False}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--n", type=int, nargs="+", default=[64, 1024, 16384])
    parser.add_argument("--allreduce", type=int, default=1 << 20, help="float32 per device")
    parser.add_argument("--allreduce-steps", type=int, default=10)
    parser.add_argument(
        "--collectives",
        choices=("jaxmpi", "gloo"),
        default="jaxmpi",
        help="JAX's collectives' route; gloo times its ppermute alone (no MeshComm beside it)",
    )
    return parser.parse_args()


ARGS = _arguments()
if jaxmpi.COMM_WORLD.Get_size() > 1:
    distributed.initialize(collectives=ARGS.collectives)
DEVICES = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
N = len(DEVICES)
MESH = Mesh(np.array(DEVICES), ("x",))
# jaxmpi refuses a MeshComm beside gloo's collectives: nothing would order the two.
ON_GLOO = ARGS.collectives == "gloo" and jax.process_count() > 1
COMM = None if ON_GLOO else jaxmpi.MeshComm(MESH)
LAYOUT = f"{jax.process_count()}x{jax.local_device_count()}"


def _diffuse(u, above, below):
    up = jnp.concatenate([above, u[:-1]])
    down = jnp.concatenate([u[1:], below])
    return u + 0.1 * (up + down - 2 * u)


def halo_ppermute(u):
    to_down = [(r, (r + 1) % N) for r in range(N)]
    to_up = [(r, (r - 1) % N) for r in range(N)]
    return _diffuse(u, jax.lax.ppermute(u[-1:], "x", to_down), jax.lax.ppermute(u[:1], "x", to_up))


def halo_on(comm, up, down):
    def step(u):
        above = jaxmpi.sendrecv(u[-1:], u[:1], source=up, dest=down, comm=comm)
        below = jaxmpi.sendrecv(u[:1], u[-1:], source=down, dest=up, comm=comm)
        return _diffuse(u, above, below)

    return step


def _program(step, steps):
    body = lambda x: jax.lax.fori_loop(0, steps, lambda _, y: step(y), x)  # noqa: E731
    return jax.jit(shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P("x"), **UNCHECKED))


def allreduce_on(comm):
    # Scaled back by the rank count so that the values stay the same step after step.
    return lambda y: jaxmpi.allreduce(y, jaxmpi.SUM, comm=comm) * (1.0 / N)


def _time(program, x) -> float:
    jaxmpi.barrier()
    start = time.perf_counter()
    program(x).block_until_ready()
    mine = time.perf_counter() - start
    return float(jaxmpi.allreduce(np.float64(mine), jaxmpi.MAX))


def main() -> None:
    args = ARGS
    if ON_GLOO:
        cases = {"ppermute over gloo": halo_ppermute}
    else:
        route = "through jaxmpi" if jax.process_count() > 1 else "in one process"
        cases = {
            "MeshComm sendrecv": halo_on(COMM, lambda r: (r - 1) % N, lambda r: (r + 1) % N),
            f"ppermute {route}": halo_ppermute,
        }
        if jax.local_device_count() == 1:
            rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
            cases["MPI comm sendrecv"] = halo_on(None, (rank - 1) % size, (rank + 1) % size)
    for n in args.n:
        domain = np.random.default_rng(0).random((8 * N, n), np.float32)  # 8 rows a device
        x = jax.make_array_from_callback(
            domain.shape, NamedSharding(MESH, P("x")), domain.__getitem__
        )
        programs = {name: _program(step, args.steps) for name, step in cases.items()}
        for program in programs.values():
            program(x).block_until_ready()  # compile and warm up
        best = dict.fromkeys(programs, float("inf"))
        for _ in range(args.rounds):
            for name, program in programs.items():
                best[name] = min(best[name], _time(program, x) / args.steps)
        _report(best, 4 * n)
    if ON_GLOO:
        return
    reductions = {"MeshComm allreduce": allreduce_on(COMM)}
    if jax.local_device_count() == 1:
        reductions["MPI comm allreduce"] = allreduce_on(None)
    x = jax.make_array_from_callback(
        (N * args.allreduce,),
        NamedSharding(MESH, P("x")),
        lambda index: np.ones(args.allreduce, np.float32),
    )
    steps = args.allreduce_steps
    programs = {name: _program(step, steps) for name, step in reductions.items()}
    for program in programs.values():
        program(x).block_until_ready()
    best = dict.fromkeys(programs, float("inf"))
    for _ in range(args.rounds):
        for name, program in programs.items():
            best[name] = min(best[name], _time(program, x) / steps)
    _report(best, 4 * args.allreduce)


def _report(best: dict, size: int) -> None:
    if jax.process_index() == 0:
        for name, seconds in best.items():
            print(f"RESULT {LAYOUT} {size} {name} {seconds * 1e6:.1f}", flush=True)


if __name__ == "__main__":
    main()
