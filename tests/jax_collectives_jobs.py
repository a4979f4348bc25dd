"""The jobs of tests/jax_collectives_jobs.sh: JAX's collectives over jaxmpi's MPI, each
case a whole job (one MPI initialization, one exit), which pytest inside one job cannot
make. Each prints what the script looks for (`RESULT ...`, `DONE rank r`).

    python tests/jax_collectives_jobs.py CASE     (under the build's launcher)

Cases (the order of the first imports and of MPI's initialization is the point of each):
  jax_first     import jax, then jaxmpi; jaxmpi.distributed.initialize() (jaxmpi initializes)
  jaxmpi_first  import jaxmpi, then jax
  mpi4py_first  mpi4py initializes MPI, then jax, then jaxmpi
  xla_first     jax.distributed started by hand with "mpi": XLA's MPI_Init_thread selects
                and initializes the MPI; jaxmpi is imported only after JAX's first psum
  gloo          jaxmpi.distributed.initialize(collectives="gloo")
  stuck         rank 1 skips the second psum: under JAXMPI_TIMEOUT rank 0's MPI call for
                XLA ends the job with a report naming it
  refused       collectives="mpi" where MPI cannot serve (the environment says why): the
                RuntimeError, before JAX starts
  untouched     no MPI collectives: jaxlib loaded the plug-in, no MPI library is loaded,
                and the results are JAX's

The cases above take XLA's MPI backend (collectives="mpi"); these the default route where
JAX has the hook (JAX >= 0.10.2), jaxmpi's pass:
  pass_auto     collectives="auto" chooses "jaxmpi"; psum and allreduce in one program
  pass_stuck    as `stuck`: the watchdog names the rewritten call and its JAX collective
  pass_cache    one program with psum, all_gather, ppermute and a jaxmpi op on a
                communicator of its own, compiled with JAX's persistent cache in CACHE_DIR
                (JAX writes process 0's entries, which serve every rank of a program the
                same on all): run twice, the second run loads it from the cache; with
                COLLECTIVES=gloo the same cache serves none of the pass's programs
  pass_refused  collectives="jaxmpi" where JAX has no hook: the RuntimeError
  subset_refused  collectives="mpi": a program over some of the processes only that holds
                a collective is refused when it is compiled, before XLA's MPI backend
                could hang in it; one without collectives runs
  communicators_limit  4 ranks, JAXMPI_MAX_COMMUNICATORS=2: ppermutes pairing the ranks
                three ways, each pair's processes a communicator of their own: the third
                pairing is refused on every rank, naming the limit, again when rerun; the
                first two still run
"""

from __future__ import annotations

import importlib
import os
import sys
import time

CASE = sys.argv[1]


def launcher_rank_and_size() -> tuple[int, int]:
    """This process's rank and the job's size from the launcher (no MPI call: XLA first)."""
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def shard_map_of(body):
    """jit(shard_map(body)) over every process's one device, blocks on axis "x"."""
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    try:
        from jax import shard_map

        unchecked = {"check_vma": False}
    except ImportError:
        from jax.experimental.shard_map import shard_map

        unchecked = {"check_rep": False}
    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: d.process_index)), ("x",))
    program = jax.jit(shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), **unchecked))

    def run(local):
        from jax.sharding import NamedSharding

        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), local[None])
        return np.asarray(program(x).addressable_data(0))[0]

    return run


def psum_and_allreduce(rank: int, size: int) -> None:
    """JAX's psum and jaxmpi's allreduce in one program: both the sum of every rank's."""
    import jax
    import numpy as np

    import jaxmpi

    run = shard_map_of(
        lambda x: jax.lax.psum(x, "x") - jaxmpi.allreduce(x, jaxmpi.SUM) + jax.lax.psum(x, "x")
    )
    got = run(np.arange(3.0) + rank)
    expected = size * np.arange(3.0) + sum(range(size))
    print(f"RESULT rank {rank} {'right' if np.array_equal(got, expected) else f'WRONG {got}'}")
    from jaxmpi._binding import jax_collectives as _jax_collectives

    print(f"COLLECTIVES rank {rank} {_jax_collectives.chosen}", flush=True)


def started_by_jaxmpi(collectives: str = "mpi") -> tuple[int, int]:
    import jaxmpi.distributed

    jaxmpi.distributed.initialize(collectives=collectives)
    return jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()


def cached_programs() -> tuple[int, int]:
    """Programs compiled with JAX's persistent cache: how many came from it is printed."""
    import jax
    import numpy as np

    jax.config.update("jax_compilation_cache_dir", os.environ["CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: (
            hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
        )
    )
    import jaxmpi

    rank, size = started_by_jaxmpi(os.environ.get("COLLECTIVES", "auto"))
    # A communicator of its own: Open MPI's handle differs in every run, its id does not.
    own = jaxmpi.COMM_WORLD.Split(color=0, key=rank)

    def body(x):
        total = jax.lax.psum(x, "x")
        gathered = jax.lax.all_gather(x, "x", tiled=True)[:1]
        moved = jax.lax.ppermute(x, "x", [(r, (r + 1) % size) for r in range(size)])
        return total + gathered + moved + jaxmpi.allreduce(x, jaxmpi.SUM, comm=own)

    got = shard_map_of(body)(np.arange(2.0) + rank)
    r, n = np.arange(2.0), np.arange(size)
    total = size * r + n.sum()
    expected = 2 * total + r + (r + (rank - 1) % size)
    print(f"RESULT rank {rank} {'right' if np.array_equal(got, expected) else f'WRONG {got}'}")
    from jaxmpi._binding import jax_collectives as _jax_collectives

    print(f"COLLECTIVES rank {rank} {_jax_collectives.chosen}")
    print(f"CACHE HITS rank {rank} {len(hits)}", flush=True)
    return rank, size


def subset_program() -> tuple[int, int]:
    """Programs over the devices of processes 0 and 1 of a larger job, under "mpi": a psum
    (refused), and one without collectives (runs)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    rank, size = started_by_jaxmpi("mpi")
    members = sorted((d for d in jax.devices() if d.process_index < 2), key=lambda d: d.id)
    mesh = Mesh(np.array(members), ("x",))
    from jax import shard_map

    def program(body):
        return jax.jit(shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

    if rank < 2:
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), np.ones((1, 2)))
        try:
            program(lambda v: jax.lax.psum(v, "x"))(x)
            print(f"UNEXPECTED: rank {rank} ran a psum over some processes under 'mpi'")
        except Exception as err:  # JAX wraps it in its own type
            print(f"REFUSED rank {rank} {err}")
        doubled = np.asarray(program(lambda v: 2 * v)(x).addressable_data(0))
        print(f"ELEMENTWISE rank {rank} {'right' if (doubled == 2).all() else doubled}")
    return rank, size


def communicators_limit() -> tuple[int, int]:
    """Past JAXMPI_MAX_COMMUNICATORS, every rank of the program that needs another
    communicator fails alike, and what was made still serves."""
    import jax
    import numpy as np

    rank, size = started_by_jaxmpi("jaxmpi")
    pairings = [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]]

    def swap(pairing):
        perm = [p for a, b in pairing for p in ((a, b), (b, a))]
        partner = dict(perm)[rank]
        got = shard_map_of(lambda x: jax.lax.ppermute(x, "x", perm))(np.arange(2.0) + rank)
        return "right" if np.array_equal(got, np.arange(2.0) + partner) else f"WRONG {got}"

    for k, pairing in enumerate(pairings[:2]):
        print(f"PAIRING {k} rank {rank} {swap(pairing)}", flush=True)
    for attempt in ("LIMIT", "AGAIN"):
        try:
            print(f"UNEXPECTED: the third pairing ran ({swap(pairings[2])})")
        except Exception as err:  # XLA's error type differs between JAX versions
            said = "JAXMPI_MAX_COMMUNICATORS" in str(err) and "(2," in str(err)
            print(f"{attempt} rank {rank} {'named' if said else f'UNNAMED {err}'}", flush=True)
            if rank == 0 and attempt == "LIMIT":
                print(f"(rank 0's error: {err})", flush=True)
    print(f"AFTER rank {rank} {swap(pairings[0])}", flush=True)
    from jaxmpi import _native

    print(f"HELD rank {rank} {_native.device_communicators()}", flush=True)
    return rank, size


def imported_in_order(*modules: str) -> None:
    """Imports `modules` in this order (the point of the case: no sorting them)."""
    for module in modules:
        importlib.import_module(module)


def main() -> None:
    if CASE in ("jax_first", "jaxmpi_first", "mpi4py_first"):
        first = {"jax_first": ["jax"], "jaxmpi_first": ["jaxmpi"], "mpi4py_first": ["mpi4py.MPI"]}
        imported_in_order(*first[CASE], "jax", "jaxmpi")
        if CASE == "mpi4py_first":
            print(f"MPI4PY initialized MPI: {sys.modules['mpi4py.MPI'].Is_initialized()}")
        rank, size = started_by_jaxmpi()
        psum_and_allreduce(rank, size)
    elif CASE == "xla_first":
        import jax
        import numpy as np

        rank, size = launcher_rank_and_size()
        jax.config.update("jax_cpu_collectives_implementation", "mpi")
        jax.distributed.initialize(f"127.0.0.1:{os.environ['PORT']}", size, rank)
        first = shard_map_of(lambda x: jax.lax.psum(x, "x"))(np.ones(2))
        print(
            f"XLA FIRST rank {rank} psum {first.tolist()} jaxmpi imported: {'jaxmpi' in sys.modules}"
        )
        psum_and_allreduce(rank, size)  # imports jaxmpi now
    elif CASE == "gloo":
        rank, size = started_by_jaxmpi("gloo")
        psum_and_allreduce(rank, size)
    elif CASE == "stuck":
        import jax
        import numpy as np

        rank, size = started_by_jaxmpi()
        run = shard_map_of(lambda x: jax.lax.psum(x, "x"))
        run(np.ones(2))  # both ranks: XLA's communicator exists
        if rank == 1:
            time.sleep(60)  # never makes the second psum
        run(np.ones(2))
        print("UNEXPECTED: the second psum returned")
    elif CASE == "refused":
        imported_in_order("jax", "jaxmpi.distributed")  # jax first, as most programs
        import jaxmpi.distributed

        try:
            jaxmpi.distributed.initialize(collectives="mpi")
            print("UNEXPECTED: initialize accepted collectives='mpi'")
        except RuntimeError as err:
            print(f"REFUSED {err}")
        from jaxmpi._binding import jax_collectives as _jax_collectives

        print("AUTO {}: {}".format(*_jax_collectives.choose("auto")))
    elif CASE == "untouched":
        import jax
        import jax.numpy as jnp

        x = jnp.linspace(0.0, 1.0, 101)
        value = jax.jit(jax.grad(lambda v: jnp.sum(jnp.sin(v) ** 2)))(x)
        with open("/proc/self/maps") as maps:
            files = {line.split()[-1] for line in maps if "/" in line}
        print(f"PLUGIN LOADED {any('/jaxmpi/_native' in f for f in files)}")
        print(f"MPI LIBRARIES {sorted(f for f in files if '/libmpi' in f)}")
        print(f"JAXMPI IMPORTED {'jaxmpi' in sys.modules}")
        print(f"VALUE {float(jnp.sum(value)):.15f} {jax.devices()}")
    elif CASE == "pass_auto":
        rank, size = started_by_jaxmpi("auto")
        psum_and_allreduce(rank, size)
        # A psum of two arrays is one all-reduce of both (a variadic call): its debug line
        # counts both, 3 + 5 float32.
        import jax
        import jax.numpy as jnp
        import numpy as np

        def both(x):
            a, b = jax.lax.psum((x, jnp.concatenate([x, x[:, :2]], axis=1)), "x")
            return jnp.concatenate([a, b], axis=1)

        got = shard_map_of(both)(np.arange(3.0) + rank)
        total = size * np.arange(3.0) + sum(range(size))
        right = np.array_equal(got, np.concatenate([total, total, total[:2]]))
        print(f"VARIADIC rank {rank} {'right' if right else f'WRONG {got}'}", flush=True)
    elif CASE == "pass_stuck":
        import jax
        import numpy as np

        rank, size = started_by_jaxmpi("jaxmpi")
        run = shard_map_of(lambda x: jax.lax.psum(x, "x"))
        run(np.ones(2))
        if rank == 1:
            time.sleep(60)
        run(np.ones(2))
        print("UNEXPECTED: the second psum returned")
    elif CASE == "pass_cache":
        rank, size = cached_programs()
    elif CASE == "pass_refused":
        import jaxmpi.distributed

        try:
            jaxmpi.distributed.initialize(collectives="jaxmpi")
            print("UNEXPECTED: initialize accepted collectives='jaxmpi'")
        except RuntimeError as err:
            print(f"REFUSED {err}")
    elif CASE == "subset_refused":
        rank, size = subset_program()
    elif CASE == "communicators_limit":
        rank, size = communicators_limit()
    else:
        raise SystemExit(f"unknown case {CASE!r}")
    if CASE not in ("refused", "untouched", "pass_refused"):
        print(f"DONE rank {rank}", flush=True)


main()
