"""The particle migration step of examples/particles.py at 1 Ki to 1 Mi particles, with the
three ways a user has to exchange counts computed inside jit, in the same run:

* ragged: counts exchanged with one `alltoall`, the rows with one `alltoallv` with
  `recv_capacity=` (the example's step), all inside one jitted `fori_loop`;
* padded: the same inside jit with static shapes only: every rank's block for every rank
  padded to the most it could ever be (all its particles), one `alltoall` of the padded
  blocks, then the received rows compacted;
* mpi4py: the drift and sort jitted, the exchange outside jit (device to host,
  `Alltoall` of the counts and `Alltoallv` of the rows with mpi4py, host to device).

    mpiexec -n 2 python benches/bench_ragged.py [--steps 20] [--rounds 3] [--json OUT.json]
                                                [--plot OUT.png]

Each rank holds half the particles in a buffer of twice that (the capacity); velocities
move about 1 % of them across a slab edge per step. One measurement: a barrier, `steps`
steps, the slowest rank's time / steps; the best of `rounds` rounds, the three methods
rotating within each round. Prints one line per size with the times and the ratios
padded / ragged and mpi4py / ragged; first, the cost of the run-time path alone: one
alltoallv of one row per rank with static counts against the same counts traced.
--json writes the times per size, --plot draws them (benches/plots.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import jaxmpi

_path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "particles.py"
_spec = importlib.util.spec_from_file_location("particles_example", _path)
particles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(particles)

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
X = particles.X


def sort_by_owner(rows, n, capacity):
    """The drift, then rows sorted by the rank that owns them now; counts per rank."""
    rows = rows.at[:, X].set(particles.drift(jnp, rows))
    valid = jnp.arange(capacity) < n
    dest = jnp.where(valid, particles.owner(rows[:, X], SIZE), SIZE)
    order = jnp.argsort(dest, stable=True)
    counts = jnp.bincount(dest, length=SIZE + 1)[:SIZE].astype(jnp.int32)
    return rows[order], counts


def ragged_loop(capacity, steps):
    step = particles.make_step(capacity)
    return jax.jit(lambda rows, n: jax.lax.fori_loop(0, steps, lambda _, s: step(*s), (rows, n)))


def padded_loop(capacity, steps):
    """Static shapes only: each destination's block padded to `capacity` rows."""
    slot = jnp.arange(capacity)

    def step(_, state):
        rows, n = state
        ordered, counts = sort_by_owner(rows, n, capacity)
        starts = jnp.cumsum(counts) - counts
        index = jnp.minimum(starts[:, None] + slot, capacity - 1)
        blocks = ordered[index]  # (SIZE, capacity, 3)
        got = jaxmpi.alltoall(blocks)
        got_counts = jaxmpi.alltoall(counts)
        keep = (slot < got_counts[:, None]).reshape(-1)
        # Compacted: the kept rows first, in rank order (a stable sort on "not kept").
        packed = got.reshape(-1, 3)[jnp.argsort(~keep, stable=True)][:capacity]
        return packed, jnp.sum(got_counts, dtype=jnp.int32)

    return jax.jit(lambda rows, n: jax.lax.fori_loop(0, steps, step, (rows, n)))


def mpi4py_loop(capacity, steps):
    sort = jax.jit(lambda rows, n: sort_by_owner(rows, n, capacity))

    def run(rows, n):
        for _ in range(steps):
            ordered, counts = jax.device_get(sort(rows, n))
            recv_counts = np.empty(SIZE, np.int32)
            COMM.Alltoall(counts, recv_counts)
            out = np.zeros((capacity, 3), np.float32)
            send_displs = np.cumsum(counts) - counts
            recv_displs = np.cumsum(recv_counts) - recv_counts
            COMM.Alltoallv(
                [ordered, (counts * 3, send_displs * 3), MPI.FLOAT],
                [out, (recv_counts * 3, recv_displs * 3), MPI.FLOAT],
            )
            rows, n = jax.device_put(out), np.int32(recv_counts.sum())
        return rows, n

    return run


def exchange_cost(calls: int, rounds: int) -> None:
    """One alltoallv of 1 float32 row per rank, `calls` times in a jitted fori_loop:
    static counts against the same counts as traced arrays (what the run-time path and
    its two checking collectives add)."""
    ones = np.ones(SIZE, np.int32)
    static = tuple(ones.tolist())

    def loop(exchange):
        return jax.jit(lambda x, c: jax.lax.fori_loop(0, calls, lambda _, y: exchange(y, c), x))

    methods = {
        "static": loop(lambda y, c: jaxmpi.alltoallv(y, static, static)),
        "run-time": loop(lambda y, c: jaxmpi.alltoallv(y, c, c, recv_capacity=SIZE)),
    }
    x = jnp.ones((SIZE, 1), jnp.float32)
    best = dict.fromkeys(methods, float("inf"))
    for _ in range(rounds):
        for name, run in methods.items():
            jax.block_until_ready(run(x, ones))
            best[name] = min(best[name], measure(run, x, ones) / calls)
    if RANK == 0:
        print(
            f"alltoallv of 1 row per rank: static {best['static'] * 1e6:.2f}us, run-time "
            f"{best['run-time'] * 1e6:.2f}us ({best['run-time'] / best['static']:.2f}x)"
        )


def measure(run, rows, n) -> float:
    COMM.Barrier()
    t0 = time.perf_counter()
    jax.block_until_ready(run(rows, n))
    return COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-particles", type=int, default=1 << 20)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", help="write the times per size there")
    parser.add_argument("--plot", help="draw them there (PNG)")
    args = parser.parse_args()
    table = []
    exchange_cost(args.calls, args.rounds)
    sizes = [1 << k for k in range(10, 21, 2) if 1 << k <= args.max_particles]
    if RANK == 0:
        print(f"particle migration step, {SIZE} ranks, time per step (best of {args.rounds})")
        print(
            f"{'particles':>10} {'ragged':>10} {'padded':>10} {'mpi4py':>10}  padded/ragged  mpi4py/ragged"
        )
    for total in sizes:
        capacity = 2 * total // SIZE
        rows, n = particles.local_start(particles.initial(total), capacity, RANK, SIZE)
        methods = {
            "ragged": ragged_loop(capacity, args.steps),
            "padded": padded_loop(capacity, args.steps),
            "mpi4py": mpi4py_loop(capacity, args.steps),
        }
        finals = {name: jax.device_get(run(rows, n)) for name, run in methods.items()}  # warm-up
        for name, (out, count) in finals.items():  # the three agree
            np.testing.assert_array_equal(out[:count], finals["ragged"][0][:count], err_msg=name)
        best = dict.fromkeys(methods, float("inf"))
        names = list(methods)
        for r in range(args.rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                best[name] = min(best[name], measure(methods[name], rows, n) / args.steps)
        if RANK == 0:
            us = {k: v * 1e6 for k, v in best.items()}
            table.append({"particles": total, **{f"{k}_us": v for k, v in us.items()}})
            print(
                f"{total:>10} {us['ragged']:>8.1f}us {us['padded']:>8.1f}us {us['mpi4py']:>8.1f}us"
                f"  {best['padded'] / best['ragged']:>13.2f}  {best['mpi4py'] / best['ragged']:>13.2f}",
                flush=True,
            )
    if RANK == 0:
        data = {"ranks": SIZE, "steps": args.steps, "rounds": args.rounds, "rows": table}
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(data, indent=1))
        if args.plot:
            import plots  # benches/plots.py, beside this file

            plots.ragged(data, pathlib.Path(args.plot))


if __name__ == "__main__":
    main()
