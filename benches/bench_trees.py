"""A gradient pytree summed over the ranks three ways, in one run: one `jaxmpi.allreduce` of
the whole tree (one MPI call per dtype, `python/jaxmpi/_trees.py`), one `jaxmpi.allreduce`
per leaf (`tree_map`, as NetKet and mpi4jax users write it), and `psum` of the tree inside
`shard_map` (JAX's own collective, over whatever `jaxmpi.distributed.initialize()` picks
here: `python -m jaxmpi info`).

    mpiexec -bind-to core -n 2 python benches/bench_trees.py [--rounds 5] [--steps 50]
    mpiexec -bind-to core -n 2 python benches/bench_trees.py --sweep   # where packing pays

Bind each rank to a core of its own (MPICH's `-bind-to core`; Open MPI's mpirun binds by
default): unbound, XLA's pool threads (running a pytree's many small slices) wait for a
core while the other rank spins in MPI: 256 small leaves packed took 267 µs a step
unbound against 112 µs bound (RESULTS.md, "Pytrees").

The trees: the 8 leaves of a 4-layer MLP (64-256-256-256-10, its 256 x 256 weights
alone: `ALONE` bytes or more), the 64 of a small ResNet-like model (conv kernels 3x3 of
16 to 64 channels and their batch-norm scales and shifts), and 256 small leaves (a
transformer-like model's norms and biases: 64 to 256 floats each). `--sweep` times 64
leaves of one size, packed into one call, one call each, and as jaxmpi groups them, for
sizes from 64 B to 1 MiB: the packing's copies against the calls they save, which sets
`_trees.ALONE` and `_trees.GROUP`.

Each case is a jitted `fori_loop` of `--steps` iterations, each summing the tree and
scaling it back (so the values stay put); time per iteration is the slowest rank's, best
of `--rounds`, the cases alternating within each round. Prints Markdown tables on rank 0,
with each case's ratio to the tree's one call measured in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmpi
import jaxmpi.distributed
from jaxmpi import _trees

jaxmpi.distributed.initialize()

try:  # public from JAX 0.7 on
    from jax import shard_map

    UNCHECKED = {"check_vma": False}
except ImportError:
    from jax.experimental.shard_map import shard_map

    UNCHECKED = {"check_rep": False}

RANK, SIZE = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
MESH = Mesh(np.array(sorted(jax.devices(), key=lambda d: d.process_index)), ("x",))


def mlp() -> list[tuple[int, ...]]:
    widths = [64, 256, 256, 256, 10]
    return [s for a, b in itertools.pairwise(widths) for s in ((a, b), (b,))]


def resnet_like() -> list[tuple[int, ...]]:
    """16 blocks of (conv kernel, scale, shift, 1x1 projection): 64 leaves."""
    shapes = []
    for block in range(16):
        c = (16, 32, 48, 64)[block // 4]
        shapes += [(3, 3, c, c), (c,), (c,), (c, c)]
    return shapes


def many_small() -> list[tuple[int, ...]]:
    return [((64, 128, 256)[i % 3],) for i in range(256)]


MODELS = {
    "MLP, 8 leaves": mlp,
    "ResNet-like, 64 leaves": resnet_like,
    "256 small leaves": many_small,
}


def tree_of(shapes) -> list[jax.Array]:
    rng = np.random.default_rng(RANK)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]


def one_call(tree):
    return jax.tree.map(lambda g: g * (1.0 / SIZE), jaxmpi.allreduce(tree, jaxmpi.SUM))


def per_leaf(tree):
    return jax.tree.map(lambda g: jaxmpi.allreduce(g, jaxmpi.SUM) * (1.0 / SIZE), tree)


def psum(tree):
    return jax.tree.map(lambda g: g * (1.0 / SIZE), jax.lax.psum(tree, "x"))


def _loop(step, steps):
    return lambda tree: jax.lax.fori_loop(0, steps, lambda _, t: step(t), tree)


def local(step, steps):
    return jax.jit(_loop(step, steps)), lambda tree: tree


def sharded(step, steps):
    """The loop inside shard_map over the mesh of every rank's device: each rank's tree
    is its block (a leading axis of 1 added)."""

    def body(t):
        return jax.tree.map(lambda g: g[None], _loop(step, steps)(jax.tree.map(lambda g: g[0], t)))

    program = jax.jit(shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P("x"), **UNCHECKED))
    sharding = NamedSharding(MESH, P("x"))

    def make(tree):
        return jax.tree.map(
            lambda g: jax.make_array_from_process_local_data(sharding, np.asarray(g)[None]), tree
        )

    return program, make


def _time(program, tree) -> float:
    jaxmpi.barrier()
    start = time.perf_counter()
    jax.block_until_ready(program(tree))
    mine = time.perf_counter() - start
    return float(jaxmpi.allreduce(np.float64(mine), jaxmpi.MAX))


def best_times(cases: dict, tree, rounds: int, steps: int) -> dict[str, float]:
    """Seconds per iteration of each case, best of `rounds`, alternating."""
    inputs = {name: make(tree) for name, (_, make) in cases.items()}
    for name, (program, _) in cases.items():
        jax.block_until_ready(program(inputs[name]))  # compile and warm up
    best = {name: math.inf for name in cases}
    for _ in range(rounds):
        for name, (program, _) in cases.items():
            best[name] = min(best[name], _time(program, inputs[name]) / steps)
    return best


def models(rounds: int, steps: int) -> None:
    cases = {
        "jaxmpi.allreduce(tree)": local(one_call, steps),
        "jaxmpi.allreduce per leaf": local(per_leaf, steps),
        "psum(tree) in shard_map": sharded(psum, steps),
    }
    rows = []
    for model, shapes in MODELS.items():
        tree = tree_of(shapes())
        calls = len(_trees.Tree(tree, "bench").groups(0))
        kib = sum(g.size * 4 for g in tree) / 1024
        best = best_times(cases, tree, rounds, steps)
        reference = best["jaxmpi.allreduce(tree)"]
        for name, seconds in best.items():
            rows.append((model, f"{kib:.0f}", calls, name, seconds * 1e6, seconds / reference))
    if RANK == 0:
        print(f"{SIZE} ranks, jax {jax.__version__}, {steps} steps per loop, best of {rounds}")
        print("| tree | KiB | calls of the tree | implementation | µs per step | vs one call |")
        print("|---|---:|---:|---|---:|---:|")
        for model, kib, calls, name, micros, ratio in rows:
            print(f"| {model} | {kib} | {calls} | {name} | {micros:.1f} | {ratio:.2f}x |")


def sweep(rounds: int, steps: int) -> None:
    """64 float32 leaves of each size: packed into one call, one call each, and as jaxmpi
    groups them (`_trees.ALONE`, `_trees.GROUP`)."""
    rows = []
    for elements in (16, 256, 1024, 4096, 16384, 65536, 131072, 262144, 1 << 20):
        tree = tree_of([(elements,)] * 64)
        cases, default = {}, (_trees.ALONE, _trees.GROUP)
        for name, limits in (
            ("packed", (math.inf, math.inf)),
            ("one call each", (0, 0)),
            ("grouped", default),
        ):
            _trees.ALONE, _trees.GROUP = limits  # read when the loop is traced: compile now
            program = jax.jit(_loop(one_call, steps)).lower(tree).compile()
            cases[name] = (program, lambda t: t)
        _trees.ALONE, _trees.GROUP = default
        calls = len(_trees.Tree(tree, "bench").groups(0))
        best = best_times(cases, tree, rounds, steps)
        rows.append((elements * 4, calls, best))
    if RANK == 0:
        print(
            f"{SIZE} ranks, jax {jax.__version__}, 64 float32 leaves, {steps} steps, best of {rounds}"
        )
        print(
            "| bytes per leaf | packed, µs | one call each, µs | grouped (calls), µs | grouped vs each |"
        )
        print("|---:|---:|---:|---:|---:|")
        for size, calls, best in rows:
            p, a, g = (best[k] * 1e6 for k in ("packed", "one call each", "grouped"))
            print(f"| {size} | {p:.1f} | {a:.1f} | {g:.1f} ({calls}) | {g / a:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    (sweep if args.sweep else models)(args.rounds, args.steps)


if __name__ == "__main__":
    main()
