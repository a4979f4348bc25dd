"""jaxmpi's own ops in programs that hold JAX's collectives (through jaxmpi's pass, in
every layout of devices per process): in one body and across calls, the rooted ops (which
bind the root's result on every rank inside shard_map), and the refusal of an op whose
program follows the rank. Runs in the layouts' cells, as test_jax_collectives.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layouts import BLOCKS, LOCAL, N, blocks_of, check, per_block, put, smap

import jaxmpi
from helpers import RANK, SIZE


def test_jaxmpi_ops_and_jax_collectives_in_one_body_and_across_calls():
    if LOCAL > 1:
        pytest.skip("jaxmpi's own ops run with one device per process (issue 44)")
    x = blocks_of("float32")

    def body(a):
        s = jax.lax.psum(a, "i")
        t = jaxmpi.allreduce(a, jaxmpi.SUM)
        u = jax.lax.psum(t * 2, "i")
        return s + t + u

    got = smap(body)(put(x))
    total = per_block(x).sum(0)
    check(got, np.tile(total * (2 + 2 * N), (N, 1)), "psum beside allreduce")
    # Across calls: a jaxmpi op between two programs that hold JAX collectives.
    first = smap(lambda a: jax.lax.psum(a, "i"))(put(x))
    between = jaxmpi.allreduce(np.float32(RANK), jaxmpi.SUM)
    second = smap(lambda a: jax.lax.pmax(a, "i"))(first)
    check(second, np.tile(total, (N, 1)), "psum, allreduce, pmax")
    assert float(between) == SIZE * (SIZE - 1) / 2


def test_rooted_jaxmpi_ops_beside_jax_collectives():
    """Inside shard_map the rooted ops bind the root's result on every rank, as on a
    MeshComm: one program for every rank, so they run beside JAX's collectives (the pass
    puts every MPI call in one order). bcast gives the root's block everywhere, reduce the
    root's sum (the operand elsewhere), gather the root's stack (zeros elsewhere), scatter
    each rank its row of the root's table."""
    if LOCAL > 1:
        pytest.skip("jaxmpi's own ops run with one device per process (issue 44)")
    x = blocks_of("float32")
    blocks, root = per_block(x), N - 1
    total = blocks.sum(0)

    def together(a):
        summed = jax.lax.psum(a, "i")
        sent = jaxmpi.bcast(a * 2, root=root)
        reduced = jaxmpi.reduce(a, jaxmpi.SUM, root=root)
        stacked = jaxmpi.gather(a, root=root).reshape(N * a.shape[0], -1)[None]
        table = jnp.broadcast_to(a[None], (N, *a.shape)) + jnp.arange(N)[:, None, None]
        row = jaxmpi.scatter(table, root=root)
        return summed, sent, reduced, stacked, row, jax.lax.pmax(a, "i")

    outs = (BLOCKS,) * 6
    got = smap(together, out_specs=outs)(put(x))
    rows = x.shape[0] // N
    expected_reduced = x.copy()
    expected_reduced[root * rows : (root + 1) * rows] = total
    stacks = np.zeros((N, N * rows, x.shape[1]), np.float32)
    stacks[root] = x
    rows_of_root = np.concatenate([blocks[root] + r for r in range(N)])
    for value, expected, what in [
        (got[0], np.tile(total, (N, 1)), "psum"),
        (got[1], np.tile(blocks[root] * 2, (N, 1)), "bcast"),
        (got[2], expected_reduced, "reduce: the root's the sum, the others' their operand"),
        (got[3], stacks, "gather: the root's stack, zeros elsewhere"),
        (got[4], rows_of_root, "scatter: row r of the root's table"),
        (got[5], np.tile(blocks.max(0), (N, 1)), "pmax"),
    ]:
        check(value, expected, what)


def test_a_jaxmpi_op_whose_program_follows_the_rank_is_refused_beside_jax_collectives():
    """scatterv with static counts gives each rank its own rows, so each rank's program
    differs: beside a psum it is refused when compiled, naming it."""
    if LOCAL > 1:
        pytest.skip("jaxmpi's own ops run with one device per process (issue 44)")
    counts = [1] * SIZE
    x = put(blocks_of("float32"))

    def together(a):
        send = a[:1].repeat(SIZE, 0) if RANK == 0 else a[:1]  # elsewhere, a template
        return jax.lax.psum(a, "i")[:1] + jaxmpi.scatterv(send, counts, 0)

    with pytest.raises(Exception) as caught:
        smap(together)(x)
    message = str(caught.value)
    assert "jaxmpi.scatterv gives each rank another program" in message, message
    assert "in a jitted function of its own" in message, message
