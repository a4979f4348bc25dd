"""No hidden copies: what the compiled program does around an MPI call.

jaxmpi's promise is zero copy: reductions and bcast work in place on a loop's carry, and a
rank that receives nothing gets its input back without XLA copying it, even when the
program keeps using the input. These tests read XLA's optimized HLO and count copies of
message-sized buffers.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import jaxmpi
import numpy as np
import pytest
from conftest import RANK, SIZE, needs_ranks

N = 4096  # elements: far above anything XLA would copy for its own bookkeeping


def big_copies(hlo: str) -> int:
    """`copy` instructions (and copy fusions) of at least N elements, anywhere."""
    count = 0
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?(%\S+) = \w+\[([\d,]*)\]\S* (copy|fusion)\(", line)
        if m and (m.group(3) == "copy" or "copy" in m.group(1)):
            elements = int(np.prod([int(d) for d in m.group(2).split(",") if d] or [1]))
            count += elements >= N
    return count


def compiled(f, *args, donate=False) -> str:
    jitted = jax.jit(f, donate_argnums=tuple(range(len(args))) if donate else ())
    return jitted.lower(*args).compile().as_text()


# Ops whose result replaces their input, as `x = op(x)` in a fori_loop: MPI works in place.
IN_PLACE = {
    "allreduce": lambda x: jaxmpi.allreduce(x, jaxmpi.SUM),
    "reduce": lambda x: jaxmpi.reduce(x, jaxmpi.SUM, root=0),
    "scan": lambda x: jaxmpi.scan(x, jaxmpi.SUM),
    "exscan": lambda x: jaxmpi.exscan(x, jaxmpi.SUM),
    "bcast": lambda x: jaxmpi.bcast(x, root=0),
}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_loop_carry_is_not_copied(name):
    op = IN_PLACE[name]
    x = jnp.ones(N, jnp.float32)
    hlo = compiled(lambda x: jax.lax.fori_loop(0, 3, lambda i, x: op(x), x), x, donate=True)
    assert big_copies(hlo) == 0, hlo


def test_sendrecv_receives_into_the_carry():
    """A halo exchange as a simulation writes it: the received array replaces the carried
    one; the send buffer stays."""

    def step(i, carry):
        x, halo = carry
        right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
        return x, jaxmpi.sendrecv(x, halo, source=left, dest=right)

    x = jnp.ones(N, jnp.float32)
    hlo = compiled(lambda x, h: jax.lax.fori_loop(0, 3, step, (x, h)), x, x + 1, donate=True)
    assert big_copies(hlo) == 0, hlo


@needs_ranks(2)
@pytest.mark.parametrize("name", ["scatter", "scatterv"])
def test_scatter_receives_into_its_template(name):
    """Away from the root the template is the receive buffer, as recv's: a loop that
    scatters into its carry copies nothing."""
    root = SIZE - 1

    def step(i, carry):
        everything, mine = carry
        if name == "scatter":
            received = jaxmpi.scatter(everything if RANK == root else mine, root=root)
        else:
            sent = everything if RANK == root else mine
            received = jaxmpi.scatterv(sent, (1,) * SIZE, root=root)
        return everything, received

    everything = jnp.ones((SIZE, N), jnp.float32)
    mine = jnp.zeros((N,) if name == "scatter" else (1, N), jnp.float32)
    hlo = compiled(
        lambda e, m: jax.lax.fori_loop(0, 3, step, (e, m)), everything, mine, donate=True
    )
    if RANK != root:
        assert big_copies(hlo) == 0, hlo


# Ranks that receive nothing (or only need the input's shape), with the input still used
# after the call and the result used too: no copy of the input.
KEPT_ALIVE = {
    "reduce, away from the root": (lambda x: jaxmpi.reduce(x, jaxmpi.SUM, root=SIZE - 1), 0),
    "gather, away from the root": (lambda x: jaxmpi.gather(x, root=SIZE - 1), 0),
    "bcast, at the root": (lambda x: jaxmpi.bcast(x, root=0), 0),
    "gatherv, away from the root": (
        lambda x: jaxmpi.gatherv(x.reshape(1, N), (1,) * SIZE, root=SIZE - 1),
        0,
    ),
}


@needs_ranks(2)
@pytest.mark.parametrize("name", sorted(KEPT_ALIVE))
def test_input_kept_alive_is_not_copied(name):
    op, checked_rank = KEPT_ALIVE[name]
    x = jnp.arange(N, dtype=jnp.float32)

    def program(x):
        return op(x) * 3, x * 2

    copies = big_copies(compiled(program, x))
    _, doubled = jax.jit(program)(x)
    assert np.array_equal(np.asarray(doubled), 2 * np.arange(N, dtype=np.float32))
    if RANK == checked_rank:
        assert copies == 0, compiled(program, x)
