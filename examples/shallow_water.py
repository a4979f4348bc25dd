"""A non-linear shallow-water model, domain-decomposed over MPI ranks with jaxmpi.

A zonal jet on a beta plane, in geostrophic balance, goes unstable and breaks into eddies.
The domain is a channel: periodic in x, walls in y. The ranks form a process grid
(px * py = number of ranks) and each owns a block of cells with a one-cell halo. One
jitted time step computes the tendencies, takes a third-order Adams-Bashforth step and
refreshes the halos with `jaxmpi.sendrecv` (PROC_NULL beyond the walls); `lax.fori_loop`
runs a chunk of steps per call, so a progress bar can follow. With `--overlap` the halos
travel while the block's interior is computed (`jaxmpi.isend`/`irecv` before it,
`jaxmpi.wait` after it), with the same results: bit for bit on JAX 0.10; on 0.6, 0.11
and 0.12 the last bits of some values move (at most 1e-14 in float64): XLA compiles the
two programs' kernels differently (on 0.6 it contracts other products into FMAs).

    mpirun -n 4 python examples/shallow_water.py                 # 10 model days, PNG
    mpirun -n 2 python examples/shallow_water.py --benchmark     # prints the solve time
    mpirun -n 2 python examples/shallow_water.py --benchmark --overlap
    mpirun -n 6 python examples/shallow_water.py --nx 300 --ny 120 --days 2 --float64
    XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        mpirun -n 2 python examples/shallow_water.py --mesh       # 2 processes x 2 devices

With `--mesh` the ranks are devices, not processes: the model runs in `jax.shard_map`
over every device of the job, as ranks of a `jaxmpi.MeshComm`, whatever the devices per
process; its results are the same, bit for bit, in every layout (4 processes of 1 device,
2 of 2, 1 of 4) and as with 4 MPI ranks. One trace then serves every device of a process,
so what differs between ranks is looked up by the rank at run time: the neighbours (given
per rank), the block's first row, the northern wall; the blocks must be of equal size.

Numerics: an Arakawa C grid (h at cell centres, u on east faces, v on north faces) and
the vector-invariant momentum equations,

    du/dt =  q * (hv)~ - d(g h + K)/dx + nu lap u
    dv/dt = -q * (hu)~ - d(g h + K)/dy + nu lap v
    dh/dt = -d(hu)/dx - d(hv)/dy

with the potential vorticity q = (f + zeta) / h at cell corners, the kinetic energy K at
centres and ~ an average to the velocity point. The continuity equation is in flux form,
so the total mass changes only by rounding. Walls are free-slip: v = 0 on them, h and u
mirrored into the halo.

Works with or without mpi4py (it uses `jaxmpi.COMM_WORLD`); tqdm and matplotlib are only
needed for the progress bar and the picture.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmpi

DAY = 86_400.0

# Message tags of the four halo transfers: which way the data travels.
TAG_EAST, TAG_WEST, TAG_NORTH, TAG_SOUTH = 11, 12, 13, 14

# Third-order Adams-Bashforth weights of the tendencies at steps n, n-1, n-2; the first
# step is forward Euler and the second second-order Adams-Bashforth.
AB3_WEIGHTS = np.array([[1.0, 0.0, 0.0], [1.5, -0.5, 0.0], [23 / 12, -16 / 12, 5 / 12]])


@dataclass(frozen=True)
class Physics:
    """The channel and its fluid. Lengths in metres, times in seconds."""

    dx: float = 5e3
    dy: float = 5e3
    gravity: float = 9.81
    depth: float = 100.0  # mean layer thickness
    f0: float = 1e-4  # Coriolis parameter at the channel's centre line
    beta: float = 1.6e-11  # its northward gradient
    viscosity: float = 25.0  # lateral (harmonic), m^2/s
    jet_speed: float = 8.0
    jet_width: float = 60e3
    cfl: float = 0.125  # time step as a fraction of dx / (gravity wave speed)

    @property
    def dt(self) -> float:
        return self.cfl * min(self.dx, self.dy) / math.sqrt(self.gravity * self.depth)


# ---------------------------------------------------------------------------------------
# Decomposition
# ---------------------------------------------------------------------------------------


def process_grid(size: int, nx: int, ny: int) -> tuple[int, int]:
    """(px, py) with px * py == size whose blocks are closest to square (the least halo
    per cell); every rank gets at least one cell each way."""
    pairs = [(p, size // p) for p in range(1, size + 1) if size % p == 0]
    pairs = [(px, py) for px, py in pairs if px <= nx and py <= ny]
    if not pairs:
        raise ValueError(f"cannot split a {nx} x {ny} grid over {size} ranks")
    return min(pairs, key=lambda p: (abs(math.log((nx / p[0]) / (ny / p[1]))), p[1]))


def block(n: int, parts: int, index: int) -> tuple[int, int]:
    """(start, length) of block `index` when n cells are split into `parts` blocks whose
    lengths differ by at most one (the first ones are longer)."""
    base, extra = divmod(n, parts)
    return index * base + min(index, extra), base + (index < extra)


@dataclass(frozen=True)
class Layout:
    """Where one rank sits: its block of the global grid and its neighbours."""

    nx: int
    ny: int
    px: int
    py: int
    rank: int

    @property
    def cx(self) -> int:  # process-grid column (x)
        return self.rank % self.px

    @property
    def cy(self) -> int:  # process-grid row (y)
        return self.rank // self.px

    @property
    def x_block(self) -> tuple[int, int]:
        return block(self.nx, self.px, self.cx)

    @property
    def y_block(self) -> tuple[int, int]:
        return block(self.ny, self.py, self.cy)

    def at(self, cx: int, cy: int) -> int:
        return cy * self.px + cx

    @property
    def east(self) -> int:  # periodic in x
        return self.at((self.cx + 1) % self.px, self.cy)

    @property
    def west(self) -> int:
        return self.at((self.cx - 1) % self.px, self.cy)

    @property
    def north(self) -> int:  # walls in y: no neighbour there
        return self.at(self.cx, self.cy + 1) if self.cy + 1 < self.py else jaxmpi.PROC_NULL

    @property
    def south(self) -> int:
        return self.at(self.cx, self.cy - 1) if self.cy > 0 else jaxmpi.PROC_NULL

    def of(self, rank: int) -> Layout:
        return Layout(self.nx, self.ny, self.px, self.py, rank)


def shard_map(f, mesh, in_specs, out_specs):
    """jax.shard_map (jax.experimental's before JAX 0.7), unchecked: the ops' results
    differ per device."""
    try:
        from jax import shard_map as smap

        unchecked = {"check_vma": False}
    except ImportError:
        from jax.experimental.shard_map import shard_map as smap

        unchecked = {"check_rep": False}
    return smap(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **unchecked)


def mesh_comm(nx: int, ny: int, px: int | None) -> tuple[jaxmpi.MeshComm, int]:
    """(a MeshComm over every device of the job as a py x px grid, px): jax.distributed
    started from the MPI job where it has several processes."""
    if jaxmpi.COMM_WORLD.Get_size() > 1:
        from jaxmpi import distributed

        distributed.initialize()
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    px = px or process_grid(len(devices), nx, ny)[0]
    grid = np.array(devices).reshape(len(devices) // px, px)
    return jaxmpi.MeshComm(Mesh(grid, ("y", "x"))), px


def glue(axis, *parts):
    """h, u, v of `parts` (each three arrays, or one array of the three) joined along
    `axis`: the pieces of a window of the haloed fields, or of the tendencies."""
    return tuple(jnp.concatenate([part[k] for part in parts], axis) for k in range(3))


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------


class Model:
    """The model on the ranks of `comm`. Its state is `(fields, history, step)`: fields
    holds this rank's block of h, u, v (no halo); history, shape (3, 3, ny, nx), the
    tendencies of the last three steps, step k's in slot k % 3 (a ring: XLA updates one
    slot in place, where shifting two arrays down every step would cost copies); step
    counts the steps taken. With `overlap`, the halos travel while the block computes
    (isend/irecv before, wait after), with the same results (see the module's doc)."""

    def __init__(
        self,
        nx=360,
        ny=180,
        *,
        comm=None,
        physics=Physics(),
        dtype=jnp.float32,
        px=None,
        overlap=False,
    ):
        self.comm = jaxmpi.COMM_WORLD if comm is None else comm
        # On a MeshComm one trace serves every device: the rank is known at run time only.
        self.on_devices = isinstance(self.comm, jaxmpi.MeshComm)
        self.rank = None if self.on_devices else self.comm.Get_rank()
        self.size = self.comm.Get_size()
        if px is None:
            px, py = process_grid(self.size, nx, ny)
        elif self.size % px or px > nx or self.size // px > ny:
            raise ValueError(f"--px {px} does not split {self.size} ranks over {nx} x {ny}")
        else:
            py = self.size // px
        self.layout = Layout(nx, ny, px, py, self.rank or 0)
        if self.on_devices and (nx % px or ny % py):
            raise ValueError(
                f"--mesh needs blocks of one size: {px} x {py} devices over {nx} x {ny}"
            )
        if min(block(nx, px, px - 1)[1], block(ny, py, py - 1)[1]) < 2:
            raise ValueError(
                f"{nx} x {ny} cells over {px} x {py} ranks leaves a block less than 2 cells "
                "wide, too thin for its boundary rows and columns: use fewer ranks"
            )
        self.overlap = overlap
        self.physics, self.dtype = physics, jnp.dtype(dtype)
        # f at every corner row of the grid, computed once: each block slices its rows.
        y = np.arange(ny + 1) * physics.dy
        self.coriolis = physics.f0 + physics.beta * (y - 0.5 * ny * physics.dy)
        steps = self._steps
        if self.on_devices:
            steps = shard_map(steps, self.comm.mesh, (self._specs(), P()), self._specs())
        self.steps = jax.jit(steps, donate_argnums=0)

    @property
    def leads(self) -> bool:
        """Whether this process prints: rank 0's, or on a MeshComm JAX's process 0."""
        return jax.process_index() == 0 if self.on_devices else self.rank == 0

    # --- What differs between ranks -----------------------------------------------------

    def _specs(self):
        """How the state lies over a MeshComm's mesh: one block per device."""
        blocks = P("y", "x")
        return (blocks, blocks, blocks), P(None, None, "y", "x"), P()

    def _per_rank(self, neighbour: str):
        """A neighbour (a Layout property): this rank's, or on a MeshComm every rank's."""
        if not self.on_devices:
            return getattr(self.layout, neighbour)
        return [getattr(self.layout.of(r), neighbour) for r in range(self.size)]

    def _first_row(self):
        """The block's first row in the grid: traced on a MeshComm."""
        if not self.on_devices:
            return self.layout.y_block[0]
        return self.comm.Get_rank() // self.layout.px * self.layout.y_block[1]

    def _at_north_wall(self):
        if not self.on_devices:
            return self.layout.north == jaxmpi.PROC_NULL
        return self.comm.Get_rank() // self.layout.px == self.layout.py - 1

    # --- Initial state ------------------------------------------------------------------

    def _global_initial(self):
        """h, u, v on the whole grid (numpy, float64): a balanced jet plus a ripple."""
        p, lay = self.physics, self.layout
        y = (np.arange(lay.ny) + 0.5) * p.dy  # cell centres
        x = (np.arange(lay.nx) + 0.5) * p.dx
        length_x, length_y = lay.nx * p.dx, lay.ny * p.dy
        eta = (y - 0.5 * length_y) / p.jet_width
        u = p.jet_speed / np.cosh(eta) ** 2  # sech^2 jet
        f = p.f0 + p.beta * (y - 0.5 * length_y)
        # Geostrophic balance g dh/dy = -f u, integrated northward (trapezoid rule).
        dhdy = -f * u / p.gravity
        h = np.concatenate([[0.0], np.cumsum(0.5 * (dhdy[1:] + dhdy[:-1]) * p.dy)])
        h = p.depth + h - h.mean()
        # A ripple of zonal wavenumbers 3..6 on the jet, to set off the instability.
        ripple = sum(np.cos(2 * np.pi * k * x / length_x + k) / k for k in range(3, 7))
        h2 = h[:, None] + 0.4 * np.exp(-(eta**2))[:, None] * ripple[None, :]
        u2 = np.repeat(u[:, None], lay.nx, axis=1)
        return h2, u2, np.zeros_like(h2)

    def initial_state(self):
        if self.on_devices:
            return self._global_state()
        (i0, nxl), (j0, nyl) = self.layout.x_block, self.layout.y_block
        fields = tuple(
            jnp.asarray(f[j0 : j0 + nyl, i0 : i0 + nxl], self.dtype) for f in self._global_initial()
        )
        return fields, jnp.zeros((3, 3, nyl, nxl), self.dtype), jnp.int32(0)

    def _global_state(self):
        """The state as global arrays over the MeshComm's mesh, a block per device."""
        mesh, specs = self.comm.mesh, self._specs()

        def put(value, spec):
            value = np.asarray(value, self.dtype)
            sharding = NamedSharding(mesh, spec)
            return jax.make_array_from_callback(value.shape, sharding, lambda i: value[i])

        lay = self.layout
        fields = tuple(put(f, specs[0][0]) for f in self._global_initial())
        history = put(np.zeros((3, 3, lay.ny, lay.nx)), specs[1])
        return fields, history, put(np.int32(0), specs[2]).astype(jnp.int32)

    # --- Halos --------------------------------------------------------------------------

    def _exchange(self, transfers, work, inputs):
        """(halos, work(inputs)): the halos that `transfers` bring, each transfer a
        (send, template, source, dest, tag) as for `sendrecv`, and `work` computed on
        `inputs` meanwhile. Blocking: one sendrecv each. With --overlap: the transfers
        start before the work (`jaxmpi.after` ties its inputs to the requests) and are
        waited for after it (`after=` its result), so they travel while it runs."""
        comm = self.comm
        # The scope names the exchange's calls in a profile (JAXMPI_PROFILE, jaxmpi.profile).
        halo = jax.named_scope("halo")
        if not self.overlap:
            with halo:
                halos = [
                    jaxmpi.sendrecv(s, t, source=src, dest=dst, sendtag=tag, recvtag=tag, comm=comm)
                    for s, t, src, dst, tag in transfers
                ]
            return halos, work(inputs)
        # Beyond a wall (PROC_NULL) nothing travels: the halo is the template, as sendrecv
        # returns it there (an irecv returns a fresh buffer).
        with halo:
            sends = [
                jaxmpi.isend(s, dst, tag=tag, comm=comm)
                for s, _, _, dst, tag in transfers
                if dst != jaxmpi.PROC_NULL
            ]
            receives = [
                t if src == jaxmpi.PROC_NULL else jaxmpi.irecv(t, src, tag=tag, comm=comm)
                for _, t, src, _, tag in transfers
            ]
        started = sends + [r for r in receives if isinstance(r, jaxmpi.Request)]
        result = work(jaxmpi.after(started, inputs))
        with jax.named_scope("halo"):
            jaxmpi.waitall(sends, after=result)
            halos = [
                jaxmpi.wait(r, after=result) if isinstance(r, jaxmpi.Request) else r
                for r in receives
            ]
        return halos, result

    # --- Dynamics -----------------------------------------------------------------------

    def _tendencies(self, fields):
        """d(h, u, v)/dt of this block, in two rounds of halo exchange as in a blocking
        code: the columns (x) first, then whole rows (y) widened by them, so the corners
        come along. The interior, which needs no halo, is computed during the first round,
        the western and eastern columns during the second, the southern and northern rows
        last. Each piece is `_stencil` on a window of the haloed block."""
        lay = self.layout
        east_edge = jnp.stack([f[:, -1] for f in fields])  # (3, ny) this block's columns
        west_edge = jnp.stack([f[:, 0] for f in fields])
        west, east = self._per_rank("west"), self._per_rank("east")
        columns = [
            (east_edge, east_edge, west, east, TAG_EAST),
            (west_edge, west_edge, east, west, TAG_WEST),
        ]
        halos, interior = self._exchange(
            columns if lay.px > 1 else [], lambda f: self._stencil(*f, row0=1), fields
        )
        from_west, from_east = halos or (east_edge, west_edge)  # px == 1: periodic onto itself

        def wide(rows):  # these block rows with the column halos on either side
            return glue(
                1, from_west[:, rows, None], [f[rows] for f in fields], from_east[:, rows, None]
            )

        south_rows, north_rows = wide(slice(0, 2)), wide(slice(-2, None))  # (2, nx + 2) each
        north_edge = jnp.stack([w[-1] for w in north_rows])  # corners included
        south_edge = jnp.stack([w[0] for w in south_rows])
        # The walls' halo rows: h and u mirrored (free slip), v = 0 on the wall. They are
        # the templates of the receives, and beyond a wall the neighbour is PROC_NULL:
        # nothing is received there and the halo is the template, the wall row.
        zero = jnp.zeros_like(north_edge[2:])
        south, north = self._per_rank("south"), self._per_rank("north")
        rows = [
            (north_edge, jnp.concatenate([south_edge[:2], zero]), south, north, TAG_NORTH),
            (south_edge, jnp.concatenate([north_edge[:2], zero]), north, south, TAG_SOUTH),
        ]

        def west_and_east(args):  # the block's first and last columns, less the corners
            f, west, east = args
            west_window = glue(1, west[:, :, None], [c[:, :2] for c in f])
            east_window = glue(1, [c[:, -2:] for c in f], east[:, :, None])
            return self._stencil(*west_window, row0=1), self._stencil(*east_window, row0=1)

        (from_south, from_north), (west, east) = self._exchange(
            rows, west_and_east, (fields, from_west, from_east)
        )
        south = self._stencil(*glue(0, from_south[:, None], south_rows), row0=0)
        north = self._stencil(*glue(0, north_rows, from_north[:, None]), row0=lay.y_block[1] - 1)
        return glue(0, south, glue(1, west, interior, east), north)

    def _coriolis_at_corners(self, row0, rows):
        """f at the corners of `rows` block rows from `row0` on: their southern faces and
        the last one's northern face."""
        f = jnp.asarray(self.coriolis, self.dtype)
        first = self._first_row() + row0
        return jax.lax.dynamic_slice_in_dim(f, first, rows + 1)[:, None]

    def _stencil(self, h, u, v, *, row0):
        """d(h, u, v)/dt of the cells of a window of the haloed block: h, u, v of shape
        (rows + 2, cols + 2), whose first inner row is block row `row0`; the result has
        shape (rows, cols). Each cell's tendency depends on its 3 x 3 neighbourhood only,
        so any window gives the same bits for the cells it covers."""
        p = self.physics
        dx, dy, g = p.dx, p.dy, p.gravity
        # Mass fluxes: U on the u points of columns 0..nx, V on the v points of rows 0..ny.
        U = u[:, :-1] * 0.5 * (h[:, :-1] + h[:, 1:])
        V = v[:-1, :] * 0.5 * (h[:-1, :] + h[1:, :])
        dh = -(U[1:-1, 1:] - U[1:-1, :-1]) / dx - (V[1:, 1:-1] - V[:-1, 1:-1]) / dy
        # Potential vorticity at the corners (j + 1/2, i + 1/2), j = 0..ny, i = 0..nx.
        zeta = (v[:-1, 1:] - v[:-1, :-1]) / dx - (u[1:, :-1] - u[:-1, :-1]) / dy
        h_corner = 0.25 * (h[:-1, :-1] + h[:-1, 1:] + h[1:, :-1] + h[1:, 1:])
        q = (self._coriolis_at_corners(row0, h.shape[0] - 2) + zeta) / h_corner
        # Bernoulli function g h + K at centres (j, i), j = 1..ny + 1, i = 1..nx + 1.
        ke = 0.25 * (u[1:, 1:] ** 2 + u[1:, :-1] ** 2 + v[1:, 1:] ** 2 + v[:-1, 1:] ** 2)
        bern = g * h[1:, 1:] + ke
        qv = q * (V[:, :-1] + V[:, 1:])  # q times V summed to the corners
        qu = q * (U[:-1, :] + U[1:, :])
        du = 0.25 * (qv[1:, 1:] + qv[:-1, 1:]) - (bern[:-1, 1:] - bern[:-1, :-1]) / dx
        dv = -0.25 * (qu[1:, 1:] + qu[1:, :-1]) - (bern[1:, :-1] - bern[:-1, :-1]) / dy

        def laplacian(a):
            c = a[1:-1, 1:-1]
            return (a[1:-1, 2:] + a[1:-1, :-2] - 2 * c) / dx**2 + (
                a[2:, 1:-1] + a[:-2, 1:-1] - 2 * c
            ) / dy**2

        du = du + p.viscosity * laplacian(u)
        dv = dv + p.viscosity * laplacian(v)
        if row0 + h.shape[0] - 2 == self.layout.y_block[1]:  # the wall's v stays 0
            dv = jnp.where(self._at_north_wall(), dv.at[-1].set(0), dv)
        return dh, du, dv

    def _step(self, _, state):
        fields, history, step = state
        history = jax.lax.dynamic_update_index_in_dim(
            history, jnp.stack(self._tendencies(fields)), step % 3, 0
        )
        t0, t1, t2 = (
            jax.lax.dynamic_index_in_dim(history, (step - age) % 3, keepdims=False)
            for age in range(3)
        )
        w = jnp.asarray(AB3_WEIGHTS, self.dtype)[jnp.minimum(step, 2)]
        dt = self.physics.dt
        fields = tuple(
            f + dt * (w[0] * t0[k] + w[1] * t1[k] + w[2] * t2[k]) for k, f in enumerate(fields)
        )
        return fields, history, step + 1

    def _steps(self, state, n):
        return jax.lax.fori_loop(0, n, self._step, state)

    def run(self, state, n: int):
        """The state `n` steps later (one jitted call; `state` is consumed)."""
        return self.steps(state, jnp.int32(n))

    # --- Results ------------------------------------------------------------------------

    def mass(self, state) -> float:
        """The total mass (volume) of the layer, on every rank."""
        if self.on_devices:  # a global array: JAX sums it
            return float(jnp.sum(state[0][0])) * self.physics.dx * self.physics.dy
        local = jnp.sum(state[0][0]) * self.physics.dx * self.physics.dy
        return float(jaxmpi.allreduce(local, jaxmpi.SUM, comm=self.comm))

    def gather(self, state, root=0):
        """(h, u, v) on the whole grid as numpy arrays at `root`; None elsewhere."""
        if self.on_devices:  # global arrays: every process gathers them
            from jax.experimental import multihost_utils

            fields = multihost_utils.process_allgather(state[0], tiled=True)
            return tuple(np.asarray(f) for f in fields) if jax.process_index() == root else None
        lay = self.layout
        block_fields = jnp.stack(state[0])
        nyl, nxl = block_fields.shape[1:]
        # Blocks may differ by one cell: pad each to the largest, so one gather does.
        ny_max, nx_max = block(lay.ny, lay.py, 0)[1], block(lay.nx, lay.px, 0)[1]
        padded = jnp.zeros((3, ny_max, nx_max), block_fields.dtype)
        blocks = jaxmpi.gather(padded.at[:, :nyl, :nxl].set(block_fields), root, comm=self.comm)
        if self.rank != root:
            return None
        blocks = np.asarray(blocks)
        out = np.empty((3, lay.ny, lay.nx), blocks.dtype)
        for r in range(self.size):
            (i0, nx_r), (j0, ny_r) = lay.of(r).x_block, lay.of(r).y_block
            out[:, j0 : j0 + ny_r, i0 : i0 + nx_r] = blocks[r, :, :ny_r, :nx_r]
        return out[0], out[1], out[2]


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------


def solve(model: Model, days: float, chunk: int, progress: bool):
    """Runs the model `days` forward in chunks of steps; (state, steps, seconds), where
    seconds is the solve time (compilation excluded)."""
    dt = model.physics.dt
    total = math.ceil(days * DAY / dt)
    state = model.initial_state()
    # Compile first (zero steps: the step count is an argument), so the clock measures
    # the solve alone.
    state = jax.block_until_ready(model.run(state, 0))
    bar = None
    if progress and model.leads:
        try:
            import tqdm
        except ImportError:
            print("(tqdm not installed: no progress bar)", file=sys.stderr)
        else:
            bar = tqdm.tqdm(
                total=round(total * dt / DAY, 2),
                unit="model day",
                bar_format="{l_bar}{bar}| {n:.2f}/{total:.2f} days [{elapsed}<{remaining}]",
            )
    jaxmpi.barrier()  # the processes', also over a MeshComm
    jax.effects_barrier()
    start = time.perf_counter()
    done = 0
    while done < total:
        n = min(chunk, total - done)
        state = model.run(state, n)
        jax.block_until_ready(state)
        done += n
        if bar is not None:
            bar.update(round(done * dt / DAY, 2) - bar.n)
    elapsed = time.perf_counter() - start
    if bar is not None:
        bar.close()
    return state, total, elapsed


def plot(path, model: Model, h, u, v, days: float) -> None:
    """Surface height anomaly with the currents as arrows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p, lay = model.physics, model.layout
    x = (np.arange(lay.nx) + 0.5) * p.dx / 1e3
    y = (np.arange(lay.ny) + 0.5) * p.dy / 1e3
    # Velocities at the cell centres: u periodic in x, v zero on the southern wall.
    uc = 0.5 * (u + np.roll(u, 1, axis=1))
    vc = 0.5 * (v + np.vstack([np.zeros((1, lay.nx)), v[:-1]]))
    eta = h - p.depth
    limit = float(np.max(np.abs(eta))) or 1.0
    fig, ax = plt.subplots(figsize=(9, 9 * lay.ny / lay.nx + 1.6), layout="constrained")
    mesh = ax.pcolormesh(x, y, eta, cmap="RdBu_r", vmin=-limit, vmax=limit, shading="auto")
    sy, sx = max(1, lay.ny // 24), max(1, lay.nx // 48)
    ax.quiver(
        x[sx // 2 :: sx],
        y[sy // 2 :: sy],
        uc[sy // 2 :: sy, sx // 2 :: sx],
        vc[sy // 2 :: sy, sx // 2 :: sx],
        scale_units="xy",
        angles="xy",
        scale=float(np.max(np.hypot(uc, vc))) / (1.5 * sx * p.dx / 1e3) or 1.0,
        width=0.0015,
    )
    ax.set(
        aspect="equal",
        xlabel="x (km)",
        ylabel="y (km)",
        title=f"shallow water after {days:g} days, {model.size} ranks "
        f"({lay.px} x {lay.py}), {lay.nx} x {lay.ny} cells",
    )
    fig.colorbar(
        mesh, ax=ax, orientation="horizontal", label="surface height anomaly (m)", shrink=0.7
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nx", type=int, default=360, help="cells in x (periodic)")
    parser.add_argument("--ny", type=int, default=180, help="cells in y (walls)")
    parser.add_argument(
        "--px", type=int, default=None, help="ranks in x (default: the squarest blocks)"
    )
    parser.add_argument("--days", type=float, default=10.0, help="model days to run")
    parser.add_argument("--chunk", type=int, default=100, help="steps per jitted call")
    parser.add_argument("--float64", action="store_true", help="compute in float64")
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="exchange the halos with isend/irecv/wait while the interior computes",
    )
    parser.add_argument(
        "--benchmark",
        action="store_true",
        help="no progress bar and no picture; print the solve time",
    )
    parser.add_argument(
        "--mesh",
        action="store_true",
        help="ranks are devices (a jaxmpi.MeshComm), whatever the devices per process",
    )
    parser.add_argument(
        "--out", default="shallow_water.png", help="where the PNG goes ('': no picture)"
    )
    parser.add_argument("--save", default=None, help="also write h, u, v here (.npz)")
    args = parser.parse_args(argv)
    if args.float64:
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.float64 if args.float64 else jnp.float32
    comm, px = mesh_comm(args.nx, args.ny, args.px) if args.mesh else (None, args.px)
    model = Model(args.nx, args.ny, comm=comm, px=px, dtype=dtype, overlap=args.overlap)
    lay = model.layout
    if model.leads and not args.benchmark:
        print(
            f"{model.size} ranks as {lay.px} x {lay.py}, {lay.nx} x {lay.ny} cells, "
            f"dt = {model.physics.dt:.2f} s, {args.days:g} days"
        )
    mass0 = None if args.benchmark else model.mass(model.initial_state())
    state, steps, seconds = solve(model, args.days, args.chunk, progress=not args.benchmark)
    if args.benchmark:
        if model.leads:
            print(
                f"Solution took {seconds:.2f}s ({steps} steps, "
                f"{1e6 * seconds / steps:.1f} us/step, {model.size} ranks)"
            )
        return
    mass = model.mass(state)
    fields = model.gather(state)
    if model.leads:
        if args.save:
            np.savez(args.save, h=fields[0], u=fields[1], v=fields[2])
        print(
            f"Solution took {seconds:.2f}s ({steps} steps); relative mass change "
            f"{(mass - mass0) / mass0:.1e}"
        )
        if args.out:
            plot(args.out, model, *fields, args.days)
            print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
