"""Differentiation and batching rules for every op: one row per primitive in `RULES`
below (the Python twin of the handlers' `declare_ops!` table), the rules themselves in
the module of their op family.

Linear ops (data movement, SUM reductions) have JVPs that apply the op to the tangents and
transposes built from the adjoint communication (`reductions.py`, `collectives.py`,
`varcount.py`, `p2p.py`, `nonblocking.py`). Rules bind primitives, never the public
functions: they run below the API, on values it has checked already.

vmap moves the batch axis where the op's semantics allow one MPI call for the whole
batch: the front for elementwise ops and point to point, just behind the rank axis for ops
that split or stack along it (`common.batcher`).

Importing the package registers every row with JAX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .. import jax_shim
from .. import primitives as prim
from .collectives import (
    allgather_transpose,
    alltoall_transpose,
    barrier_batching,
    bcast_transpose,
    gather_transpose,
    scatter_transpose,
)
from .common import batcher, behind_rank_axis, front, linear_jvp, root_axis, sum_only_jvp
from .nonblocking import (
    RECV_REVERSE,
    SEND_REVERSE,
    Reverse,
    rules_of_started,
    wait_batching,
    wait_jvp,
    wait_transpose,
)
from .p2p import named_source_jvp, recv_transpose, send_transpose, sendrecv_transpose
from .reductions import (
    allreduce_transpose,
    allreduce_transposed_transpose,
    exscan_transpose,
    reduce_scatter_transpose,
    reduce_transpose,
    reduction_jvp,
    scan_transpose,
)
from .varcount import (
    allgatherv_transpose,
    alltoallv_transpose,
    gatherv_transpose,
    ragged_alltoallv_batching,
    ragged_alltoallv_transpose,
    ragged_jvp,
    scatterv_transpose,
)


class Rules(NamedTuple):
    """How JAX differentiates and batches one primitive: `jvp(primitive, name)` makes its
    JVP rule (None: no derivative, no operands), `transpose` is its transpose rule (None:
    not linear), `batch` is (operand axis, result axis) for `batcher`, each a function of
    the op's parameters, or a whole batching rule. `reverse`: the op's adjoint as a started
    op, which makes its started form's reverse mode overlapped (`nonblocking.py`)."""

    jvp: Callable | None
    transpose: Callable | None
    batch: tuple[Callable, Callable] | Callable
    reverse: Reverse | None = None


RULES: dict[str, Rules] = {
    "allreduce": Rules(reduction_jvp, allreduce_transpose, (front, front)),
    "reduce": Rules(reduction_jvp, reduce_transpose, (front, front)),
    "scan": Rules(sum_only_jvp, scan_transpose, (front, front)),
    "exscan": Rules(sum_only_jvp, exscan_transpose, (front, front)),
    "reduce_scatter": Rules(sum_only_jvp, reduce_scatter_transpose, (behind_rank_axis, front)),
    "bcast": Rules(linear_jvp, bcast_transpose, (front, front)),
    "gather": Rules(linear_jvp, gather_transpose, (front, root_axis)),
    "allgather": Rules(linear_jvp, allgather_transpose, (front, behind_rank_axis)),
    "scatter": Rules(linear_jvp, scatter_transpose, (root_axis, front)),
    "alltoall": Rules(linear_jvp, alltoall_transpose, (behind_rank_axis, behind_rank_axis)),
    "gatherv": Rules(linear_jvp, gatherv_transpose, (behind_rank_axis, behind_rank_axis)),
    "allgatherv": Rules(linear_jvp, allgatherv_transpose, (behind_rank_axis, behind_rank_axis)),
    "scatterv": Rules(linear_jvp, scatterv_transpose, (behind_rank_axis, behind_rank_axis)),
    "alltoallv": Rules(linear_jvp, alltoallv_transpose, (behind_rank_axis, behind_rank_axis)),
    "send": Rules(linear_jvp, send_transpose, (front, front), SEND_REVERSE),
    "recv": Rules(named_source_jvp, recv_transpose, (front, front), RECV_REVERSE),
    "sendrecv": Rules(named_source_jvp, sendrecv_transpose, (front, front)),
    "barrier": Rules(None, None, barrier_batching),
    "ragged_alltoallv": Rules(ragged_jvp, ragged_alltoallv_transpose, ragged_alltoallv_batching),
    "allreduce_transposed": Rules(linear_jvp, allreduce_transposed_transpose, (front, front)),
}  # fmt: skip

# The rows of the started forms and of their wait, derived from their ops' rows: none of
# them is written here, so declaring an op's started form in the Rust table is all it takes.
RULES["wait"] = Rules(
    wait_jvp,
    wait_transpose({op: r.reverse for op, r in RULES.items() if r.reverse is not None}),
    wait_batching,
)
for _op in prim.STARTED:
    _row = RULES[_op]
    _jvp, _transpose, _batching = rules_of_started(_op, _row.transpose, _row.batch, _row.reverse)
    RULES[prim.SIGNATURES[_op]["started"]] = Rules(
        lambda *_, rule=_jvp: rule, _transpose, _batching
    )

for _name, _rules in RULES.items():
    _primitive = prim.PRIMITIVES[_name]
    if _rules.jvp is not None:
        jax_shim.def_jvp(_primitive, _rules.jvp(_primitive, _name))
    if _rules.transpose is not None:
        jax_shim.def_transpose(_primitive, _rules.transpose)
    _batch = _rules.batch if callable(_rules.batch) else batcher(_primitive, *_rules.batch)
    jax_shim.def_batching(_primitive, _batch)
