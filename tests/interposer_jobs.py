"""The job of tests/interposer_jobs.sh: a known program of jaxmpi calls, run with a PMPI
interposer (tests/interposer/count_mpi.c) preloaded or not, which must see every MPI call
jaxmpi makes, on every route.

    python tests/interposer_jobs.py                (2 ranks, one CPU device each, under the launcher)
    python tests/interposer_jobs.py check LOG OUT FAMILY [TOOL]  (the verdict: see `check`)

The block, every op jitted, on 4 float32 a rank: 10 allreduces, a bcast, a sendrecv around
the ring, an allgather, a barrier; a MAX allreduce of 4 MiB (jaxmpi's own op: on MPICH
round a ring of point-to-point calls, `ring.rs`) on the world and on a communicator split
off for it and freed (with the private duplicate the ring made); a started allreduce
(iallreduce) and its wait; an
allreduce on a MeshComm over every device (on the pass's route: XLA's MPI collectives
refuse a MeshComm beside them); JAX's psum in shard_map, over the route COLLECTIVES names
("jaxmpi": jaxmpi's HLO pass; "mpi": XLA's MPI collectives through jaxmpi's plug-in).
Every result is checked ("RESULT name right, rank r").

The block runs twice: first to compile its programs and make its communicators, then
measured. Around the measured run the job writes "jaxmpi-test: rank r: BLOCK BEGIN" and
"... BLOCK END" to stderr, where JAXMPI_DEBUG=1 writes a line per jaxmpi call, and prints
what the preloaded interposer (COUNT_MPI_TOOL, read through ctypes) counted in between:
"MEASURED rank r MPI_Allreduce=12 ...". tests/interposer_jobs.sh holds the two against
each other. After the block, one more allreduce.

mpi4py is kept out (as if not installed): it would initialize MPI itself, and its calls, made
through its own link to libmpi, reach a preloaded tool too; here every counted call is
jaxmpi's, MPI_Init_thread and MPI_Finalize included.

Two copies of the interposer that are not preloaded must never be called: one (UNUSED_LOCAL)
loaded with ctypes' default RTLD_LOCAL before jaxmpi loads MPI, one (UNUSED_GLOBAL) with
RTLD_GLOBAL after the block: "UNUSED rank r local N global N" sums their counters.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import sys

RANKS = 2


def interposer(path: str, mode: int = ctypes.RTLD_LOCAL) -> ctypes.CDLL:
    """A copy of the interposer, its counters readable (an already loaded one: itself)."""
    library = ctypes.CDLL(path, mode=mode)
    library.count_mpi_calls.restype = ctypes.c_long
    library.count_mpi_calls.argtypes = [ctypes.c_char_p]
    library.count_mpi_functions.restype = ctypes.c_char_p
    return library


def counters(library: ctypes.CDLL) -> dict[str, int]:
    names = library.count_mpi_functions().decode().split()
    return {name: library.count_mpi_calls(name.encode()) for name in names}


def job() -> None:
    sys.modules["mpi4py"] = None  # type: ignore[assignment]  # import mpi4py: ImportError
    unused_local = interposer(os.environ["UNUSED_LOCAL"])  # before MPI is loaded
    preloaded = os.environ.get("COUNT_MPI_TOOL")
    tool = interposer(preloaded) if preloaded else None

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxmpi
    import jaxmpi.distributed
    from jaxmpi.__main__ import info_lines

    try:
        from jax import shard_map

        unchecked = {"check_vma": False}
    except ImportError:  # JAX before 0.7
        from jax.experimental.shard_map import shard_map

        unchecked = {"check_rep": False}

    collectives = os.environ.get("COLLECTIVES", "jaxmpi")
    jaxmpi.distributed.initialize(collectives=collectives)
    rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()

    def say(line: str) -> None:
        """One line in one write (the ranks share the launcher's output)."""
        sys.stdout.write(f"{line}\n")
        sys.stdout.flush()

    def mark(what: str) -> None:
        """A line on stderr, in order with JAXMPI_DEBUG's (each one write too)."""
        os.write(2, f"jaxmpi-test: rank {rank}: {what}\n".encode())

    for line in info_lines():
        if "calls go to" in line or "JAX collectives" in line:
            say(f"INFO rank {rank}: {' '.join(line.split())}")

    x = jnp.arange(4, dtype=jnp.float32) + rank
    base = np.arange(4, dtype=np.float32)
    total = sum(base + r for r in range(size))
    left, right = (rank - 1) % size, (rank + 1) % size

    allreduce = jax.jit(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM))
    bcast = jax.jit(lambda v: jaxmpi.bcast(v, 0))
    ring = jax.jit(lambda v: jaxmpi.sendrecv(v, v, source=left, dest=right))
    allgather = jax.jit(jaxmpi.allgather)
    big = (jnp.arange(RING_BYTES // 4, dtype=jnp.float32) * (1 - 2 * rank)).at[rank].set(jnp.nan)
    big_max = np.maximum.reduce(
        [(np.arange(RING_BYTES // 4, dtype=np.float32) * (1 - 2 * r)) for r in range(size)]
    )
    big_max[:size] = np.nan
    started = jax.jit(lambda v: jaxmpi.wait(jaxmpi.iallreduce(v, jaxmpi.SUM)))

    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(devices), ("i",))
    spec = P("i")
    local = (base + rank)[None]
    sharded = jax.make_array_from_process_local_data(NamedSharding(mesh, spec), local)

    def on_mesh(body):
        return jax.jit(shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, **unchecked))

    psum = on_mesh(lambda v: jax.lax.psum(v, "i"))
    if collectives == "jaxmpi":
        mesh_comm = jaxmpi.MeshComm(mesh)
        mesh_allreduce = on_mesh(lambda v: jaxmpi.allreduce(v, jaxmpi.SUM, comm=mesh_comm))

    def block() -> dict[str, bool]:
        """The known program; whether each result is right."""
        right = {}

        def check(name, got, want):
            got = np.asarray(jax.block_until_ready(got))
            right[name] = np.array_equal(got, want, equal_nan=True)

        for _ in range(10):
            got = allreduce(x)
        check("allreduce x10", got, total)
        check("bcast", bcast(x), base)
        check("sendrecv", ring(x), base + left)
        check("allgather", allgather(x), np.stack([base + r for r in range(size)]))
        check("allreduce MAX, 4 MiB", jaxmpi.allreduce(big, jaxmpi.MAX), big_max)
        split = jaxmpi.COMM_WORLD.Split(0, rank)
        on_split = jaxmpi.allreduce(big, jaxmpi.MAX, comm=split)
        check("allreduce MAX, 4 MiB, on a split", on_split, big_max)
        split.Free()
        jaxmpi.barrier()
        right["barrier"] = True
        check("iallreduce + wait", started(x), total)
        if collectives == "jaxmpi":
            check("MeshComm allreduce", mesh_allreduce(sharded).addressable_data(0)[0], total)
        check("psum", psum(sharded).addressable_data(0)[0], total)
        jax.effects_barrier()
        return right

    block()  # compiles the programs, makes the communicators
    before = counters(tool) if tool else {}
    mark("BLOCK BEGIN")
    results = block()
    mark("BLOCK END")
    after = counters(tool) if tool else {}
    for name, ok in results.items():
        say(f"RESULT {name} {'right' if ok else 'WRONG'}, rank {rank}")
    if tool:
        measured = " ".join(f"{name}={after[name] - before[name]}" for name in after)
        say(f"MEASURED rank {rank} {measured}")

    # A copy loaded RTLD_GLOBAL now, after jaxmpi chose its functions: never called either.
    unused_global = interposer(os.environ["UNUSED_GLOBAL"], ctypes.RTLD_GLOBAL)
    last = np.asarray(allreduce(x))
    say(
        f"RESULT allreduce after {'right' if np.array_equal(last, total) else 'WRONG'}, rank {rank}"
    )
    local_calls = sum(counters(unused_local).values())
    global_calls = sum(counters(unused_global).values())
    say(f"UNUSED rank {rank} local {local_calls} global {global_calls}")
    say(f"DONE rank {rank}")


# What each of jaxmpi's calls in the block makes, by the name its JAXMPI_DEBUG line starts
# with (4 float32, a predefined op, one device per process): "A|B" is one call of either.
# A started op's request completes by MPI_Wait or by the MPI_Test that finds it done
# (MPI_Test_completing); how many tests come before is timing, not checked.
MAKES = {
    "allreduce": {"MPI_Allreduce": 1},  # on a communicator, and on a MeshComm
    "hlo_all_reduce": {"MPI_Allreduce": 1},  # psum, jaxmpi's pass
    "MPI_Allreduce for XLA": {"MPI_Allreduce": 1},  # psum, XLA's MPI through the plug-in
    "bcast": {"MPI_Bcast": 1},
    "sendrecv": {"MPI_Sendrecv|MPI_Sendrecv_replace": 1},
    "allgather": {"MPI_Allgather": 1},
    "barrier": {"MPI_Barrier": 1},
    "iallreduce": {"MPI_Iallreduce": 1, "MPI_Wait|MPI_Test_completing": 1},
    "wait": {},  # completes what its start counted
    "hlo_communicators": {},  # communicators of a pass's program: made at its first run
}
POLLS = "MPI_Test"
# A MAX allreduce of RING_BYTES on 2 ranks: on MPICH (which gives a user-defined op
# recursive doubling) jaxmpi's own op goes round a ring, one exchange and one combine of
# half the vector, then one exchange of the other half; elsewhere MPI_Allreduce.
RING_BYTES = 4 << 20
RING = {
    "mpich": {"MPI_Sendrecv|MPI_Sendrecv_replace": 2, "MPI_Reduce_local": 1},
    "openmpi": {"MPI_Allreduce": 1},
}
# The communicator split off in the block and freed: on MPICH its first large MAX makes
# its private duplicate, which freeing it frees. Python calls, with no JAXMPI_DEBUG line.
SPLIT = {
    "mpich": {"MPI_Comm_split": 1, "MPI_Comm_dup": 1, "MPI_Comm_free": 2},
    "openmpi": {"MPI_Comm_split": 1, "MPI_Comm_free": 1},
}


def check(log: str, out: str, family: str, tool: str = "") -> int:
    """The verdict on one job: LOG its output, OUT the prefix of the counts files, FAMILY
    the MPI's (mpich or openmpi), TOOL the file name of the preloaded interposer ("": none
    preloaded).

    Prints "ok" and what was seen, or the problems. Every result right; the copies not
    preloaded never called; jaxmpi says where its calls go (the tool, or the library's own).
    With a tool, per rank: over the measured block it counted exactly the calls that
    JAXMPI_DEBUG's lines say jaxmpi made (MAKES), and nothing else; over the whole job it
    saw jaxmpi initialize and finalize MPI.
    """
    text = open(log, errors="replace").read().replace("\0", "")
    problems, seen = [], []
    preloaded = bool(tool)
    for rank in range(RANKS):
        for want in (f"DONE rank {rank}", f"UNUSED rank {rank} local 0 global 0"):
            if want not in text:
                problems.append(f"no '{want}'")
        problems += [line for line in text.splitlines() if "WRONG" in line]
        info = re.search(rf"^INFO rank {rank}: calls go to (.*)$", text, re.M)
        if info is None:
            problems.append(f"rank {rank}: no 'calls go to' line")
        elif preloaded != info.group(1).startswith("/") or tool not in info.group(1):
            problems.append(f"rank {rank}: calls go to {info.group(1)}")
        for path in glob.glob(f"{out}.*unused*.{rank}"):
            counted = dict(line.split() for line in open(path) if not line.startswith("#"))
            if any(int(n) for n in counted.values()):
                problems.append(f"{os.path.basename(path)} was called: {counted}")
        if not preloaded:
            continue
        measured = re.search(rf"^MEASURED rank {rank} (.*)$", text, re.M)
        begin, end = (f"jaxmpi-test: rank {rank}: BLOCK {w}" for w in ("BEGIN", "END"))
        if measured is None or begin not in text or end not in text:
            problems.append(f"rank {rank}: no measured block")
            continue
        got = {k: int(v) for k, v in (item.split("=") for item in measured.group(1).split())}
        block = text[text.index(begin) : text.index(end)]
        want: dict[str, int] = dict(SPLIT[family])
        for line in re.findall(rf"^jaxmpi: rank {rank}: (.*)$", block, re.M):
            if re.search(r"\) completed after [0-9.]+ us", line):
                continue  # when a started op's request completed: no call of its own
            op = line.split(" (")[0]
            if op not in MAKES:
                problems.append(f"rank {rank}: no MAKES entry for '{line}'")
            makes = MAKES.get(op, {})
            if op == "allreduce" and f", {RING_BYTES} bytes)" in line:
                makes = RING[family]
            for functions, calls in makes.items():
                want[functions] = want.get(functions, 0) + calls
        for functions, calls in want.items():
            counted = sum(got.get(f, 0) for f in functions.split("|"))
            if counted != calls:
                problems.append(f"rank {rank}: {functions}: {calls} called, {counted} seen")
        named = {f for functions in want for f in functions.split("|")} | {POLLS}
        problems += [
            f"rank {rank}: {f}: 0 called, {n} seen" for f, n in got.items() if n and f not in named
        ]
        if got.get(POLLS, 0) < got.get("MPI_Test_completing", 0):
            problems.append(f"rank {rank}: fewer MPI_Test calls than completing ones")
        whole = f"{out}.{tool}.{rank}"
        try:
            lines = open(whole).read().splitlines()
        except OSError as err:
            problems.append(f"rank {rank}: no counts at exit ({err})")
            continue
        totals = dict(line.split() for line in lines if not line.startswith("#"))
        for function in ("MPI_Init_thread", "MPI_Finalize"):
            if totals.get(function) != "1":
                problems.append(f"rank {rank}: {function} seen {totals.get(function)} times, not 1")
        if "at MPI_Finalize" not in lines[0]:
            problems.append(f"rank {rank}: counts {lines[0][2:]}, not at MPI_Finalize")
        calls = sum(want.values())
        seen.append(
            f"rank {rank}: the block's {calls} calls seen exactly ("
            + ", ".join(f"{k} {v}" for k, v in got.items() if v and k != POLLS)
            + f", {got.get(POLLS, 0)} polls); the whole job: "
            + ", ".join(f"{k} {v}" for k, v in totals.items() if v != "0")
        )
    if problems:
        print("; ".join(dict.fromkeys(problems)))
        return 1
    print("ok")
    for line in seen:
        print(line)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"]:
        sys.exit(check(*sys.argv[2:6]))
    job()
