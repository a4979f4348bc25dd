"""No hidden copies: what the compiled program does around an MPI call.

jaxmpi's promise is zero copy: reductions and bcast work in place on a loop's carry, a
rank that receives nothing gets its input back without XLA copying it, and a receive
lands in place whatever the program does with its template, even when the program keeps
using the input or the template. These tests read XLA's optimized HLO and count copies of
message-sized buffers; the loops are also run, and their results checked.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import RANK, SIZE, needs_ranks

# The compiled HLO, whatever the MPI and the number of ranks.
pytestmark = [pytest.mark.same_on_every_mpi, pytest.mark.same_at_every_size]

LEFT, RIGHT = (RANK - 1) % SIZE, (RANK + 1) % SIZE

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


def copies_of_shape(hlo: str, shape: tuple[int, ...]) -> int:
    """`copy` instructions (and copy fusions) whose result has exactly `shape`."""
    dims = ",".join(str(d) for d in shape)
    pattern = rf"\s*(?:ROOT )?(%\S+) = \w+\[{dims}\]\S* (copy|fusion)\("
    return sum(
        bool(m) and (m.group(2) == "copy" or "copy" in m.group(1))
        for m in (re.match(pattern, line) for line in hlo.splitlines())
    )


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
        lambda e, m: jax.lax.fori_loop(0, 3, step, (e, m)),
        everything,
        mine,
        donate=True,
    )
    if RANK != root:
        assert big_copies(hlo) == 0, hlo


# Ranks that receive nothing (or only need the input's shape), with the input still used
# after the call and the result used too: no copy of the input.
KEPT_ALIVE = {
    "reduce, away from the root": (
        lambda x: jaxmpi.reduce(x, jaxmpi.SUM, root=SIZE - 1),
        0,
    ),
    "gather, away from the root": (lambda x: jaxmpi.gather(x, root=SIZE - 1), 0),
    "bcast, at the root": (lambda x: jaxmpi.bcast(x, root=0), 0),
    "gatherv, away from the root": (
        lambda x: jaxmpi.gatherv(x.reshape(1, N), (1,) * SIZE, root=SIZE - 1),
        0,
    ),
}


def run_with_input_kept_alive(op, checked_rank: int):
    """Runs `op(x) * 3, x * 2` jitted, so the program still uses the input after the op,
    and checks that the input was doubled and, on `checked_rank`, that the compiled
    program copies nothing big. Returns the op's result times 3."""
    x = jnp.arange(N, dtype=jnp.float32)

    def program(x):
        return op(x) * 3, x * 2

    copies = big_copies(compiled(program, x))
    result, doubled = jax.jit(program)(x)
    assert np.array_equal(np.asarray(doubled), 2 * np.arange(N, dtype=np.float32))
    if RANK == checked_rank:
        assert copies == 0, compiled(program, x)
    return result


@needs_ranks(2)
@pytest.mark.parametrize("name", sorted(KEPT_ALIVE))
def test_input_kept_alive_is_not_copied(name):
    run_with_input_kept_alive(*KEPT_ALIVE[name])


@needs_ranks(2)
@pytest.mark.parametrize(
    "name, op",
    [
        ("bcast, away from the root", lambda x: jaxmpi.bcast(x, root=SIZE - 1)),
        (
            "scatter, away from the root",
            lambda x: jaxmpi.scatter(
                jnp.broadcast_to(x, (SIZE, N)) if RANK == SIZE - 1 else x, root=SIZE - 1
            ),
        ),
        (
            "sendrecv into a template",
            lambda x: jaxmpi.sendrecv(x + 1, x, source=LEFT, dest=RIGHT),
        ),
    ],
)
def test_template_kept_alive_is_not_copied(name, op):
    """A receive template the program keeps using is not copied: the op never reads it,
    so XLA does not even pass it to the call."""
    received = run_with_input_kept_alive(op, checked_rank=0)
    if name.startswith("sendrecv"):
        expected = 3 * (np.arange(N, dtype=np.float32) + 1)
    else:
        expected = 3 * np.arange(N, dtype=np.float32)
    assert np.array_equal(np.asarray(received), expected)


# --- Receive patterns in a loop: the HLO of the body copies no message, and the loop's
# results are right. `mine(r)` is the array rank r starts with.


def mine(rank: int) -> jnp.ndarray:
    return jnp.arange(N, dtype=jnp.float32) + rank * N


def send_and_recv(x, template):
    """A ring shift with a separate send and receive, ordered so that every send meets a
    posted receive (even ranks send first)."""
    if RANK % 2 == 0:
        jaxmpi.send(x, RIGHT)
        return jaxmpi.recv(template, LEFT)
    received = jaxmpi.recv(template, LEFT)
    jaxmpi.send(x, RIGHT)
    return received


STEPS = 3
ROOT = SIZE - 1

# name: (minimum ranks, body of the fori_loop, initial carry, expected carry after STEPS)
LOOPS = {
    "a = sendrecv(a, a)": (
        1,
        lambda i, c: (jaxmpi.sendrecv(c[0], c[0], source=LEFT, dest=RIGHT),),
        lambda: (mine(RANK),),
        lambda: (mine((RANK - STEPS) % SIZE),),
    ),
    "y = sendrecv(x, y)": (
        1,
        lambda i, c: (c[0], jaxmpi.sendrecv(c[0], c[1], source=LEFT, dest=RIGHT)),
        lambda: (mine(RANK), -mine(RANK)),
        lambda: (mine(RANK), mine(LEFT)),
    ),
    "y = sendrecv(x, zeros_like(x))": (
        1,
        lambda i, c: (c[0], jaxmpi.sendrecv(c[0], jnp.zeros_like(c[0]), LEFT, RIGHT)),
        lambda: (mine(RANK), -mine(RANK)),
        lambda: (mine(RANK), mine(LEFT)),
    ),
    "acc += sendrecv(x, t), t kept": (
        1,
        lambda i, c: (c[0], c[1], c[2] + jaxmpi.sendrecv(c[0], c[1], LEFT, RIGHT)),
        lambda: (mine(RANK), -mine(RANK), jnp.zeros(N, jnp.float32)),
        lambda: (mine(RANK), -mine(RANK), STEPS * mine(LEFT)),
    ),
    "acc += recv(zeros_like(x))": (
        2,
        lambda i, c: (c[0], c[1] + send_and_recv(c[0], jnp.zeros_like(c[0]))),
        lambda: (mine(RANK), jnp.zeros(N, jnp.float32)),
        lambda: (mine(RANK), STEPS * mine(LEFT)),
    ),
    "y = recv(y)": (
        2,
        lambda i, c: (c[0], send_and_recv(c[0], c[1])),
        lambda: (mine(RANK), -mine(RANK)),
        lambda: (mine(RANK), mine(LEFT)),
    ),
    "acc += recv(t), t kept": (
        2,
        lambda i, c: (c[0], c[1], c[2] + send_and_recv(c[0], c[1])),
        lambda: (mine(RANK), -mine(RANK), jnp.zeros(N, jnp.float32)),
        lambda: (mine(RANK), -mine(RANK), STEPS * mine(LEFT)),
    ),
    "y = scatter(y) away from the root": (
        2,
        lambda i, c: (c[0], jaxmpi.scatter(c[0] if RANK == ROOT else c[1], root=ROOT)),
        lambda: (jnp.stack([mine(r) for r in range(SIZE)]), -mine(RANK)),
        lambda: (jnp.stack([mine(r) for r in range(SIZE)]), mine(RANK)),
    ),
    "y = scatterv(y) away from the root": (
        2,
        lambda i, c: (
            c[0],
            jaxmpi.scatterv(c[0] if RANK == ROOT else c[1], (1,) * SIZE, root=ROOT),
        ),
        lambda: (jnp.stack([mine(r) for r in range(SIZE)]), -mine(RANK)[None]),
        lambda: (jnp.stack([mine(r) for r in range(SIZE)]), mine(RANK)[None]),
    ),
}


@pytest.mark.parametrize("name", list(LOOPS))
def test_receive_loops_copy_no_message(name):
    ranks, body, initial, expected = LOOPS[name]
    if SIZE < ranks:
        pytest.skip(f"needs at least {ranks} MPI ranks, job has {SIZE}")

    def loop(*carry):
        return jax.lax.fori_loop(0, STEPS, body, carry)

    hlo = compiled(loop, *initial(), donate=True)
    got = jax.jit(loop, donate_argnums=tuple(range(len(initial()))))(*initial())
    for k, (g, e) in enumerate(zip(got, expected())):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e), err_msg=f"carry {k}")
    if not (name.startswith("y = scatter") and RANK == ROOT):  # the root sends from a slice
        assert big_copies(hlo) == 0, hlo


def top_level(hlo: str):
    """(instruction, shape, opcode) of every instruction outside fused computations."""
    fused = False
    for line in hlo.splitlines():
        if line.endswith("{") and not line.startswith(" "):
            fused = line.startswith(("%fused", "fused"))
            continue
        m = re.match(r"\s*(?:ROOT )?(%\S+) = \w+\[([\d,]*)\]\S* ([\w-]+)\(", line)
        if m and not fused:
            yield (
                m.group(1),
                tuple(int(d) for d in m.group(2).split(",") if d),
                m.group(3),
            )


@needs_ranks(2)
def test_shallow_water_halo_exchange_copies_no_halo():
    """examples/shallow_water.py with the ranks in a row: each column halo, (3, ny), is
    sent and received through one buffer (`sendrecv(edge, edge)`), built once per step and
    never copied; the row halos, (3, nx + 2), whose templates are the wall rows, are not
    copied either."""
    from test_shallow_water import NX, NY, sw

    model = sw.Model(NX, NY, comm=jaxmpi.COMM_WORLD, px=SIZE, dtype=jnp.float64)
    (_, nxl), (_, nyl) = model.layout.x_block, model.layout.y_block
    hlo = model.steps.lower(model.initial_state(), jnp.int32(3)).compile().as_text()
    ops = list(top_level(hlo))
    columns = [
        op for op in ops if op[1] == (3, nyl) and op[2] not in ("get-tuple-element", "bitcast")
    ]
    copies = [op for op in ops if op[1] in ((3, nyl), (3, nxl + 2)) and op[2] == "copy"]
    assert (len(columns), copies) == (2, []), hlo
