"""Pytrees in every op: each op given a pytree returns what it returns leaf by leaf, bit for
bit, in the tree's structure, with one MPI call per dtype (a large leaf alone); the same
derivative, batching, ordering and error rules as for one array; checked mode tells trees
that differ between ranks apart, also where their packed buffers agree.

The data are `rank_data` (multiples of 0.25, small integers): every sum is exact, so a
packed reduction and a leaf-by-leaf one agree bit for bit whatever algorithm MPI picks for
either size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import (
    MODES,
    RANK,
    SIZE,
    allreduce_still_works,
    assert_array,
    call,
    check_raises,
    needs_mpi4py,
    needs_ranks,
    partner_or_skip,
    rank_data,
)
from jaxmpi import _trees

ROOT = SIZE - 1
COUNTS = tuple(r % 3 + 1 for r in range(SIZE))  # rows per rank of the v-ops


def flat_tree(rank: int, reducible: bool = False) -> dict:
    """Leaves of every kind: mixed dtypes, a scalar, an empty leaf, nested containers;
    bool only where no reduction applies."""
    tree = {
        "w": [rank_data(rank, "float32", (3, 4)), rank_data(rank, "float32", (5,))],
        "b": (rank_data(rank, "int32", ()), rank_data(rank, "float64", (2,))),
        "empty": rank_data(rank, "float32", (0,)),
        "nested": {"c": rank_data(rank, "complex64", (2, 2)), "i": rank_data(rank, "int8", (3,))},
    }
    if not reducible:
        tree["flag"] = rank_data(rank, "bool", (3,))
    return tree


def rows_tree(rank: int, rows: int) -> dict:
    """Every leaf with `rows` rows along its leading axis."""
    return {
        "a": rank_data(rank, "float32", (rows, 3)),
        "b": [rank_data(rank, "int32", (rows,)), rank_data(rank, "float32", (rows, 2, 2))],
        "e": rank_data(rank, "float32", (rows, 0)),
        "z": rank_data(rank, "complex128", (rows, 1)),
    }


def leaf_by_leaf(fn):
    return lambda tree: jax.tree_util.tree_map(fn, tree)


def assert_same_tree(got, expected, what: str) -> None:
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected), what
    paths = jax.tree_util.tree_flatten_with_path(expected)[0]
    for (path, e), g in zip(paths, jax.tree_util.tree_leaves(got)):
        assert_array(g, e, f"{what} {jax.tree_util.keystr(path)}")


SUM = jaxmpi.SUM
# Each op on a pytree, and the tree it is given on this rank.
OPS = {
    "allreduce": (lambda t: jaxmpi.allreduce(t, SUM), flat_tree(RANK, reducible=True)),
    "reduce": (lambda t: jaxmpi.reduce(t, SUM, ROOT), flat_tree(RANK, reducible=True)),
    "scan": (lambda t: jaxmpi.scan(t, SUM), flat_tree(RANK, reducible=True)),
    "exscan": (lambda t: jaxmpi.exscan(t, SUM), flat_tree(RANK, reducible=True)),
    "reduce_scatter": (lambda t: jaxmpi.reduce_scatter(t, SUM), rows_tree(RANK, SIZE)),
    "bcast": (lambda t: jaxmpi.bcast(t, ROOT), flat_tree(RANK)),
    "gather": (lambda t: jaxmpi.gather(t, ROOT), flat_tree(RANK)),
    "allgather": (jaxmpi.allgather, flat_tree(RANK)),
    "scatter": (
        lambda t: jaxmpi.scatter(t, ROOT),
        rows_tree(RANK, SIZE) if RANK == ROOT else jax.tree.map(lambda a: a[0], rows_tree(0, 1)),
    ),
    "alltoall": (jaxmpi.alltoall, rows_tree(RANK, SIZE)),
    "gatherv": (lambda t: jaxmpi.gatherv(t, COUNTS, ROOT), rows_tree(RANK, COUNTS[RANK])),
    "allgatherv": (lambda t: jaxmpi.allgatherv(t, COUNTS), rows_tree(RANK, COUNTS[RANK])),
    "scatterv": (
        lambda t: jaxmpi.scatterv(t, COUNTS, ROOT),
        rows_tree(RANK, sum(COUNTS) if RANK == ROOT else COUNTS[RANK]),
    ),
    "alltoallv": (lambda t: jaxmpi.alltoallv(t, (1,) * SIZE, (1,) * SIZE), rows_tree(RANK, SIZE)),
    "allgatherv-capacity": (
        lambda t: jaxmpi.allgatherv(t, jnp.asarray(COUNTS), recv_capacity=sum(COUNTS) + 1),
        rows_tree(RANK, COUNTS[RANK]),
    ),
    "gatherv-capacity": (
        lambda t: jaxmpi.gatherv(t, jnp.asarray(COUNTS), ROOT, recv_capacity=sum(COUNTS)),
        rows_tree(RANK, COUNTS[RANK]),
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", list(OPS))
def test_every_op_on_a_pytree_is_the_op_leaf_by_leaf(op, mode):
    fn, tree = OPS[op]
    got = call(mode, fn, tree)
    expected = call(mode, leaf_by_leaf(fn), tree)
    assert_same_tree(got, expected, op)


@pytest.mark.parametrize("mode", MODES)
def test_ragged_all_to_all_on_a_pytree_is_the_op_leaf_by_leaf(mode):
    # One row to every rank, landing at row `sender` there.
    offsets, sizes = jnp.arange(SIZE), jnp.ones(SIZE, jnp.int32)
    landing = jnp.full(SIZE, RANK)

    def fn(operand, output):
        return jaxmpi.ragged_all_to_all(operand, output, offsets, sizes, landing, sizes)

    operand, output = rows_tree(RANK, SIZE), rows_tree(RANK + SIZE, SIZE + 1)
    got = call(mode, fn, operand, output)
    expected = call(mode, lambda o, u: jax.tree.map(fn, o, u), operand, output)
    assert_same_tree(got, expected, "ragged_all_to_all")


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_point_to_point_pytrees_are_the_ops_leaf_by_leaf(mode):
    partner = partner_or_skip()
    mine, theirs = flat_tree(RANK), flat_tree(partner)
    template = jax.tree.map(np.zeros_like, theirs)

    def ordered(x, t):  # the even rank sends first
        if RANK % 2 == 0:
            jaxmpi.send(x, partner, tag=3)
            return jaxmpi.recv(t, partner, tag=3)
        got = jaxmpi.recv(t, partner, tag=3)
        jaxmpi.send(x, partner, tag=3)
        return got

    def swapped(x, t):
        return jaxmpi.sendrecv(x, t, partner, partner, sendtag=4, recvtag=4)

    def in_place(x):  # the same tree as both: exchanged group by group in place
        return jaxmpi.sendrecv(x, x, partner, partner)

    def started(x, t):
        requests = [jaxmpi.isend(x, partner, tag=5), jaxmpi.irecv(t, partner, tag=5)]
        return jaxmpi.waitall(requests)[1]

    for name, fn, args in [
        ("send/recv", ordered, (mine, template)),
        ("sendrecv", swapped, (mine, template)),
        ("sendrecv in place", in_place, (mine,)),
        ("isend/irecv", started, (mine, template)),
    ]:
        assert_same_tree(call(mode, fn, *args), theirs, name)


@needs_ranks(2)
def test_sendrecv_of_trees_of_different_structures_pairs_their_groups():
    """The even rank sends a tree of two dtypes and receives one of three; its partner
    the reverse: where one side has no group left, that call sends or receives nothing."""
    partner = partner_or_skip()

    def tree(rank: int) -> dict:
        two = {"f": rank_data(rank, "float32", (4,)), "i": rank_data(rank, "int16", (2,))}
        return two if rank % 2 == 0 else {**two, "z": rank_data(rank, "complex64", (3,))}

    template = jax.tree.map(np.zeros_like, tree(partner))
    fn = jax.jit(lambda x, t: jaxmpi.sendrecv(x, t, partner, partner))
    assert_same_tree(jax.device_get(fn(tree(RANK), template)), tree(partner), "sendrecv")


def _calls(fn, *args) -> dict:
    """How many calls of each jaxmpi handler the compiled program makes, and whether it
    concatenates anything."""
    text = jax.jit(fn).lower(*args).as_text()
    return {
        "allreduce": text.count("@jaxmpi_allreduce("),
        "concatenate": text.count("concatenate"),
    }


# What packs, and what is refused before any MPI call: whatever the MPI or size.
@pytest.mark.same_on_every_mpi
@pytest.mark.same_at_every_size
def test_a_pytree_costs_one_call_per_dtype_and_a_large_leaf_its_own_call():
    many = [jnp.full(7, k, jnp.float32) for k in range(64)] + [jnp.arange(3)] * 5
    assert _calls(lambda t: jaxmpi.allreduce(t, SUM), many)["allreduce"] == 2
    large = jnp.zeros(_trees.ALONE // 4, jnp.float32)  # float32: ALONE bytes exactly
    calls = _calls(lambda t: jaxmpi.allreduce(t, SUM), [large, *many])
    assert calls["allreduce"] == 3
    # A single array is no pytree: nothing is packed, as before pytrees.
    assert _calls(lambda x: jaxmpi.allreduce(x, SUM), large) == {"allreduce": 1, "concatenate": 0}
    assert _calls(lambda t: jaxmpi.allreduce(t, SUM), {}) == {"allreduce": 0, "concatenate": 0}
    # Leaves just under ALONE: as many a call as fit GROUP bytes.
    near = [jnp.zeros(_trees.ALONE // 4 - 1, jnp.float32)] * 6
    per_group = _trees.GROUP // (_trees.ALONE - 4)
    expected = -(-len(near) // per_group)
    assert _calls(lambda t: jaxmpi.allreduce(t, SUM), near)["allreduce"] == expected > 1
    assert jaxmpi.allreduce({}, SUM) == {} and jaxmpi.allreduce([None], SUM) == [None]


def test_every_rank_groups_a_v_op_tree_alike_whatever_its_rows():
    """The v-ops' leaves have as many rows as the rank's count: whether a leaf travels
    alone depends on the size of its rows, the same on every rank, not on its own size
    (here ALONE bytes or more on the ranks with 2 or 3 rows, half of it with 1)."""
    row = _trees.ALONE // 16  # float64: half of ALONE per row
    tree = {"a": np.ones((COUNTS[RANK], row), np.float64), "b": np.ones((COUNTS[RANK], 2))}
    counts = jax.device_get(jaxmpi.allgather(np.int64(len(_trees.Tree(tree, "t").groups(1)))))
    got = jaxmpi.allgatherv(tree, COUNTS)
    assert set(counts.tolist()) == {1}
    assert_array(got["a"], np.ones((sum(COUNTS), row)), "allgatherv")


# Rules of JAX (derivatives, batching, tracing), not of an MPI or a number of ranks.
@pytest.mark.same_on_every_mpi
@pytest.mark.same_at_every_size
@pytest.mark.parametrize("mode", MODES)
def test_derivatives_and_vmap_of_a_pytree_are_those_of_its_leaves(mode):
    tree = flat_tree(RANK, reducible=True)
    floats = {"w": tree["w"], "c": tree["nested"]["c"].real, "d": tree["b"][1]}

    def loss(t):
        total = jaxmpi.allreduce(t, SUM)
        return sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree_util.tree_leaves(total))

    def loss_by_leaf(t):
        total = leaf_by_leaf(lambda a: jaxmpi.allreduce(a, SUM))(t)
        return sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree_util.tree_leaves(total))

    assert_same_tree(
        call(mode, jax.grad(loss), floats), call(mode, jax.grad(loss_by_leaf), floats), "grad"
    )
    tangent = jax.tree.map(lambda a: np.full_like(a, 0.5), floats)
    jvp = call(mode, lambda t: jax.jvp(lambda u: jaxmpi.allgather(u), (t,), (tangent,)), floats)
    jvp_by_leaf = call(
        mode, lambda t: jax.jvp(leaf_by_leaf(jaxmpi.allgather), (t,), (tangent,)), floats
    )
    assert_same_tree(jvp, jvp_by_leaf, "jvp")
    batch = jax.tree.map(lambda a: np.stack([a, 2 * a, -a]), floats)
    batched = call(mode, jax.vmap(lambda t: jaxmpi.allreduce(t, SUM)), batch)
    batched_by_leaf = call(mode, jax.vmap(leaf_by_leaf(lambda a: jaxmpi.allreduce(a, SUM))), batch)
    assert_same_tree(batched, batched_by_leaf, "vmap")


def test_pytrees_in_a_loop_keep_program_order_with_other_ops():
    tree = {"a": jnp.ones(3, jnp.float32), "n": jnp.arange(2, dtype=jnp.int32)}

    def body(_, carry):
        t, s = carry
        t = jaxmpi.allreduce(t, SUM)
        s = jaxmpi.allreduce(s + 1.0, SUM)
        return {"a": t["a"] / SIZE, "n": t["n"] // SIZE}, s

    start = (tree, jnp.float32(0))
    got, s = jax.device_get(jax.jit(lambda c: jax.lax.fori_loop(0, 3, body, c))(start))
    assert_same_tree(got, {"a": np.ones(3, np.float32), "n": np.arange(2, dtype=np.int32)}, "loop")
    assert float(s) == SIZE * (SIZE * (SIZE + 1) + 1)  # s <- SIZE * (s + 1), three times


# What packs, and what is refused before any MPI call: whatever the MPI or size.
@pytest.mark.same_on_every_mpi
@pytest.mark.same_at_every_size
def test_bad_leaves_are_named_by_their_path():
    check_raises(TypeError, ["x['b'][1]", "int4", "not supported"], jaxmpi.allreduce,
                 {"a": jnp.ones(2), "b": [1, jnp.zeros(2, jnp.int4)]}, SUM)  # fmt: skip
    check_raises(TypeError, ["x['s']", "expected an array"], jaxmpi.bcast, {"s": "text"}, 0)
    check_raises(ValueError, ["x[1]", "(nproc, ...)"], jaxmpi.alltoall, [np.ones((SIZE, 2)), np.ones(SIZE + 1)])  # fmt: skip
    check_raises(ValueError, ["x['a']", f"{COUNTS[RANK]} rows"], jaxmpi.allgatherv,
                 {"a": np.ones(COUNTS[RANK] + 1)}, COUNTS)  # fmt: skip
    check_raises(ValueError, ["same structure"], jaxmpi.ragged_all_to_all, [jnp.ones(SIZE)],
                 (jnp.ones(SIZE),), jnp.arange(SIZE), jnp.ones(SIZE, jnp.int32),
                 jnp.zeros(SIZE, jnp.int32), jnp.ones(SIZE, jnp.int32))  # fmt: skip
    allreduce_still_works()


# What packs, and what is refused before any MPI call: whatever the MPI or size.
@pytest.mark.same_on_every_mpi
@pytest.mark.same_at_every_size
@needs_mpi4py
def test_receives_refuse_what_a_pytree_cannot_do():
    from mpi4py import MPI

    mixed = {"f": jnp.zeros(2), "i": jnp.zeros(2, jnp.int32)}
    check_raises(ValueError, ["status=", "pytree"], jaxmpi.recv, {"f": jnp.zeros(2)}, 0, status=MPI.Status())  # fmt: skip
    check_raises(ValueError, ["ANY_SOURCE", "one message per dtype"], jaxmpi.irecv, mixed)
    check_raises(ValueError, ["ANY_SOURCE"], jaxmpi.sendrecv, mixed, mixed, jaxmpi.ANY_SOURCE, 0)
    allreduce_still_works()


def _raised(fn, *args):
    try:
        jax.block_until_ready(fn(*args))
    except Exception as err:
        return jaxmpi.MPIError.from_exception(err) or err
    return None


@needs_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_checked_mode_tells_trees_apart_that_pack_alike(checked, mode):
    """Rank 0 passes leaves of 3 and 2 floats, the others of 2 and 3: the same packed
    buffer (5 float32) on every rank, a different tree."""
    sizes = (3, 2) if RANK == 0 else (2, 3)
    tree = {"a": jnp.ones(sizes[0], jnp.float32), "b": jnp.ones(sizes[1], jnp.float32)}
    err = _raised(lambda t: call(mode, lambda u: jaxmpi.allreduce(u, SUM), t), tree)
    same = _raised(lambda t: call(mode, lambda u: jaxmpi.allreduce(u, SUM), t), {"a": jnp.ones(3)})
    assert isinstance(err, jaxmpi.MPIError), repr(err)
    assert "pytree" in err.error_string and "float32[5]" in err.error_string, err.error_string
    assert same is None


@needs_ranks(2)
def test_checked_mode_tells_a_receive_a_tree_differs_from_what_was_sent(checked):
    partner = partner_or_skip()
    sent = {"a": jnp.ones(3), "b": jnp.ones(2)}
    expected = {"a": jnp.ones(2), "b": jnp.ones(3)}  # packs alike, another tree
    err = None
    if RANK % 2 == 0:
        jax.block_until_ready(jaxmpi.send(sent, partner, tag=9))
    else:
        err = _raised(lambda t: jaxmpi.recv(t, partner, tag=9), expected)
    after = jax.device_get(jaxmpi.sendrecv(np.int32(RANK), np.int32(0), partner, partner))
    assert int(after) == partner
    if RANK % 2 == 1:
        assert isinstance(err, jaxmpi.MPIError), repr(err)
        assert "pytree" in err.error_string and "this receive expects" in err.error_string
