"""jax.vmap of every op: the same result as the unbatched op applied to each batch element
in turn (a Python loop, one call per element), for batch axes at the front, in the middle
and at the end, with unbatched (in_axes=None) operands mixed in, eagerly and under jit;
and ONE MPI call for the whole batch.

Batching is the same on every rank (the same in_axes, the same batch size), so every rank
makes the same calls. Element b of rank r's batch is different for every (r, b).
"""

from __future__ import annotations

from collections import Counter

import jax
import numpy as np
import pytest

import jaxmpi
from helpers import RANK, SIZE, assert_array, p2p_partner, rank_data

# Batching rules are JAX's and jaxmpi's, whatever the MPI; the number of ranks
# enters.
pytestmark = pytest.mark.same_on_every_mpi

ROOT = SIZE - 1
BATCH = 3
LEFT, RIGHT = (RANK - 1) % SIZE, (RANK + 1) % SIZE
COUNTS = tuple((r + 2) % 3 for r in range(SIZE))  # 2, 0, 1, 2, ...: a zero from 2 ranks on
SEND_COUNTS = tuple((RANK + 2 * s + 1) % 3 for s in range(SIZE))
RECV_COUNTS = tuple((s + 2 * RANK + 1) % 3 for s in range(SIZE))


def element(b: int, shape, dtype="float32", salt: int = 0) -> np.ndarray:
    """Batch element `b` of this rank's input: unique per (rank, element, salt)."""
    return rank_data(RANK + SIZE * (b + BATCH * salt), dtype, shape)


# ---------------------------------------------------------------------------------------
# Every op: a function of per-element arguments, and how to make element b's arguments
# (same number of dimensions on every rank, at least 1, so every in_axes fits)
# ---------------------------------------------------------------------------------------

SUM = jaxmpi.SUM


def _pair(x, t):
    """send and recv between partners: the even rank sends first."""
    partner = p2p_partner()
    if RANK % 2 == 0:
        jaxmpi.send(x, partner, tag=5)
        return jaxmpi.recv(t, partner, tag=5)
    received = jaxmpi.recv(t, partner, tag=5)
    jaxmpi.send(x, partner, tag=5)
    return received


def _barrier(x):
    jaxmpi.barrier()
    return x + 1


def _scatter_input(b):
    return (element(b, (SIZE, 2, 3)) if RANK == ROOT else np.zeros((2, 3), np.float32),)


def _scatterv_input(b):
    rows = sum(COUNTS) if RANK == ROOT else COUNTS[RANK]
    data = element(b, (rows, 2))
    return (data if RANK == ROOT else np.ones_like(data),)  # template: values ignored


# name -> (function of the element's arguments, element b -> its arguments)
OPS = {
    "allreduce": (  # MAX on int32 (SUM is the op of most others)
        lambda x: jaxmpi.allreduce(x, jaxmpi.MAX),
        lambda b: (element(b, (2, 3), "int32"),),
    ),
    "reduce": (lambda x: jaxmpi.reduce(x, SUM, ROOT), lambda b: (element(b, (2, 3)),)),
    "scan": (lambda x: jaxmpi.scan(x, SUM), lambda b: (element(b, (2, 3)),)),
    "exscan": (lambda x: jaxmpi.exscan(x, SUM), lambda b: (element(b, (2, 3)),)),
    "reduce_scatter": (
        lambda x: jaxmpi.reduce_scatter(x, SUM),
        lambda b: (element(b, (SIZE, 2, 3)),),
    ),
    "bcast": (lambda x: jaxmpi.bcast(x, ROOT), lambda b: (element(b, (2, 3)),)),
    "gather": (lambda x: jaxmpi.gather(x, ROOT), lambda b: (element(b, (2, 3)),)),
    "allgather": (jaxmpi.allgather, lambda b: (element(b, (2, 3)),)),
    "scatter": (lambda x: jaxmpi.scatter(x, ROOT), _scatter_input),
    "alltoall": (jaxmpi.alltoall, lambda b: (element(b, (SIZE, 2, 3)),)),
    "gatherv": (
        lambda x: jaxmpi.gatherv(x, COUNTS, ROOT),
        lambda b: (element(b, (COUNTS[RANK], 2)),),
    ),
    "allgatherv": (
        lambda x: jaxmpi.allgatherv(x, COUNTS),
        lambda b: (element(b, (COUNTS[RANK], 2)),),
    ),
    "scatterv": (lambda x: jaxmpi.scatterv(x, COUNTS, ROOT), _scatterv_input),
    "alltoallv": (
        lambda x: jaxmpi.alltoallv(x, SEND_COUNTS, RECV_COUNTS),
        lambda b: (element(b, (sum(SEND_COUNTS), 2), "int32"),),
    ),
    "sendrecv": (
        lambda x, t: jaxmpi.sendrecv(x, t, source=LEFT, dest=RIGHT),
        lambda b: (element(b, (2, 3)), np.zeros((2, 3), np.float32)),
    ),
    "send-recv": (_pair, lambda b: (element(b, (2, 3)), np.zeros((2, 3), np.float32))),
    "barrier": (_barrier, lambda b: (element(b, (2, 3)),)),
}
#: The MPI calls one application of each op makes (the primitives' names).
CALLS = {name: {f"jaxmpi_{name.split('-')[0]}": 1} for name in OPS}
CALLS["send-recv"] = {"jaxmpi_send": 1, "jaxmpi_recv": 1}

#: Ops that need a partner rank.
P2P = {"send-recv"}


def skip_without_partner(name):
    if name in P2P and p2p_partner() is None:
        # Fewer than 2 ranks, or the odd rank out: this rank has nobody to talk to. It makes
        # no MPI call, which is what its partner-less peers expect.
        pytest.skip("this rank has no partner for send/recv")


def batched(name, in_axes):
    """Every element's arguments stacked along `in_axes` (None: element 0's, unstacked,
    the same for the whole batch)."""
    _, make = OPS[name]
    per_element = [make(b) for b in range(BATCH)]
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(per_element[0])
    args = [
        arg_0 if axis is None else np.stack([e[i] for e in per_element], axis=axis)
        for i, (axis, arg_0) in enumerate(zip(axes, per_element[0]))
    ]
    # What each element sees: its own slice where batched, element 0's argument where not.
    seen = [
        tuple(per_element[0][i] if axis is None else e[i] for i, axis in enumerate(axes))
        for e in per_element
    ]
    return axes, args, seen


_REFERENCES: dict = {}


def loop_reference(name, axes, seen):
    """The unbatched op once per element, eagerly, results stacked on a new front axis.
    Computed once per op and pattern of unbatched operands (the elements are the same
    whatever the batch axis); every rank runs the tests in the same order, so every rank
    makes these calls in the same test."""
    key = (name, tuple(a is None for a in axes))
    if key not in _REFERENCES:
        fn, _ = OPS[name]
        _REFERENCES[key] = np.stack([jax.device_get(fn(*args)) for args in seen])
    return _REFERENCES[key]


def run_vmap(name, axes, args, mode):
    fn, _ = OPS[name]
    batched_fn = jax.vmap(fn, in_axes=axes)
    if mode == "jit":
        batched_fn = jax.jit(batched_fn)
    return jax.device_get(batched_fn(*args))


# (mode, in_axes) pairs: every op is tried with each. A batch axis at the end (-1) needs
# moving before the MPI call; in_axes=0 needs none. (The batching rule is the same eagerly
# and under jit; what differs is how the batched call runs.) A batch axis in the middle
# (1) is run by test_nested_vmap and test_vmap_with_unbatched_operands, and traced for
# every op by test_vmap_makes_one_mpi_call_for_the_whole_batch.
VARIANTS = [("eager", 0), ("jit", -1)]


@pytest.mark.parametrize(
    "mode,in_axes", VARIANTS, ids=[f"{m}-axis{a}".replace("-1", "_last") for m, a in VARIANTS]
)
@pytest.mark.parametrize("name", list(OPS))
def test_vmap_matches_a_loop_over_the_batch(name, mode, in_axes):
    skip_without_partner(name)
    axes, args, seen = batched(name, in_axes)
    got = run_vmap(name, axes, args, mode)
    expected = loop_reference(name, axes, seen)
    assert_array(got, expected, f"vmap of {name}")


# ---------------------------------------------------------------------------------------
# Unbatched operands mixed with batched ones (in_axes=None): the same on every rank
# ---------------------------------------------------------------------------------------

# sendrecv only: a separate recv's result is batched only if its template is, whatever
# the sender sent (it cannot know), so a send/recv pair must batch the sender's data and
# the receiver's template alike -- which test_vmap_matches_a_loop_over_the_batch does.
MIXED = [
    ("sendrecv", (0, None), "eager"),  # an unbatched receive template
    ("sendrecv", (-1, None), "jit"),
    ("sendrecv", (None, 1), "eager"),  # the same data sent for every element
    ("sendrecv", (None, 0), "jit"),
]


@pytest.mark.parametrize(
    "name,in_axes,mode", MIXED, ids=[f"{n}-{a}-{m}".replace(" ", "") for n, a, m in MIXED]
)
def test_vmap_with_unbatched_operands(name, in_axes, mode):
    skip_without_partner(name)
    axes, args, seen = batched(name, in_axes)
    got = run_vmap(name, axes, args, mode)
    assert_array(got, loop_reference(name, axes, seen), f"vmap of {name}, in_axes={in_axes}")


def test_vmap_with_an_unbatched_closure_value():
    """A batched value combined with an unbatched one before the op, and out_axes=1."""
    offset = element(0, (2, 3), salt=5)
    batch = np.stack([element(b, (2, 3)) for b in range(BATCH)])
    got = jax.jit(jax.vmap(lambda x, c: jaxmpi.allgather(x + c), in_axes=(0, None), out_axes=1))(
        batch, offset
    )
    expected = np.stack([jax.device_get(jaxmpi.allgather(batch[b] + offset)) for b in range(BATCH)])
    assert_array(got, np.moveaxis(expected, 0, 1))


def test_vmap_of_variable_count_ops_with_scalar_rows():
    """Elements of shape (rows,) in bfloat16, batch axis last, under jit: the batched row
    is BATCH elements of 2 bytes, and the counts must scale with it."""

    def four(x, scatter_in, to_all):
        return (
            jaxmpi.gatherv(x, COUNTS, ROOT),
            jaxmpi.allgatherv(x, COUNTS),
            jaxmpi.scatterv(scatter_in, COUNTS, ROOT),
            jaxmpi.alltoallv(to_all, SEND_COUNTS, RECV_COUNTS),
        )

    scatter_rows = sum(COUNTS) if RANK == ROOT else COUNTS[RANK]
    elements = [
        (
            element(b, (COUNTS[RANK],), "bfloat16"),
            element(b, (scatter_rows,), "bfloat16", salt=1),
            element(b, (sum(SEND_COUNTS),), "bfloat16", salt=2),
        )
        for b in range(BATCH)
    ]
    stacked = [np.stack([e[i] for e in elements], axis=-1) for i in range(3)]
    got = jax.device_get(jax.jit(jax.vmap(four, in_axes=-1))(*stacked))
    per_element = [jax.device_get(four(*e)) for e in elements]
    for i, name in enumerate(["gatherv", "allgatherv", "scatterv", "alltoallv"]):
        assert_array(got[i], np.stack([out[i] for out in per_element]), f"vmap of {name}")


# ---------------------------------------------------------------------------------------
# Nested vmap: two batch axes, still one MPI call
# ---------------------------------------------------------------------------------------

NESTED = ["reduce_scatter", "gather", "scatterv", "alltoall", "alltoallv"]


@pytest.mark.parametrize("name", NESTED)
def test_nested_vmap(name):
    """vmap(jit(vmap(op))) over a (2, BATCH) batch (inner axis 1 on the outside array)
    equals the op applied to each of the 2*BATCH elements; one MPI call in the jaxpr."""
    fn, make = OPS[name]
    outer = 2
    # Element (o, b): element b scaled by o + 1 (templates too: their values are ignored).
    elements = [[make(b)[0] * (o + 1) for b in range(BATCH)] for o in range(outer)]
    x = np.stack([np.stack(row, axis=1) for row in elements])  # (outer, ..., BATCH at 1, ...)
    nested = jax.vmap(jax.jit(jax.vmap(fn, in_axes=1)), in_axes=0)
    jaxpr = jax.make_jaxpr(nested)(x)
    got = jax.device_get(nested(x))
    expected = np.stack(
        [np.stack([jax.device_get(fn(elements[o][b])) for b in range(BATCH)]) for o in range(outer)]
    )
    assert mpi_calls(jaxpr) == CALLS[name], f"MPI calls of nested vmap: {mpi_calls(jaxpr)}"
    assert_array(got, expected, f"nested vmap of {name}")


# ---------------------------------------------------------------------------------------
# One MPI call for the whole batch
# ---------------------------------------------------------------------------------------


def mpi_calls(closed_jaxpr) -> dict[str, int]:
    """How many times each jaxmpi primitive appears in the jaxpr, sub-jaxprs included."""
    counts = Counter()

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name.startswith("jaxmpi_"):
                counts[eqn.primitive.name] += 1
            for sub in _subjaxprs(eqn.params):
                visit(sub)

    visit(closed_jaxpr.jaxpr)
    return dict(counts)


def _subjaxprs(params):
    for value in params.values():
        values = value if isinstance(value, (tuple, list)) else (value,)
        for v in values:
            if hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):  # ClosedJaxpr
                yield v.jaxpr
            elif hasattr(v, "eqns"):  # Jaxpr
                yield v


@pytest.mark.parametrize("in_axes", [0, 1], ids=["axis0", "axis1"])
@pytest.mark.parametrize("name", list(OPS))
def test_vmap_makes_one_mpi_call_for_the_whole_batch(name, in_axes):
    """Only traced, never run: so every rank may do this alone, partner or not."""
    axes, args, _ = batched(name, in_axes)
    fn, _ = OPS[name]
    if name in P2P and p2p_partner() is None:
        fn = OPS["sendrecv"][0]  # tracing _pair needs a partner; count a sendrecv instead
        expected = CALLS["sendrecv"]
    else:
        expected = CALLS[name]
    plain = mpi_calls(jax.make_jaxpr(jax.vmap(fn, in_axes=axes))(*args))
    jitted = mpi_calls(jax.make_jaxpr(jax.jit(jax.vmap(fn, in_axes=axes)))(*args))
    assert plain == expected, f"vmap of {name} with BATCH={BATCH}: {plain}"
    assert jitted == expected, f"jit of vmap of {name} with BATCH={BATCH}: {jitted}"


def test_the_call_counter_sees_a_loop():
    """The counter above is not blind: a Python loop over the batch makes BATCH calls."""
    batch = np.stack([element(b, (2, 3)) for b in range(BATCH)])

    def loop(xs):
        return [jaxmpi.allreduce(xs[b], SUM) for b in range(BATCH)]

    assert mpi_calls(jax.make_jaxpr(loop)(batch)) == {"jaxmpi_allreduce": BATCH}
    assert mpi_calls(jax.make_jaxpr(jax.jit(loop))(batch)) == {"jaxmpi_allreduce": BATCH}
