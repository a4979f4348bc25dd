"""The programs tests/profile_jobs.sh profiles, one case a job (argv: CASE DIR):

- known: a known program under `jaxmpi.profile(DIR)`: allreduce in a named scope, sendrecv
  in another, a started allreduce and its wait, bcast, then BARRIERS barriers; each rank
  prints "EXPECT rank R <op> <kind> <calls> <bytes per call>" for what it called. With
  SKEW=1, rank 1's profile clock runs 5 s ahead and 500 ppm fast (as on another host).
  Then `jaxmpi.profile` into a directory that cannot be made (under this file): refused on
  every rank ("REFUSED rank R: ..."), and the job goes on ("GOES ON rank R");
- env: the same calls, under JAXMPI_PROFILE (the whole job, written at exit); and a
  `jaxmpi.profile` inside it: refused ("NESTED rank R: ...");
- sharded: a training step sharded over 2 processes x 2 devices (JAX's collectives through
  jaxmpi's pass) and a MeshComm allreduce, under `jaxmpi.profile(DIR)`, or under
  JAXMPI_PROFILE where it is set (the whole job);
- plugin: a sum over 2 processes with JAX's collectives over XLA's MPI backend (the
  plug-in, JAX < 0.10.2), under `jaxmpi.profile(DIR)`.
"""

from __future__ import annotations

import contextlib
import os
import sys

CASE, DIR = sys.argv[1], sys.argv[2]
BARRIERS = 200

if CASE == "sharded":
    import jax

    jax.config.update("jax_num_cpu_devices", 2)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxmpi  # noqa: E402
import jaxmpi.distributed  # noqa: E402

rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()


def known_calls() -> None:
    """The known program: what it calls, printed as EXPECT lines."""
    x = jnp.ones(1024, jnp.float32)  # 4 KiB

    @jax.jit
    def step(x):
        with jax.named_scope("grads"):
            x = jaxmpi.allreduce(x, jaxmpi.SUM) / size
        with jax.named_scope("halo"):
            y = jaxmpi.sendrecv(x, x, source=(rank - 1) % size, dest=(rank + 1) % size)
        request = jaxmpi.iallreduce(y, jaxmpi.MAX)
        return jaxmpi.wait(request)

    for _ in range(5):
        x = step(x)
    x = jax.jit(lambda x: jaxmpi.bcast(x, 0))(x)
    x.block_until_ready()

    # Back to back in one program: whenever both ranks run at once (on a loaded machine,
    # not always), a barrier's ends lie as close as MPI makes them.
    def one_barrier(_, y):
        jaxmpi.barrier()
        return y

    jax.jit(lambda x: jax.lax.fori_loop(0, BARRIERS, one_barrier, x))(x).block_until_ready()
    jax.effects_barrier()
    for line in [
        "allreduce call 5 4096",
        "sendrecv call 5 4096",
        "iallreduce start 5 4096",
        "wait wait 5 0",
        "bcast call 1 4096",
        f"barrier call {BARRIERS} 0",
    ]:
        print(f"EXPECT rank {rank} {line}", flush=True)


if CASE == "known":
    if os.environ.get("SKEW") == "1" and rank == 1:
        os.environ["_JAXMPI_PROFILE_SKEW"] = "5000000000,500000"
    with jaxmpi.profile(DIR):
        known_calls()
    try:
        with jaxmpi.profile(os.path.join(__file__, "under-a-file")):
            pass
    except OSError as err:
        print(f"REFUSED rank {rank}: {err}", flush=True)
    jaxmpi.barrier()
    print(f"GOES ON rank {rank}", flush=True)
elif CASE == "env":
    known_calls()
    try:
        with jaxmpi.profile(DIR):
            pass
    except RuntimeError as err:
        print(f"NESTED rank {rank}: {err}", flush=True)
elif CASE == "sharded":
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    jaxmpi.distributed.initialize(collectives="jaxmpi")
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(devices), ("batch",))
    comm = jaxmpi.MeshComm(mesh)
    batch = NamedSharding(mesh, P("batch"))
    whole = NamedSharding(mesh, P())

    def loss(w, x, y):
        return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

    @jax.jit
    def train_step(w, x, y):
        with jax.named_scope("gradients"):
            g = jax.grad(loss)(w, x, y)
        return w - 0.1 * g

    def body(x):
        with jax.named_scope("norm"):
            return jaxmpi.allreduce(x, jaxmpi.SUM, comm=comm)

    norm = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("batch"), out_specs=P("batch")))
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(16, 8)).astype(np.float32)
    ys = rng.normal(size=(16, 4)).astype(np.float32)

    def put(value, sharding):
        return jax.make_array_from_callback(value.shape, sharding, lambda i: value[i])

    w = put(np.zeros((8, 4), np.float32), whole)
    x, y = put(xs, batch), put(ys, batch)
    # Under JAXMPI_PROFILE (the whole job), the pass's handlers are registered with XLA
    # while a profile records: XLA's registration probe is no call to record.
    with contextlib.nullcontext() if os.environ.get("JAXMPI_PROFILE") else jaxmpi.profile(DIR):
        for _ in range(3):
            w = train_step(w, x, y)
        total = norm(put(np.ones((8, 2), np.float32), batch))
        jax.block_until_ready((w, total))
    local = len(jax.local_devices())
    # Per process: the MeshComm's allreduce on each of its devices (a (2, 2) float32 block
    # each); the step's gradient all-reduce, which XLA inserted and the pass took, on each
    # device, every step ((8, 4) float32).
    print(f"EXPECT rank {rank} allreduce call {local} 16", flush=True)
    print(f"EXPECT rank {rank} hlo_all_reduce call {3 * local} 128", flush=True)
elif CASE == "plugin":
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    jaxmpi.distributed.initialize(collectives="mpi")
    mesh = Mesh(np.array(jax.devices()), ("i",))
    shard = NamedSharding(mesh, P("i"))
    x = jax.make_array_from_process_local_data(shard, np.ones(4, np.float32))
    f = jax.jit(lambda x: jnp.sum(x), out_shardings=NamedSharding(mesh, P()))
    with jaxmpi.profile(DIR):
        for _ in range(3):
            total = f(x)
        total.block_until_ready()
    print(f"RESULT rank {rank} {float(total)}", flush=True)
else:
    raise SystemExit(f"unknown case {CASE}")
print(f"DONE rank {rank}", flush=True)
