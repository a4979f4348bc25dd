"""How many communicators among processes the device-rank layer holds after many
programs, each a fresh compile: a 2-D mesh of every device in a random order (a random
factorization of their number), a psum along each axis, and a ppermute of a random
permutation along both. Every process of the job runs it; each prints, at the end, the
communicators it holds (`jaxmpi._native.device_communicators()`), the programs run and
the seconds taken; rank 0 checks every result against numpy as it goes.

    mpiexec -n 8 python benches/bench_communicators.py PROGRAMS [--seed 0]

With one device per process a group's devices are a set of processes, so the count is
bounded by the sets the programs can draw (at 8 processes: at most 247 spanning two or
more); the permutes' communicators are their processes' whatever the pattern. Past
`JAXMPI_MAX_COMMUNICATORS` (1024 by default) the program is refused on every rank, naming
it: this script reports the refusal and stops.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from jax import shard_map
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmpi
from jaxmpi import _native, distributed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("programs", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    distributed.initialize(collectives="jaxmpi")
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    n = len(devices)
    rank = jaxmpi.COMM_WORLD.Get_rank()
    rng = np.random.default_rng(args.seed)  # the same draws on every process
    factors = [f for f in range(1, n + 1) if n % f == 0]
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2) % 7
    t0 = time.perf_counter()
    done = 0
    for k in range(args.programs):
        order = rng.permutation(n)
        rows = int(rng.choice(factors))
        mesh = Mesh(np.array(devices)[order].reshape(rows, n // rows), ("a", "b"))
        perm = rng.permutation(n).tolist()
        spec = P(("a", "b"))

        def body(v, perm=perm):
            moved = jax.lax.ppermute(v, ("a", "b"), list(enumerate(perm)))
            return jax.lax.psum(v, "a") + jax.lax.psum(v, "b") * 10 + moved * 100

        program = jax.jit(shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
        sharding = NamedSharding(mesh, spec)
        try:
            out = program(jax.make_array_from_callback(x.shape, sharding, lambda i: x[i]))
            shard = out.addressable_shards[0]
            got = np.asarray(shard.data)
        except Exception as err:  # XLA's error type differs between JAX versions
            print(f"REFUSED rank {rank} at program {k}: {err}", flush=True)
            break
        blocks = x.reshape(rows, n // rows, 2)
        expected = (
            np.broadcast_to(blocks.sum(0, keepdims=True), blocks.shape)
            + 10 * np.broadcast_to(blocks.sum(1, keepdims=True), blocks.shape)
        ).reshape(n, 2)
        moved = np.zeros_like(x)
        moved[perm] = x
        expected = expected + 100 * moved
        if not np.array_equal(got, expected[shard.index]):
            raise SystemExit(f"rank {rank}, program {k}: {got} != {expected[shard.index]}")
        done += 1
    seconds = time.perf_counter() - t0
    held = _native.device_communicators()
    print(f"HELD rank {rank} {held} communicators after {done} programs, {seconds:.0f} s")


if __name__ == "__main__":
    main()
