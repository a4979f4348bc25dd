"""Particles drifting through a 1-D domain decomposition, migrating every step.

The periodic interval [0, 1) is cut into one slab per rank; each rank holds the
particles inside its slab in a fixed-size buffer (`capacity` rows of id, position,
velocity; the first `n` rows are particles, the rest padding). One jitted step moves
every particle, works out which rank owns it now, and migrates the particles that left:
one `alltoall` exchanges how many rows go to each rank, one `alltoallv` with those counts
(computed inside jit, so `recv_capacity=` gives the room) moves them. `lax.fori_loop` runs
the steps, so the counts change every iteration inside one compiled loop.

    mpirun -n 2 python examples/particles.py                      # checks a serial run
    mpirun -n 4 python examples/particles.py --particles 100000 --steps 50

At the end every rank's particles are gathered (`allgatherv`, counts again computed
inside jit) and compared with the same motion computed serially with numpy.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi

ID, X, V = 0, 1, 2  # the columns of a particle's row
DT = np.float32(0.01)


def initial(particles: int, seed: int = 0) -> np.ndarray:
    """Every particle's row (id, position, velocity), float32; ids are exact up to 2^24."""
    rng = np.random.default_rng(seed)
    x = rng.random(particles, dtype=np.float32)
    v = rng.uniform(-1, 1, particles).astype(np.float32)
    return np.stack([np.arange(particles, dtype=np.float32), x, v], axis=1)


def drift(xp, rows):
    """One step of motion with periodic wrap (numpy for the serial run, jax for jit)."""
    x = rows[:, X] + rows[:, V] * DT
    x = xp.where(x >= 1, x - 1, x)
    x = xp.where(x < 0, x + 1, x)
    return x


def owner(x, size: int):
    return jnp.clip(jnp.floor(x * size).astype(jnp.int32), 0, size - 1)


def make_step(capacity: int, comm=None):
    """`step(rows, n)`: the particles after one drift and migration, and their number."""
    size = (comm or jaxmpi.COMM_WORLD).Get_size()

    def step(rows, n):
        rows = rows.at[:, X].set(drift(jnp, rows))
        valid = jnp.arange(capacity) < n
        dest = jnp.where(valid, owner(rows[:, X], size), size)  # padding sorts last
        order = jnp.argsort(dest, stable=True)
        send_counts = jnp.bincount(dest, length=size + 1)[:size].astype(jnp.int32)
        recv_counts = jaxmpi.alltoall(send_counts, comm=comm)
        moved = jaxmpi.alltoallv(
            rows[order], send_counts, recv_counts, recv_capacity=capacity, comm=comm
        )
        return moved, jnp.sum(recv_counts, dtype=jnp.int32)

    return step


def local_start(all_rows: np.ndarray, capacity: int, rank: int, size: int):
    """This rank's particles of `all_rows` (those in its slab), padded to `capacity`."""
    mine = all_rows[np.asarray(owner(jnp.asarray(all_rows[:, X]), size)) == rank]
    buffer = np.zeros((capacity, 3), np.float32)
    buffer[: len(mine)] = mine
    return buffer, np.int32(len(mine))


def serial(all_rows: np.ndarray, steps: int) -> np.ndarray:
    rows = all_rows.copy()
    for _ in range(steps):
        rows[:, X] = drift(np, rows)
    return rows


def run(particles: int, steps: int, capacity: int | None = None, comm=None):
    """Runs the decomposed model; returns (every particle gathered and sorted by id,
    the serial run's rows, this rank's own particles)."""
    comm = comm or jaxmpi.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    capacity = capacity or particles
    all_rows = initial(particles)
    rows, n = local_start(all_rows, capacity, rank, size)
    step = make_step(capacity, comm)

    @jax.jit
    def simulate(rows, n):
        rows, n = jax.lax.fori_loop(0, steps, lambda _, s: step(*s), (rows, n))
        counts = jaxmpi.allgather(n, comm=comm)
        everyone = jaxmpi.allgatherv(rows, counts, recv_capacity=particles, comm=comm)
        return rows, n, everyone

    with jaxmpi.raise_mpi_errors():
        rows, n, everyone = jax.device_get(simulate(rows, n))
    everyone = everyone[np.argsort(everyone[:, ID])]
    return everyone, serial(all_rows, steps), rows[:n]


def check(everyone: np.ndarray, expected: np.ndarray) -> None:
    """The same particles with the same velocities, at the same positions up to rounding
    (XLA fuses the drift into one multiply-add; numpy rounds twice), measured around the
    periodic interval."""
    np.testing.assert_array_equal(everyone[:, [ID, V]], expected[:, [ID, V]])
    apart = (everyone[:, X] - expected[:, X] + 0.5) % 1 - 0.5
    np.testing.assert_allclose(apart, 0, atol=1e-4)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--particles", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv)
    rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
    everyone, expected, mine = run(args.particles, args.steps)
    check(everyone, expected)
    in_slab = np.asarray(owner(jnp.asarray(mine[:, X]), size)) == rank
    assert in_slab.all(), "a particle is on a rank that does not own its position"
    if rank == 0:
        print(
            f"{args.particles} particles, {args.steps} steps on {size} ranks: "
            "the same positions as the serial run"
        )


if __name__ == "__main__":
    main()
