"""Random sharded programs for the differential tester (run.py), as plain data: a program
is a dict made from a seed and a layout (P processes x L devices), the same on every
process and every run, which build.py turns into a jitted JAX function.

A program is a mesh over the job's devices (the (process, device) grid, its transpose,
one line of every device, or the devices in a random order folded into a random 2-D
shape), an input of one block per device in one of four dtypes, and three parts:

- `pre` and `post`: GSPMD operations on the global array around the `shard_map` (flip,
  roll, cumsum, sort, reshape and transpose round trips, a sum broadcast back), each
  pinned to a sharding so that XLA must move data between devices;
- `body`: the `shard_map`'s statements, each on the current block `v`: JAX's collectives
  (psum, pmax, pmin, psum_scatter, all_gather, all_to_all, ppermute with random pairs)
  over one mesh axis or both, axis_index arithmetic, local arithmetic, MeshComm ops
  (point to point with PROC_NULL ends, collectives, rooted ops, a scan: `meshcomm`; under
  gloo, which refuses a MeshComm, their JAX twins run),
  and statements holding statements: `cond` and `switch` whose predicate differs per
  device, `while` loops whose trip count differs per device, `scan`. `emit` keeps the
  current block as an output.

Control flow is well-formed by construction: a predicate or trip count that differs per
device reads only mesh axes that no collective inside it runs along, or is made the same
along the axes they may run along (from a psum over those), so the members of every group
take the same path. `ill_formed` programs (the soak's option) break that rule on purpose:
there the tester counts only what gloo runs right.

Values are small integers in every dtype (bool: truth values), so that any order of a
sum gives the same bits: the routes are compared bit for bit.
"""

from __future__ import annotations

import math
import random

DTYPES = ("float32", "int32", "bfloat16", "bool")
# Rows per device: every group size a layout of up to 8 devices gives divides it.
ROWS = 24
GSPMD = ("flip", "roll", "cumsum", "sort", "reshape", "transpose", "centred")
REDUCTIONS = {"sum": "psum", "max": "pmax", "min": "pmin"}


def layout_of(text: str) -> tuple[int, int]:
    processes, local = (int(n) for n in text.split("x"))
    return processes, local


class Generator:
    """Draws one program. `axes`: the mesh's axis names and sizes."""

    def __init__(self, seed: int, processes: int, local: int, ill_formed: bool = False):
        self.rng = random.Random(f"{seed}/{processes}x{local}")
        self.seed, self.processes, self.local = seed, processes, local
        self.devices = processes * local
        self.ill_formed = ill_formed
        self.dtype = self.rng.choice(DTYPES)
        self.mesh = self._mesh()
        self.axes = dict(zip(self.mesh["names"], self.mesh["shape"]))

    def _mesh(self) -> dict:
        n, p, loc = self.devices, self.processes, self.local
        order = list(range(n))  # devices by (process, id): device k is (k // L, k % L)
        kind = self.rng.choice(("grid", "grid", "transposed", "line", "scrambled"))
        if kind == "grid":
            return {"kind": kind, "shape": [p, loc], "names": ["a", "b"], "order": order}
        if kind == "transposed":
            order = [q * loc + j for j in range(loc) for q in range(p)]
            return {"kind": kind, "shape": [loc, p], "names": ["a", "b"], "order": order}
        self.rng.shuffle(order)
        if kind == "line" or n < 4:
            return {"kind": kind, "shape": [n], "names": ["a"], "order": order}
        factors = [f for f in range(2, n) if n % f == 0]
        first = self.rng.choice(factors)
        return {"kind": kind, "shape": [first, n // first], "names": ["a", "b"], "order": order}

    def size(self, axes: list[str]) -> int:
        return math.prod(self.axes[a] for a in axes)

    def some_axes(self) -> list[str]:
        """One axis or every axis (in either order)."""
        names = list(self.axes)
        choice = self.rng.choice(
            [[a] for a in names] + ([names, names[::-1]] if len(names) > 1 else [])
        )
        return list(choice)

    def program(self) -> dict:
        cols = self.rng.choice((1, 2, 3))
        body = self.statements(self.rng.randint(3, 7), depth=0, free=set(self.axes))
        body.append({"op": "emit"})
        return {
            "seed": self.seed,
            "layout": [self.processes, self.local],
            "mesh": self.mesh,
            "dtype": self.dtype,
            "rows": ROWS,
            "cols": cols,
            "split": self.rng.choice(("mesh", "reversed")) if len(self.axes) > 1 else "mesh",
            "pre": self.gspmd(),
            "body": body,
            "post": self.gspmd(),
            "ill_formed": self.ill_formed,
        }

    def gspmd(self) -> list[dict]:
        ops = []
        for _ in range(self.rng.choice((0, 0, 1, 2))):
            op = self.rng.choice(GSPMD)
            if self.dtype == "bool" and op in ("cumsum", "centred"):
                op = "flip"
            if self.dtype == "bfloat16" and op == "cumsum":
                op = "roll"  # a running sum of 192 rows leaves bfloat16's integers
            ops.append({"op": op, "k": self.rng.randint(1, 7)})
        return ops

    def statements(self, count: int, depth: int, free: set[str]) -> list[dict]:
        """`count` statements whose collectives run along the axes of `free` only (the
        axes no enclosing per-device predicate reads)."""
        return [self.statement(depth, free) for _ in range(count)]

    def collective_axes(self, free: set[str]) -> list[str] | None:
        """Axes for a collective inside a body whose free axes are `free` (None: none):
        one axis or every axis, in either order, as `some_axes` draws them, where they are
        free, else one that is."""
        chosen = self.some_axes()
        if set(chosen) <= free or (self.ill_formed and self.rng.random() < 0.3):
            return chosen
        options = [a for a in self.axes if a in free]
        return [self.rng.choice(options)] if options else None

    def statement(self, depth: int, free: set[str]) -> dict:
        kinds = ["reduce", "reduce_scatter", "all_gather", "all_to_all", "ppermute", "index"]
        kinds += ["local", "meshcomm"]
        if depth == 0:
            kinds.append("emit")  # an output: not from inside a branch or a loop
        if depth < 2:
            kinds += ["cond", "switch", "while", "scan"]
        kind = self.rng.choice(kinds)
        if kind in ("cond", "switch", "while", "scan"):
            return self.control(kind, depth, free)
        if kind in ("local", "emit"):
            return {"op": kind, "k": self.rng.randint(2, 5)}
        if kind == "index":  # not a collective: any axes, wherever
            return {"op": "index", "axes": self.some_axes(), "k": self.rng.randint(1, 5)}
        axes = self.collective_axes(free)
        if axes is None:
            return {"op": self.rng.choice(("local", "index")), "axes": self.some_axes(), "k": 3}
        if kind == "reduce":
            ops = ["max", "min"] if self.dtype == "bool" else list(REDUCTIONS)
            return {"op": "reduce", "kind": self.rng.choice(ops), "axes": axes}
        if kind == "reduce_scatter" and self.dtype != "bool":
            return {
                "op": "reduce_scatter",
                "axes": axes,
                "back": self.rng.choice(("tile", "gather")),
            }
        if kind == "all_gather":
            g = self.size(axes)
            return {
                "op": "all_gather",
                "axes": axes,
                "dim": self.rng.choice((0, 1)),
                "pick": [self.rng.randrange(g), self.rng.randrange(g)],
            }
        if kind == "all_to_all":
            return {"op": "all_to_all", "axes": axes, "concat": self.rng.choice((0, 1))}
        if kind == "meshcomm":
            return self.meshcomm(axes)
        return {"op": "ppermute", "axes": axes, "pairs": self.pairs(self.size(axes))}

    def pairs(self, n: int) -> list[list[int]]:
        """A random partial permutation of n: self-loops, cycles, chains, some left out."""
        sources = [q for q in range(n) if self.rng.random() < 0.75] or [self.rng.randrange(n)]
        targets = self.rng.sample(range(n), len(sources))
        return [[s, t] for s, t in zip(sources, targets)]

    def meshcomm(self, axes: list[str]) -> dict:
        n = self.size(axes)
        kinds = ["sendrecv", "pipeline", "bcast", "allgather", "alltoall", "gather"]
        if self.dtype != "bool":
            kinds += ["allreduce", "allreduce", "scan", "reduce", "scatter"]
        kind = self.rng.choice(kinds)
        op = {"op": "meshcomm", "kind": kind, "axes": axes}
        if kind in ("allreduce", "reduce"):
            op["reduce"] = self.rng.choice(("SUM", "MAX", "MIN"))
        elif kind == "sendrecv":
            pairs = self.pairs(n)
            op["dest"] = [next((t for s, t in pairs if s == q), -1) for q in range(n)]
        elif kind == "pipeline":
            op["forward"] = self.rng.random() < 0.5
        if kind in ("bcast", "allgather", "reduce", "gather", "scatter"):
            op["root"] = self.rng.randrange(n)
        return op

    def control(self, kind: str, depth: int, free: set[str]) -> dict:
        count = self.rng.randint(1, 3)
        if kind == "scan":
            return {
                "op": "scan",
                "length": self.rng.randint(1, 3),
                "body": self.statements(count, depth + 1, free),
            }
        mod = self.rng.randint(2, 3)
        if free and self.rng.random() < 0.25:
            # The same on every device of each group along the free axes: from a psum
            # over them (over every axis, in an ill-formed program).
            over = list(self.axes) if self.ill_formed else [a for a in self.axes if a in free]
            predicate, inner = {"uniform": over, "mod": mod}, free
        else:
            names = list(self.axes)
            reads = [self.rng.choice(names)] if self.rng.random() < 0.8 else names
            predicate = {"axes": reads, "mod": mod, "at": self.rng.randint(0, 1)}
            inner = free if self.ill_formed else free - set(reads)
        if kind == "while":
            return {
                "op": "while",
                "trip": predicate,
                "body": self.statements(count, depth + 1, inner),
            }
        branches = 2 if kind == "cond" else self.rng.randint(2, 3)
        return {
            "op": kind,
            "predicate": predicate,
            "branches": [
                self.statements(self.rng.randint(1, 3), depth + 1, inner) for _ in range(branches)
            ],
        }


def generate(seed: int, processes: int, local: int, ill_formed: bool = False) -> dict:
    return Generator(seed, processes, local, ill_formed).program()
