"""jaxmpi inside JAX's sharded programs against JAX's own collectives (gloo on the CPU),
in one run: a halo exchange on a 2-D domain (rows split over the ranks, periodic) done
three ways -- `ppermute` inside shard_map, `jaxmpi.sendrecv` inside shard_map, and
`jaxmpi.sendrecv` in a plain jitted function on the local block (no jax.distributed
program: the way before shard_map support) -- and an allreduce per iteration, `psum` vs
`jaxmpi.allreduce` inside shard_map, at 1, 4 Ki and 4 Mi float32 elements.

    mpiexec -n 2 python benches/bench_sharded.py [--rounds 5] [--steps 100] [--n 512]

Each case is a jitted `fori_loop` of `--steps` iterations; time per iteration is the
slowest rank's, best of `--rounds` (the cases alternate within a round). Prints a Markdown
table on rank 0.
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
import jaxmpi.distributed

# JAX's collectives on gloo, as before they could run over MPI: this bench compares jaxmpi's
# ops with them; bench_jax_collectives.py measures JAX's collectives over MPI.
jaxmpi.distributed.initialize(collectives="gloo")

# psum's result is replicated, the loop carry varies: shard_map's type checks are off for
# every case alike.
try:  # public from JAX 0.7 on
    from jax import shard_map

    UNCHECKED = {"check_vma": False}
except ImportError:
    from jax.experimental.shard_map import shard_map

    UNCHECKED = {"check_rep": False}

RANK, SIZE = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
UP, DOWN = (RANK - 1) % SIZE, (RANK + 1) % SIZE
MESH = Mesh(np.array(jax.devices()), ("x",))
TO_DOWN = [(r, (r + 1) % SIZE) for r in range(SIZE)]
TO_UP = [(r, (r - 1) % SIZE) for r in range(SIZE)]


def _diffuse(u, above, below):
    """One explicit diffusion step given the halo rows from the neighbours."""
    up = jnp.concatenate([above, u[:-1]])
    down = jnp.concatenate([u[1:], below])
    return u + 0.1 * (up + down - 2 * u)


def halo_ppermute(u):
    return _diffuse(u, jax.lax.ppermute(u[-1:], "x", TO_DOWN), jax.lax.ppermute(u[:1], "x", TO_UP))


def halo_jaxmpi(u):
    above = jaxmpi.sendrecv(u[-1:], u[:1], source=UP, dest=DOWN)
    below = jaxmpi.sendrecv(u[:1], u[-1:], source=DOWN, dest=UP)
    return _diffuse(u, above, below)


def allreduce_psum(y):
    return jax.lax.psum(y, "x") * (1.0 / SIZE)


def allreduce_jaxmpi(y):
    return jaxmpi.allreduce(y, jaxmpi.SUM) * (1.0 / SIZE)


def _loop(step, steps):
    return lambda x: jax.lax.fori_loop(0, steps, lambda _, y: step(y), x)


def _sharded(step, steps):
    """The loop inside shard_map, over a global array: (program, input)."""
    body = _loop(step, steps)
    program = jax.jit(shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P("x"), **UNCHECKED))
    return program, lambda local: jax.make_array_from_process_local_data(
        NamedSharding(MESH, P("x")), local
    )


def _local(step, steps):
    """The loop in a plain jitted function on this rank's block."""
    return jax.jit(_loop(step, steps)), jnp.asarray


def _time(program, x) -> float:
    jaxmpi.barrier()
    start = time.perf_counter()
    program(x).block_until_ready()
    mine = time.perf_counter() - start
    return float(jaxmpi.allreduce(np.float64(mine), jaxmpi.MAX))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--n", type=int, default=512, help="the domain block is n x n per rank")
    args = parser.parse_args()
    steps = args.steps
    groups = {
        f"halo exchange, {args.n} x {args.n} per rank": (
            np.random.default_rng(RANK).random((args.n, args.n), np.float32),
            {
                "ppermute in shard_map": _sharded(halo_ppermute, steps),
                "jaxmpi.sendrecv in shard_map": _sharded(halo_jaxmpi, steps),
                "jaxmpi.sendrecv, plain jit": _local(halo_jaxmpi, steps),
            },
        )
    }
    for label, n in (("1", 1), ("4 Ki", 4096), ("4 Mi", 4 << 20)):
        groups[f"allreduce of {label} float32"] = (
            np.ones(n, np.float32),
            {
                "psum in shard_map": _sharded(allreduce_psum, steps),
                "jaxmpi.allreduce in shard_map": _sharded(allreduce_jaxmpi, steps),
            },
        )
    rows = []
    for group, (local, cases) in groups.items():
        inputs = {name: make(local) for name, (_, make) in cases.items()}
        for name, (program, _) in cases.items():
            program(inputs[name]).block_until_ready()  # compile and warm up
        best = {name: float("inf") for name in cases}
        for _ in range(args.rounds):
            for name, (program, _) in cases.items():
                best[name] = min(best[name], _time(program, inputs[name]) / steps)
        reference = next(iter(best.values()))
        for name, seconds in best.items():
            rows.append((group, name, seconds * 1e6, seconds / reference))
    if RANK == 0:
        print(f"{SIZE} ranks, jax {jax.__version__}, {steps} steps per loop, best of {args.rounds}")
        print("| case | implementation | µs per iteration | vs the first |")
        print("|---|---|---:|---:|")
        for group, name, micros, ratio in rows:
            print(f"| {group} | {name} | {micros:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
