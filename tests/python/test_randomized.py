"""Randomized sequences of valid ops, checked against the same sequence done with mpi4py.

Each test case is one seed. From it every rank builds the same random sequence of steps
(op, dtype, shape, root, peers, counts, tags) and the same way to run it (eagerly, under
jit, or under jit inside a fori_loop), runs it with jaxmpi, then runs it again with mpi4py
on numpy arrays on a communicator of its own, and compares its own results. Data moves
through mpi4py as raw bytes (so every dtype, float16 and bfloat16 included, goes through
the same path); reductions are done by numpy on inputs that mpi4py gathered, with values
chosen so that every result is exact.

Knobs (environment):
  JAXMPI_RANDOM_SEED=S        run only seed S (replays a failure: its message names S)
  JAXMPI_RANDOM_SEQUENCES=N   how many seeds to run (default 40), from JAXMPI_RANDOM_BASE
  JAXMPI_RANDOM_BASE=B        first seed (default 0); change it to explore new sequences
  JAXMPI_RANDOM_STEPS=K       at most K steps per sequence (default 8)
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmpi
from helpers import (
    ALL_DTYPES,
    MPI,
    OP_DTYPES,
    RANK,
    SIZE,
    assert_array,
    needs_mpi4py,
    reduce_arrays,
)

# Random sequences of the ops the other files test on every MPI; the number of
# ranks enters.
pytestmark = [needs_mpi4py, pytest.mark.same_on_every_mpi]

MAX_STEPS = int(os.environ.get("JAXMPI_RANDOM_STEPS", "8"))
if "JAXMPI_RANDOM_SEED" in os.environ:
    SEEDS = [int(os.environ["JAXMPI_RANDOM_SEED"])]
else:
    _base = int(os.environ.get("JAXMPI_RANDOM_BASE", "0"))
    SEEDS = list(range(_base, _base + int(os.environ.get("JAXMPI_RANDOM_SEQUENCES", "40"))))

REDUCTIONS = ["allreduce", "reduce", "scan", "exscan", "reduce_scatter"]
MOVES = ["bcast", "gather", "allgather", "scatter", "alltoall"]
VARCOUNT = ["gatherv", "allgatherv", "scatterv", "alltoallv"]
P2P = ["send_recv", "sendrecv"]
KINDS = REDUCTIONS + MOVES + VARCOUNT + P2P + ["barrier"]
RUN_MODES = ["eager", "jit", "fori_loop"]
LOOP_TRIPS = 2

SHAPES = [(), (0,), (1,), (3,), (2, 3), (0, 2), (2, 1, 2)]
ROW_SHAPES = [(), (2,), (0,), (1, 3)]  # the shape of one row (v-ops) or one slice


@dataclass
class Step:
    """One op of a sequence, with everything every rank needs to take part."""

    kind: str
    dtype: str
    shape: tuple = ()  # the input's shape, or one row's / one slice's
    op: str | None = None
    root: int = 0
    counts: tuple = ()  # v-ops: rows per rank; alltoallv: rows[sender][receiver]
    pairs: tuple = ()  # send_recv: (sender, receiver) pairs; sendrecv: (shift,)
    tag: int = 0
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        parts = [self.kind, self.dtype, f"shape={self.shape}"]
        if self.op:
            parts.append(f"op={self.op}")
        if self.kind in ("reduce", "bcast", "gather", "scatter", "gatherv", "scatterv"):
            parts.append(f"root={self.root}")
        if self.counts:
            parts.append(f"counts={self.counts}")
        if self.pairs:
            parts.append(f"pairs={self.pairs} tag={self.tag}")
        return " ".join(parts)


@dataclass
class Sequence:
    seed: int
    mode: str
    steps: list

    def __str__(self) -> str:
        lines = [f"seed {self.seed}, {SIZE} ranks, run {self.mode}:"]
        lines += [f"  {i}: {step}" for i, step in enumerate(self.steps)]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Generating sequences (the same on every rank: only the seed and SIZE go in)
# ---------------------------------------------------------------------------------------


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def random_step(rng) -> Step:
    kinds = [k for k in KINDS if not (k == "send_recv" and SIZE == 1)]
    kind = _pick(rng, kinds)
    dtype = _pick(rng, ALL_DTYPES)
    step = Step(kind, dtype, _pick(rng, SHAPES), root=int(rng.integers(SIZE)))
    if kind in REDUCTIONS:
        step.op = _pick(rng, [op for op, dtypes in OP_DTYPES.items() if dtype in dtypes])
    if kind in ("reduce_scatter", "scatter", "alltoall") + tuple(VARCOUNT):
        step.shape = _pick(rng, ROW_SHAPES)
    if kind in ("gatherv", "allgatherv", "scatterv"):
        step.counts = tuple(int(c) for c in rng.integers(0, 4, SIZE))
    if kind == "alltoallv":
        step.counts = tuple(tuple(int(c) for c in row) for row in rng.integers(0, 3, (SIZE, SIZE)))
    if kind == "send_recv":
        order = [int(r) for r in rng.permutation(SIZE)]
        step.pairs = tuple(zip(order[0::2], order[1::2], strict=False))
        step.tag = int(rng.integers(0, 100))
    if kind == "sendrecv":
        step.pairs = (int(rng.integers(SIZE)),)
        step.tag = int(rng.integers(0, 100))
    return step


def make_sequence(seed: int) -> Sequence:
    rng = np.random.default_rng(seed)
    mode = _pick(rng, RUN_MODES)
    steps = [random_step(rng) for _ in range(int(rng.integers(1, MAX_STEPS + 1)))]
    return Sequence(seed, mode, steps)


# ---------------------------------------------------------------------------------------
# Inputs: any rank can make any rank's input for a step; values keep every result exact
# ---------------------------------------------------------------------------------------


def input_shape(step: Step, rank: int) -> tuple:
    rest = step.shape
    if step.kind in ("reduce_scatter", "alltoall"):
        return (SIZE, *rest)
    if step.kind == "scatter":
        return (SIZE, *rest) if rank == step.root else rest
    if step.kind in ("gatherv", "allgatherv"):
        return (step.counts[rank], *rest)
    if step.kind == "scatterv":
        return (sum(step.counts) if rank == step.root else step.counts[rank], *rest)
    if step.kind == "alltoallv":
        return (sum(step.counts[rank]), *rest)
    return rest


def step_input(seed: int, index: int, step: Step, rank: int) -> np.ndarray:
    """Small integers (times 0.25 for floats): sums over 4 ranks fit int8 and are exact in
    float16; PROD gets factors of magnitude 1 or 2 only."""
    rng = np.random.default_rng([seed, index, rank])
    shape = input_shape(step, rank)
    dtype = np.dtype(jnp.dtype(step.dtype))
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    unsigned = np.issubdtype(dtype, np.unsignedinteger)
    if step.op == "PROD":
        factors = [1, 2] if unsigned else [1, 2, -1]
        if jnp.issubdtype(dtype, jnp.complexfloating):
            factors = [1, 2, -1, 1j]
        return np.asarray(factors)[rng.integers(0, len(factors), shape)].astype(dtype)
    values = rng.integers(0 if unsigned else -7, 8, shape)
    if jnp.issubdtype(dtype, jnp.integer):
        return values.astype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return (values * 0.25 + 1j * rng.integers(-3, 4, shape)).astype(dtype)
    return (values * 0.25).astype(dtype)


# ---------------------------------------------------------------------------------------
# The sequence with jaxmpi
# ---------------------------------------------------------------------------------------


def jaxmpi_step(step: Step, x):
    """Step `step` on this rank with jaxmpi; None for ops without a result."""
    kind, root = step.kind, step.root
    if kind in REDUCTIONS:
        op = getattr(jaxmpi, step.op)
        if kind == "reduce":
            return jaxmpi.reduce(x, op, root)
        return getattr(jaxmpi, kind)(x, op)
    if kind in ("bcast", "gather", "scatter"):
        return getattr(jaxmpi, kind)(x, root)
    if kind in ("allgather", "alltoall"):
        return getattr(jaxmpi, kind)(x)
    if kind in ("gatherv", "scatterv"):
        return getattr(jaxmpi, kind)(x, step.counts, root)
    if kind == "allgatherv":
        return jaxmpi.allgatherv(x, step.counts)
    if kind == "alltoallv":
        send = step.counts[RANK]
        receive = tuple(row[RANK] for row in step.counts)
        return jaxmpi.alltoallv(x, send, receive)
    if kind == "send_recv":
        for sender, receiver in step.pairs:
            if RANK == sender:
                jaxmpi.send(x, receiver, tag=step.tag)
            elif RANK == receiver:
                return jaxmpi.recv(jnp.zeros_like(x), sender, tag=step.tag)
        return None
    if kind == "sendrecv":
        (shift,) = step.pairs
        dest, source = (RANK + shift) % SIZE, (RANK - shift) % SIZE
        return jaxmpi.sendrecv(
            x, jnp.zeros_like(x), source, dest, sendtag=step.tag, recvtag=step.tag
        )
    assert kind == "barrier", kind
    jaxmpi.barrier()
    return None


def jaxmpi_sequence(steps, inputs):
    return [jaxmpi_step(step, x) for step, x in zip(steps, inputs, strict=True)]


def run_jaxmpi(sequence: Sequence, inputs):
    steps = sequence.steps
    if sequence.mode == "eager":
        results = jaxmpi_sequence(steps, inputs)
    elif sequence.mode == "jit":
        results = jax.jit(functools.partial(jaxmpi_sequence, steps))(inputs)
    else:
        # Every trip runs the whole sequence; the carry keeps the last trip's results.
        shapes = jax.eval_shape(functools.partial(jaxmpi_sequence, steps), inputs)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def loop(inputs):
            def trip(_, results):
                return jaxmpi_sequence(steps, inputs)

            return jax.lax.fori_loop(0, LOOP_TRIPS, trip, zeros)

        results = jax.jit(loop)(inputs)
    return [None if r is None else np.asarray(jax.device_get(r)) for r in results]


# ---------------------------------------------------------------------------------------
# The same sequence with mpi4py on numpy arrays
# ---------------------------------------------------------------------------------------


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _from_bytes(b: np.ndarray, dtype, shape) -> np.ndarray:
    return b.view(dtype).reshape(shape)


def reference_step(comm, step: Step, x: np.ndarray):
    """Step `step` on this rank with mpi4py: what jaxmpi must give here."""
    kind, root, size, rank = step.kind, step.root, SIZE, RANK
    if kind in REDUCTIONS:
        every = [_from_bytes(b, x.dtype, x.shape) for b in comm.allgather(_bytes(x))]
        if kind == "allreduce":
            return reduce_arrays(step.op, every)
        if kind == "reduce":
            return reduce_arrays(step.op, every) if rank == root else x
        if kind == "scan":
            return reduce_arrays(step.op, every[: rank + 1])
        if kind == "exscan":
            return np.zeros_like(x) if rank == 0 else reduce_arrays(step.op, every[:rank])
        return reduce_arrays(step.op, every)[rank]  # reduce_scatter
    if kind == "bcast":
        buf = _bytes(x).copy()
        comm.Bcast(buf, root)
        return _from_bytes(buf, x.dtype, x.shape)
    if kind in ("gather", "allgather"):
        out = np.empty(size * x.nbytes, np.uint8)
        if kind == "allgather":
            comm.Allgather(_bytes(x), out)
        else:
            comm.Gather(_bytes(x), out if rank == root else None, root)
            if rank != root:
                return x
        return _from_bytes(out, x.dtype, (size, *x.shape))
    if kind == "scatter":
        out = np.empty(np.empty(step.shape, x.dtype).nbytes, np.uint8)
        comm.Scatter(_bytes(x) if rank == root else None, out, root)
        return _from_bytes(out, x.dtype, step.shape)
    if kind == "alltoall":
        out = np.empty(x.nbytes, np.uint8)
        comm.Alltoall(_bytes(x), out)
        return _from_bytes(out, x.dtype, x.shape)
    row = np.empty(step.shape, x.dtype).nbytes
    if kind in ("gatherv", "allgatherv", "scatterv"):
        counts = [c * row for c in step.counts]
        displs = [sum(counts[:r]) for r in range(size)]
        total = (sum(step.counts), *step.shape)
        if kind == "scatterv":
            out = np.empty(counts[rank], np.uint8)
            send = [_bytes(x), counts, displs, MPI.BYTE] if rank == root else None
            comm.Scatterv(send, out, root)
            return _from_bytes(out, x.dtype, (step.counts[rank], *step.shape))
        out = np.empty(sum(counts), np.uint8)
        if kind == "allgatherv":
            comm.Allgatherv(_bytes(x), [out, counts, displs, MPI.BYTE])
        else:
            comm.Gatherv(_bytes(x), [out, counts, displs, MPI.BYTE] if rank == root else None, root)
            if rank != root:
                return x
        return _from_bytes(out, x.dtype, total)
    if kind == "alltoallv":
        send = [c * row for c in step.counts[rank]]
        receive = [step.counts[s][rank] * row for s in range(size)]
        out = np.empty(sum(receive), np.uint8)
        comm.Alltoallv(
            [_bytes(x), send, [sum(send[:r]) for r in range(size)], MPI.BYTE],
            [out, receive, [sum(receive[:r]) for r in range(size)], MPI.BYTE],
        )
        rows = sum(step.counts[s][rank] for s in range(size))
        return _from_bytes(out, x.dtype, (rows, *step.shape))
    if kind == "send_recv":
        for sender, receiver in step.pairs:
            if rank == sender:
                comm.Send(_bytes(x), receiver, step.tag)
            elif rank == receiver:
                out = np.empty(x.nbytes, np.uint8)
                comm.Recv(out, sender, step.tag)
                return _from_bytes(out, x.dtype, x.shape)
        return None
    if kind == "sendrecv":
        (shift,) = step.pairs
        out = np.empty(x.nbytes, np.uint8)
        comm.Sendrecv(
            _bytes(x), (rank + shift) % size, step.tag, out, (rank - shift) % size, step.tag
        )
        return _from_bytes(out, x.dtype, x.shape)
    comm.Barrier()
    return None


_REFERENCE_COMM = MPI.COMM_WORLD.Dup() if MPI is not None else None


# ---------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------


def _fingerprint(sequence: Sequence) -> str:
    return hashlib.sha256(str(sequence).encode()).hexdigest()


@pytest.mark.parametrize("seed", SEEDS)
def test_random_sequence_matches_mpi4py(seed):
    sequence = make_sequence(seed)
    # Every rank must have built the same sequence, or the comparison means nothing.
    fingerprints = _REFERENCE_COMM.allgather(_fingerprint(sequence))
    assert len(set(fingerprints)) == 1, f"ranks built different sequences:\n{sequence}"

    inputs = [step_input(seed, i, step, RANK) for i, step in enumerate(sequence.steps)]
    try:
        got = run_jaxmpi(sequence, inputs)
        error = None
    except Exception as err:
        got, error = None, err
    expected = [reference_step(_REFERENCE_COMM, s, x) for s, x in zip(sequence.steps, inputs)]

    replay = f"replay: JAXMPI_RANDOM_SEED={seed} on {SIZE} ranks\n{sequence}"
    assert error is None, f"jaxmpi raised {type(error).__name__}: {error}\n{replay}"
    problems = []
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if (g is None) != (e is None):
            problems.append(f"step {i}: got {g!r}, expected {e!r}")
            continue
        if g is None:
            continue
        try:
            assert_array(g, e, f"step {i} on rank {RANK}")
        except AssertionError as err:
            problems.append(str(err))
    assert not problems, "\n".join(problems) + f"\n{replay}"
