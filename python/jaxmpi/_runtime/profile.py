"""jaxmpi's own profile: every call jaxmpi makes, recorded on each rank by the extension
(core: xla/profile/), written at the end as one Chrome trace per rank
(`DIR/rank<N>.trace.json`), which `python -m jaxmpi profile DIR` merges.

A recording starts and stops on every rank together (it is collective over COMM_WORLD):
the directory is checked writable on every rank first, then each rank measures its clock
against rank 0's (round trips on a communicator of the profile's own) and the recording
starts; at the stop each rank measures its clock again, and writes its trace with both
measurements, so that every rank's times lie on rank 0's clock. Rank 0's wall clock at
the start names the run: a merge refuses to mix files of different runs.

`JAXMPI_PROFILE=DIR` records the whole job: from `import jaxmpi` to exit (written before
MPI_Finalize, after the last jitted call has run). `jaxmpi.profile(DIR)` records a part.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import _native

#: Records per rank unless JAXMPI_PROFILE_CAPACITY (or `capacity=`) says otherwise: 64 MiB
#: of address space set aside, which takes memory only as calls fill it (64 bytes a call).
DEFAULT_CAPACITY = 1 << 20
#: The trace files' format, which a merge checks.
FORMAT = 1
#: How long a rank's file is named: `rank<N>.trace.json`.
FILE = "rank{rank}.trace.json"


def trace_name(rank: int) -> str:
    return FILE.format(rank=rank)


@dataclass
class Recording:
    """A profile being recorded on this rank."""

    directory: pathlib.Path
    capacity: int
    #: What started it: "JAXMPI_PROFILE" or "jaxmpi.profile".
    source: str
    rank: int
    size: int
    #: A communicator of the profile's own (a dup of COMM_WORLD), for its clock measurements.
    comm: int
    #: (local ns, offset ns, round trip ns, rank 0's clock ns, rank 0's Unix time ns).
    start: tuple[int, int, int, int, int]
    #: Whether this rank reads rank 0's clock itself (the same host): offsets are then 0.
    shared_clock: bool
    path: pathlib.Path = field(init=False)

    def __post_init__(self) -> None:
        self.path = self.directory / trace_name(self.rank)

    @property
    def run(self) -> str:
        """The run's name, the same on every rank: rank 0's Unix time at the start (ns)."""
        return f"{self.start[4]:x}"


#: The recording of this process, if one runs.
current: Recording | None = None
#: Called with True when a recording starts, False when it stops (the JAX binding's
#: lowerings then name each call's site).
on_change: list[Callable[[bool], None]] = []


def recording() -> bool:
    """Whether a profile records now (lowerings then pass their call site)."""
    return current is not None


def capacity_from_env() -> int:
    """JAXMPI_PROFILE_CAPACITY, checked: records per rank."""
    text = os.environ.get("JAXMPI_PROFILE_CAPACITY", "").strip()
    if not text:
        return DEFAULT_CAPACITY
    if not (text.isdigit() and int(text) > 0):
        raise ValueError(
            f"JAXMPI_PROFILE_CAPACITY={text!r}: expected a whole number above 0, the calls "
            f"each rank records (default {DEFAULT_CAPACITY}; 64 bytes each)"
        )
    return int(text)


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _writable(directory: pathlib.Path, rank: int) -> str | None:
    """Why this rank cannot write its trace into `directory`, or None."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".{trace_name(rank)}.probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return f"{err.strerror or err} ({err.filename or directory})"
    return None


def _boot_id() -> str:
    """This host's running kernel (Linux), or "" where unknown."""
    try:
        return pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _apply_test_skew() -> bool:
    """_JAXMPI_PROFILE_SKEW="SHIFT_NS,PPB" (tests only): this rank's profile clock shifted
    and running fast, as on another host, to test the alignment on one machine."""
    text = os.environ.get("_JAXMPI_PROFILE_SKEW", "").strip()
    if not text:
        return False
    shift, _, rate = text.partition(",")
    _native.profile_skew(int(shift), int(rate or 0))
    return True


def start(directory: str | os.PathLike[str], capacity: int, source: str) -> Recording:
    """Starts recording on every rank (collective over COMM_WORLD). Raises OSError on
    every rank if any rank cannot write into `directory`, RuntimeError if a profile
    records already."""
    global current
    world = _native.world()
    rank, size = _native.comm_rank(world), _native.comm_size(world)
    if current is not None:
        raise RuntimeError(
            f"jaxmpi: a profile records already ({current.source}, into {current.directory}); "
            "profiles do not nest: stop it first, or leave JAXMPI_PROFILE unset to record "
            "parts of the job with jaxmpi.profile"
        )
    if capacity <= 0:
        raise ValueError(
            f"jaxmpi.profile: capacity={capacity}: expected a number of records above 0"
        )
    directory = pathlib.Path(directory).expanduser().absolute()
    why = _writable(directory, rank)
    failed = _native.allgather_bytes(world, bytes([why is not None]))
    refusing = [r for r, flag in enumerate(failed) if flag != b"\0"]
    if refusing:
        mine = f": {why}" if why else ""
        raise OSError(
            f"jaxmpi: cannot record a profile: {_ranks_text(refusing)} cannot write into "
            f"{directory}{mine} ({source}; every rank writes its own file there)"
        )
    skewed = _apply_test_skew()
    # One clock on every rank of one running kernel (CLOCK_MONOTONIC is the kernel's):
    # their offsets are 0, which round trips on a busy node only blur.
    boot = _boot_id().ljust(64)[:64].encode()
    rank0_boot = _native.allgather_bytes(world, boot)[0]  # on every rank: collective
    shared = not skewed and rank0_boot == boot and bool(boot.strip())
    comm = _native.comm_dup(world)
    synced = _native.profile_sync(comm)
    _native.profile_start(capacity)
    current = Recording(directory, capacity, source, rank, size, comm, synced, shared)
    for callback in on_change:
        callback(True)
    return current


def stop(recording: Recording) -> pathlib.Path:
    """Stops recording and writes this rank's trace (collective: every rank measures its
    clock against rank 0's once more). Call after `jax.effects_barrier()`, so that every
    call queued before is in. Raises OSError if the file cannot be written."""
    global current
    current = None
    for callback in on_change:
        callback(False)
    stats = _native.profile_stop() or (0, 0, recording.capacity, 0, 0)
    recorded, dropped, capacity, untallied, sites_refused = stats
    end = _native.profile_sync(recording.comm)
    _native.comm_free(recording.comm)
    start = recording.start
    origin = start[3]
    # Placed by what was measured, unless this rank reads rank 0's clock itself.
    placed_start, placed_end = (start[0], start[1]), (end[0], end[1])
    if recording.shared_clock:
        placed_start, placed_end = (start[0], 0), (end[0], 0)
    # The span between the two measurements, on rank 0's clock.
    wall_ns = (end[0] + end[1]) - (start[0] + start[1])
    if recording.shared_clock:
        wall_ns = end[0] - start[0]
    drift_ppm = 0.0
    if end[0] > start[0]:
        drift_ppm = -(end[1] - start[1]) / (end[0] - start[0]) * 1e6
    info = _native.info()
    other = {
        "jaxmpi_profile": FORMAT,
        "run": recording.run,
        "started_unix_ns": start[4],
        "rank": recording.rank,
        "size": recording.size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "source": recording.source,
        "jaxmpi": _native.__version__,
        "mpi": f"{info['family']}: {(info['version_string'].strip().splitlines() or [''])[0]}",
        "wall_us": wall_ns / 1e3,
        "clock": {
            "origin_ns": origin,
            "start": {"local_ns": start[0], "offset_ns": start[1], "round_trip_ns": start[2]},
            "end": {"local_ns": end[0], "offset_ns": end[1], "round_trip_ns": end[2]},
            "drift_ppm": drift_ppm,
            # True: the same host's clock as rank 0's, placed with offset 0 (the offsets
            # above are the measurement's error).
            "shared": recording.shared_clock,
        },
        "recorded": recorded,
        "dropped": dropped,
        "capacity": capacity,
        "untallied": untallied,
        "sites_refused": sites_refused,
        "totals": [
            {
                "name": name,
                "site": site,
                "route": route,
                "kind": kind,
                "calls": calls,
                "bytes": nbytes,
                "time_us": ns / 1e3,
                "waited_us": waited / 1e3,
                "failed": failed,
            }
            for name, site, route, kind, calls, nbytes, ns, waited, failed in _native.profile_totals()
        ],
    }
    host = other["host"]
    _native.profile_write(
        str(recording.path),
        recording.rank,
        f"rank {recording.rank} ({host})",
        json.dumps(other, separators=(",", ":")),
        (origin, placed_start, placed_end),
    )
    if dropped:
        print(
            f"jaxmpi: profile: rank {recording.rank} recorded its first {capacity} calls on "
            f"the timeline and counted {dropped} more in the totals only: the records were "
            f"full. Raise JAXMPI_PROFILE_CAPACITY (or jaxmpi.profile's capacity=) to at "
            f"least {recorded + dropped} to keep every call on the timeline.",
            file=sys.stderr,
        )
    return recording.path


def start_from_env() -> None:
    """JAXMPI_PROFILE=DIR: records from now (import) to exit; `stop_at_exit` writes it."""
    directory = os.environ.get("JAXMPI_PROFILE", "").strip()
    if not directory:
        return
    capacity = capacity_from_env()
    start(directory, capacity, "JAXMPI_PROFILE")


def stop_at_exit() -> None:
    """At exit, after the last jitted call has run and before MPI_Finalize
    (`library.before_finalize`): writes the recording JAXMPI_PROFILE started (or a
    jaxmpi.profile left open). A failure is said, never raised: the job's own exit status
    stands."""
    recording = current
    if recording is None:
        return
    try:
        path = stop(recording)
    except OSError as err:
        print(
            f"jaxmpi: profile: rank {recording.rank} could not write its trace: {err}",
            file=sys.stderr,
        )
        return
    if recording.rank == 0:
        print(
            f"jaxmpi: profile of {recording.size} rank(s) written to {path.parent} "
            f"(python -m jaxmpi profile {path.parent} merges and summarizes it)",
            file=sys.stderr,
        )
