"""Jobs for tests/mesh_comm_jobs.sh (and `hosts` for tests/multihost_faults.sh): jaxmpi's
ops on a MeshComm over every device of the job, whatever the devices per process (XLA_FLAGS
sets them), one case per run.

    debug   an allreduce and a sendrecv; JAXMPI_DEBUG's lines name each call's MeshComm
            rank and device
    stuck   process 1 never runs the program: process 0's devices wait for its ranks until
            JAXMPI_TIMEOUT ends the job, naming the op and where it waits
    serialized  MPI initialized (by mpi4py) at MPI_THREAD_SERIALIZED, one process of 2
            devices: the MeshComm is refused when it is made, naming the level (each
            device calls MPI from its own thread)
    beside_psum  a MeshComm allreduce and JAX's psum in one jitted loop of 100 steps, on the
            route COLLECTIVES names: prints "BESIDE right" or what it got (jaxmpi's pass,
            the default), or "REFUSED" and why (gloo, which nothing orders against a
            MeshComm's ops: refused when the MeshComm is made)
    hosts   across simulated hosts (tests/multihost_faults.sh: 2 hosts x 4 processes x 2
            devices): JAX's psum, all_gather and ppermute through jaxmpi's pass, a MeshComm
            allreduce and a halo step (jaxmpi.sendrecv), on a 1-D mesh of every device and
            a (processes, devices) one, whose "d" groups stay inside a process and "p"
            groups cross hosts; each checked against numpy on integer-valued floats (sums
            exact in any order). Prints "HOST process P on NAME: D devices, ROUTE",
            per check, "CHECK name right, process P" or "CHECK name WRONG, process P: ...",
            and "PEAK RSS process P M MiB"
    gather_once  an allgatherv with counts read at run time (device r gives r + 1 rows of
            64 KiB): "CHECK allgatherv right, process P" and "REMOTE BYTES B", the bytes of
            the blocks each process takes from the others' devices, summed over the
            processes, for tests/mesh_comm_jobs.sh to hold against what MPI delivered
"""

from __future__ import annotations

import os
import resource
import socket
import sys

case = sys.argv[1]
if case == "serialized":  # before jaxmpi, which would initialize MPI at MULTIPLE
    import mpi4py

    mpi4py.rc.thread_level = "serialized"
    from mpi4py import MPI  # noqa: F401  (initializes MPI at that level)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxmpi  # noqa: E402
from jaxmpi import distributed  # noqa: E402

try:
    from jax import shard_map

    UNCHECKED = {"check_vma": False}
except ImportError:  # JAX before 0.7
    from jax.experimental.shard_map import shard_map

    UNCHECKED = {"check_rep": False}

if jaxmpi.COMM_WORLD.Get_size() > 1:
    distributed.initialize(collectives=os.environ.get("COLLECTIVES", "auto"))
devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
mesh = Mesh(np.array(devices), ("i",))
try:
    comm = jaxmpi.MeshComm(mesh)
except (ValueError, jaxmpi.MPIError) as err:  # the refusal, on every process
    print(f"process {jax.process_index()} REFUSED: {err}")
    sys.exit(0)
n = len(devices)


def body(x):
    x = jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm)
    return jaxmpi.sendrecv(x, x, lambda r: (r - 1) % n, lambda r: (r + 1) % n, comm=comm)


def beside_psum(x):
    def step(k, v):
        return jaxmpi.allreduce(v, jaxmpi.SUM, comm=comm) / n + jax.lax.psum(v, "i") / n - v

    return jax.lax.fori_loop(0, 100, step, x)


def check(name, got, want):
    """One line per check: every addressable shard of `got` against `want`'s block."""
    wrong = [
        f"{s.index}: {np.asarray(s.data).ravel().tolist()} != {want[s.index].ravel().tolist()}"
        for s in got.addressable_shards
        if not np.array_equal(np.asarray(s.data), want[s.index])
    ]
    verdict = f"WRONG, process {me}: {'; '.join(wrong)[:400]}" if wrong else f"right, process {me}"
    say(f"CHECK {name} {verdict}")


def say(line):
    """One line in one write: the launcher forwards each process's writes as they come, so
    print's two (text, then newline) could interleave with another process's line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def hosts():
    """The checks of the `hosts` case (see the docstring); k values a device."""
    k = 4
    ring = [(r, (r + 1) % n) for r in range(n)]

    def line(x):  # a block of k on each of the n devices of axis "i"
        left = jaxmpi.sendrecv(
            x[-1:], x[-1:], lambda r: (r - 1) % n, lambda r: (r + 1) % n, comm=comm
        )
        right = jaxmpi.sendrecv(
            x[:1], x[:1], lambda r: (r + 1) % n, lambda r: (r - 1) % n, comm=comm
        )
        halo = jnp.concatenate([left, x, right])
        return (
            jax.lax.psum(x, "i"),
            jax.lax.all_gather(x, "i", tiled=True),
            jax.lax.ppermute(x, "i", ring),
            jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm),
            halo[:-2] + halo[2:] - 2 * halo[1:-1],
        )

    g = np.arange(n * k, dtype=np.float32) - 7
    spec = P("i")
    f = jax.jit(shard_map(line, mesh=mesh, in_specs=spec, out_specs=spec, **UNCHECKED))
    x = jax.make_array_from_callback(g.shape, NamedSharding(mesh, spec), lambda i: g[i])
    psum, gathered, permuted, summed, laplace = jax.block_until_ready(f(x))
    blocks = g.reshape(n, k)
    check(f"psum 1-D {n}", psum, np.tile(blocks.sum(0), n))
    check(f"all_gather 1-D {n}", gathered, np.tile(g, n))
    check(f"ppermute ring 1-D {n}", permuted, np.roll(g, k))
    check(f"MeshComm allreduce 1-D {n}", summed, np.tile(blocks.sum(0), n))
    check(f"MeshComm halo sendrecv 1-D {n}", laplace, np.roll(g, 1) + np.roll(g, -1) - 2 * g)

    # (processes, devices): "d" inside a process, "p" across processes and hosts.
    procs = jax.process_count()
    grid = Mesh(np.array(devices).reshape(procs, n // procs), ("p", "d"))
    along_p, along_d = jaxmpi.MeshComm(grid, "p"), jaxmpi.MeshComm(grid, "d")
    every = jaxmpi.MeshComm(grid)
    p_ring = [(r, (r + 1) % procs) for r in range(procs)]

    def plane(x):
        return (
            jax.lax.psum(x, "d"),
            jax.lax.psum(x, "p"),
            jax.lax.all_gather(x, "p", tiled=True),
            jax.lax.ppermute(x, "p", p_ring),
            jaxmpi.allreduce(x, jaxmpi.SUM, comm=along_d),
            jaxmpi.allreduce(x, jaxmpi.SUM, comm=along_p),
            jaxmpi.allreduce(x, jaxmpi.SUM, comm=every),
        )

    spec = P("p", "d")
    h = g.reshape(procs, n // procs * k) * 3 + 1
    f = jax.jit(shard_map(plane, mesh=grid, in_specs=spec, out_specs=spec, **UNCHECKED))
    x = jax.make_array_from_callback(h.shape, NamedSharding(grid, spec), lambda i: h[i])
    d_sum, p_sum, p_gathered, p_permuted, d_all, p_all, all_all = jax.block_until_ready(f(x))
    cells = h.reshape(procs, n // procs, k)  # [p, d, :] is device (p, d)'s block
    per_d = cells.sum(0)  # over "p"
    per_p = cells.sum(1)  # over "d"
    want_d = np.tile(per_p, (1, n // procs))
    want_p = np.tile(per_d.reshape(-1), (procs, 1))
    want_gather = np.tile(h, (procs, 1))
    name = f"{procs}x{n // procs}"
    check(f"psum d 2-D {name}", d_sum, want_d)
    check(f"psum p 2-D {name}", p_sum, want_p)
    check(f"all_gather p 2-D {name}", p_gathered, want_gather)
    check(f"ppermute ring p 2-D {name}", p_permuted, np.roll(h, 1, axis=0))
    check(f"MeshComm allreduce d 2-D {name}", d_all, want_d)
    check(f"MeshComm allreduce p 2-D {name}", p_all, want_p)
    check(
        f"MeshComm allreduce 2-D {name}", all_all, np.tile(cells.sum((0, 1)), (procs, n // procs))
    )


def gather_once():
    """See the docstring; every block's rows hold its device's number."""
    row = 16384  # float32: 64 KiB
    counts = np.arange(n) + 1
    capacity = int(counts.sum())

    def gathered(b):
        y = jaxmpi.allgatherv(b[0], jnp.asarray(counts), recv_capacity=capacity, comm=comm)
        return y[None]

    f = jax.jit(shard_map(gathered, mesh=mesh, in_specs=P("i"), out_specs=P("i"), **UNCHECKED))
    x = jax.make_array_from_callback(
        (n, n, row),
        NamedSharding(mesh, P("i")),
        lambda i: np.full((1, n, row), i[0].start, np.float32),
    )
    rows = np.repeat(np.arange(n, dtype=np.float32), counts)[:, None]
    check("allgatherv", f(x), np.broadcast_to(rows, (n, capacity, row)))
    owner = [d.process_index for d in devices]
    remote = sum(int(counts[r]) * row * 4 for r in range(n) for p in set(owner) if owner[r] != p)
    if me == 0:
        say(f"REMOTE BYTES {remote}")


me = jax.process_index()
if case == "gather_once":
    gather_once()
    sys.exit(0)
if case == "hosts":
    from jaxmpi._binding import jax_collectives

    route = jax_collectives.chosen[0]
    host = socket.gethostname()
    say(f"HOST process {me} on {host}: {len(jax.local_devices())} devices, {route}")
    hosts()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    say(f"PEAK RSS process {me} {peak} MiB")
    sys.exit(0)
if case == "beside_psum":
    body = beside_psum
f = jax.jit(shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), **UNCHECKED))
x = jax.make_array_from_callback(
    (n,), NamedSharding(mesh, P("i")), lambda i: np.arange(n, dtype=np.float32)[i]
)
if case == "stuck" and jax.process_index() == 1:
    sys.exit(0)  # never runs the program
try:
    y = jax.block_until_ready(f(x))
except Exception as err:  # the refusal, on every process
    print(f"process {jax.process_index()} REFUSED: {err}")
    sys.exit(0)
print(f"process {jax.process_index()}: {np.asarray(y.addressable_shards[0].data).tolist()}")
if case == "beside_psum":  # each step makes v 2 * mean - v: after an even number, v again
    want = np.arange(n, dtype=np.float32)
    got = np.concatenate([np.asarray(s.data) for s in y.addressable_shards])
    mine = np.concatenate([want[s.index] for s in y.addressable_shards])
    ok = np.allclose(got, mine, atol=1e-4)
    from jaxmpi._binding import jax_collectives

    route = jax_collectives.chosen[0]
    print(f"BESIDE {'right' if ok else 'WRONG'} on {route}, process {jax.process_index()}: {got}")
