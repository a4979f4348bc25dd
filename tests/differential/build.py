"""A generated program (generate.py) as a jitted JAX function over a mesh of this job's
devices, and its input. The same program on every route: JAX's own collectives, and a
MeshComm's ops where `meshcomm` says so (under gloo, which refuses a MeshComm, their JAX
twins instead, which mean the same).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmpi

try:
    from jax import shard_map

    UNCHECKED = {"check_vma": False}
except ImportError:  # JAX before 0.7
    from jax.experimental.shard_map import shard_map

    UNCHECKED = {"check_rep": False}

REDUCE = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}
MPI_REDUCE = {"SUM": "sum", "MAX": "max", "MIN": "min"}


def devices_in_order() -> list:
    """The job's devices by (process, id): device k is device k % L of process k // L."""
    return sorted(jax.devices(), key=lambda d: (d.process_index, d.id))


class Program:
    """`spec` (generate.py) built over `devices`; `meshcomms`: run a MeshComm's ops (else
    their JAX twins)."""

    def __init__(self, spec: dict, devices: list, meshcomms: bool):
        self.spec = spec
        m = spec["mesh"]
        self.names = tuple(m["names"])
        self.mesh = Mesh(np.array([devices[k] for k in m["order"]]).reshape(m["shape"]), self.names)
        self.sizes = dict(zip(self.names, m["shape"]))
        self.dtype = jnp.dtype(spec["dtype"])
        self.boolean = spec["dtype"] == "bool"
        split = self.names if spec["split"] == "mesh" else self.names[::-1]
        self.spec_of_blocks = P(split)
        self.comms: dict[tuple, jaxmpi.MeshComm] = {}
        self.meshcomms = meshcomms
        if meshcomms:  # made now, in the same order on every process (collective)
            for axes in _meshcomm_axes(spec["body"]):
                self.comms.setdefault(axes, jaxmpi.MeshComm(self.mesh, axes))

    # --- values ---------------------------------------------------------------------

    def input(self) -> np.ndarray:
        n = int(np.prod(self.spec["mesh"]["shape"]))
        rng = np.random.default_rng(self.spec["seed"])
        shape = (n * self.spec["rows"], self.spec["cols"])
        if self.boolean:
            return rng.random(shape) < 0.5
        return np.asarray(rng.integers(-15, 16, shape), self.dtype)

    def norm(self, v):
        """Back into [-15, 15]: any sum of a few such values is exact in every dtype."""
        if self.boolean:
            return v
        return (jnp.mod(v, 31) - 15).astype(self.dtype)

    def combine(self, a, b):
        return jnp.logical_xor(a, b) if self.boolean else self.norm(a + b)

    def size(self, axes) -> int:
        return int(np.prod([self.sizes[a] for a in axes]))

    def in_mesh_order(self, axes, rank: int) -> int:
        """Where ppermute over `axes` numbers the device whose axis_index (and MeshComm
        rank) along `axes` is `rank`: JAX's ppermute (0.10) numbers a tuple of axes in the
        mesh's order of them, whatever order the tuple names them in."""
        coords = dict(zip(axes, np.unravel_index(rank, [self.sizes[a] for a in axes])))
        ordered = [a for a in self.names if a in axes]
        return int(
            np.ravel_multi_index([coords[a] for a in ordered], [self.sizes[a] for a in ordered])
        )

    # --- the shard_map's statements ---------------------------------------------------

    def run(self, statements: list, v, outputs: list | None = None):
        for s in statements:
            op = s["op"]
            if op == "emit":
                outputs.append(v)
            else:
                v = getattr(self, f"do_{op}")(s, v)
        return v

    def do_local(self, s, v):
        return jnp.logical_not(v) if self.boolean else self.norm(v * s["k"] + 1)

    def do_index(self, s, v):
        index = lax.axis_index(tuple(s["axes"]))
        if self.boolean:
            return jnp.logical_xor(v, index % 2 == 0)
        return self.norm(v + index * s["k"])

    def do_reduce(self, s, v):
        return self.norm(REDUCE[s["kind"]](v, tuple(s["axes"])))

    def do_reduce_scatter(self, s, v):
        axes, g = tuple(s["axes"]), self.size(s["axes"])
        part = lax.psum_scatter(v, axes, scatter_dimension=0, tiled=True)
        if s["back"] == "tile":
            return self.norm(jnp.tile(part, (g, 1)))
        return self.norm(lax.all_gather(part, axes, axis=0, tiled=True))

    def do_all_gather(self, s, v):
        axes, g = tuple(s["axes"]), self.size(s["axes"])
        rows, cols = v.shape
        a, b = s["pick"]
        if s["dim"] == 0:
            whole = lax.all_gather(v, axes, axis=0, tiled=True).reshape(g, rows, cols)
            return self.combine(whole[a], whole[b])
        whole = lax.all_gather(v, axes, axis=1, tiled=True).reshape(rows, g, cols)
        return self.combine(whole[:, a], whole[:, b])

    def do_all_to_all(self, s, v):
        axes = tuple(s["axes"])
        moved = lax.all_to_all(v, axes, 0, s["concat"], tiled=True)
        return moved.reshape(v.shape)

    def do_ppermute(self, s, v):
        moved = lax.ppermute(v, tuple(s["axes"]), [tuple(p) for p in s["pairs"]])
        return self.combine(moved, v)

    def predicate(self, p, v):
        """A per-device value read from mesh axes, or one every device shares."""
        if "uniform" in p:
            total = lax.psum(jnp.sum(v.astype(jnp.int32)), tuple(p["uniform"]))
            return total % p["mod"]
        return lax.axis_index(tuple(p["axes"])) % p["mod"]

    def do_cond(self, s, v):
        p = s["predicate"]
        taken = self.predicate(p, v) == p.get("at", 0)
        first, other = (lambda w, b=b: self.run(b, w) for b in s["branches"])
        return lax.cond(taken, first, other, v)

    def do_switch(self, s, v):
        branches = [lambda w, b=b: self.run(b, w) for b in s["branches"]]
        return lax.switch(self.predicate(s["predicate"], v) % len(branches), branches, v)

    def do_while(self, s, v):
        trip = self.predicate(s["trip"], v) + 1
        return lax.fori_loop(0, trip, lambda _, w: self.run(s["body"], w), v)

    def do_scan(self, s, v):
        return lax.scan(lambda w, _: (self.run(s["body"], w), None), v, None, length=s["length"])[0]

    # --- MeshComm ops, or their twins ------------------------------------------------

    def do_meshcomm(self, s, v):
        axes = tuple(s["axes"])
        n, kind = self.size(axes), s["kind"]
        index = lax.axis_index(axes)
        if kind in ("sendrecv", "pipeline"):
            dest = s["dest"] if kind == "sendrecv" else _chain(n, s["forward"])
            source = [dest.index(q) if q in dest else -1 for q in range(n)]
            template = self.combine(v, v) if self.boolean else self.norm(v * 2)
            if not self.meshcomms:
                pairs = [
                    (self.in_mesh_order(axes, q), self.in_mesh_order(axes, t))
                    for q, t in enumerate(dest)
                    if t >= 0
                ]
                moved = lax.ppermute(v, axes, pairs)
                received = jnp.asarray([q >= 0 for q in source])[index]
                return jnp.where(received, moved, template)
            comm, null = self.comms[axes], jaxmpi.PROC_NULL
            dest = [null if t < 0 else t for t in dest]
            source = [null if q < 0 else q for q in source]
            if kind == "pipeline":
                jaxmpi.send(v, dest, comm=comm)
                return jaxmpi.recv(template, source, comm=comm)
            return jaxmpi.sendrecv(v, template, source, dest, comm=comm)
        if kind == "allreduce":
            if not self.meshcomms:
                return self.norm(REDUCE[MPI_REDUCE[s["reduce"]]](v, axes))
            op = getattr(jaxmpi, s["reduce"])
            return self.norm(jaxmpi.allreduce(v, op, comm=self.comms[axes]))
        root = s.get("root", 0)
        if kind == "reduce":  # the root's is reduced; elsewhere the operand stays
            if not self.meshcomms:
                reduced = REDUCE[MPI_REDUCE[s["reduce"]]](v, axes)
                return self.norm(jnp.where(index == root, reduced, v))
            op = getattr(jaxmpi, s["reduce"])
            return self.norm(jaxmpi.reduce(v, op, root, comm=self.comms[axes]))
        if kind == "gather":  # every block at the root, zeros elsewhere
            if not self.meshcomms:
                whole = jnp.where(
                    index == root, lax.all_gather(v, axes), False if self.boolean else 0
                )
            else:
                whole = jaxmpi.gather(v, root, comm=self.comms[axes])
            return self.combine(whole[n - 1 - root], v)
        if kind == "scatter":  # block q of the root's table to rank q
            if not self.meshcomms:
                return self.norm(lax.all_gather(v, axes)[root] * (index + 1))
            table = jnp.stack([v * (q + 1) for q in range(n)])
            return self.norm(jaxmpi.scatter(table, root, comm=self.comms[axes]))
        if kind == "bcast":
            if not self.meshcomms:
                return lax.all_gather(v, axes)[root]
            return jaxmpi.bcast(v, root, comm=self.comms[axes])
        if kind == "allgather":
            whole = (
                jaxmpi.allgather(v, comm=self.comms[axes])
                if self.meshcomms
                else lax.all_gather(v, axes)
            )
            return self.combine(whole[root], v)
        if kind == "alltoall":
            if not self.meshcomms:
                return lax.all_to_all(v, axes, 0, 0, tiled=True)
            blocks = v.reshape(n, v.shape[0] // n, v.shape[1])
            return jaxmpi.alltoall(blocks, comm=self.comms[axes]).reshape(v.shape)
        # scan: the sum of every rank's block up to this one's
        if not self.meshcomms:
            return self.norm(jnp.cumsum(lax.all_gather(v, axes), 0)[index])
        return self.norm(jaxmpi.scan(v, jaxmpi.SUM, comm=self.comms[axes]))

    # --- GSPMD around the shard_map ----------------------------------------------------

    def gspmd(self, ops: list, x):
        blocks = NamedSharding(self.mesh, self.spec_of_blocks)
        split = self.spec_of_blocks[0]
        for o in ops:
            op, k = o["op"], o["k"]
            if op == "flip":
                x = jnp.flip(x, 0)
            elif op == "roll":
                x = jnp.roll(x, k, 0)
            elif op == "cumsum":
                x = self.norm(jnp.cumsum(x, 0))
            elif op == "sort":
                x = jnp.sort(x, axis=0)
            elif op == "centred":
                x = self.norm(x - x.sum(0, keepdims=True))
            elif op == "reshape":
                rows, cols = x.shape
                wide = lax.with_sharding_constraint(
                    x.reshape(rows // 2, 2 * cols), NamedSharding(self.mesh, P(split, None))
                )
                x = wide.reshape(rows, cols)
            elif op == "transpose":
                x = lax.with_sharding_constraint(x.T, NamedSharding(self.mesh, P(None, split))).T
            x = lax.with_sharding_constraint(x, blocks)
        return x

    def function(self):
        """The whole program, jitted: pre, the shard_map (its outputs: the blocks each
        top-level `emit` kept, the last one, the final block, first), post on that one."""
        emitted = sum(1 for s in self.spec["body"] if s["op"] == "emit")

        def body(v):
            outputs = []
            self.run(self.spec["body"], v, outputs)
            return (outputs[-1], *outputs[:-1])

        mapped = shard_map(
            body,
            mesh=self.mesh,
            in_specs=self.spec_of_blocks,
            out_specs=(self.spec_of_blocks,) * emitted,
            **UNCHECKED,
        )

        def program(x):
            last, *rest = mapped(self.gspmd(self.spec["pre"], x))
            return (self.gspmd(self.spec["post"], last), *rest)

        return jax.jit(program)

    def place(self, x: np.ndarray) -> jax.Array:
        sharding = NamedSharding(self.mesh, self.spec_of_blocks)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _chain(n: int, forward: bool) -> list[int]:
    """A pipeline's destinations: to the next rank (the last to nobody), or the previous."""
    if forward:
        return [q + 1 if q + 1 < n else -1 for q in range(n)]
    return [q - 1 for q in range(n)]


def _meshcomm_axes(statements: list) -> list[tuple]:
    """The axes of every MeshComm a program's statements use, in the order they appear."""
    found = []
    for s in statements:
        if s["op"] == "meshcomm" and tuple(s["axes"]) not in found:
            found.append(tuple(s["axes"]))
        for inner in s.get("branches", []) + [s.get("body", [])]:
            found += [a for a in _meshcomm_axes(inner) if a not in found]
    return found


def outputs_of(results) -> dict[str, np.ndarray]:
    """Every block this process holds of each output, by output and block index."""
    held = {}
    for k, array in enumerate(results):
        for shard in array.addressable_shards:
            where = ",".join(f"{s.start}:{s.stop}" for s in shard.index)
            held[f"{k}|{where}"] = np.asarray(shard.data)
    return held
