"""Settings every rank must share, compared across COMM_WORLD once at import.

Ranks on other hosts get only the environment the launcher forwards: Open MPI's mpirun
passes a variable to remote ranks only when named with `-x VAR`, so a JAXMPI_TIMEOUT set
at launch silently reaches only the ranks on the launching host. Ranks that then disagree
(one has a watchdog, one loads another library) fail later in ways that do not point back
to the cause; here the cause is named at import.

Cost: one MPI_Allreduce(MAX) of 8 integers, a 32-byte digest and its negation (every
rank's digest is the same exactly when the largest equals the smallest), whatever the
number of ranks; the settings' texts are gathered only when the digests differ.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import sys
import warnings
from dataclasses import dataclass

from . import slurm


@dataclass(frozen=True)
class Setting:
    name: str
    #: Refuse to run (raise on every rank) rather than warn on rank 0.
    refuse: bool
    #: Why differing values are refused or only warned about.
    why: str


#: The settings compared, in the order they are reported. A new variable that changes
#: behaviour joins here.
SETTINGS = (
    Setting(
        "library",
        refuse=True,
        # Ranks that loaded different MPI libraries (or one library through two ABIs:
        # JAXMPI_MPI=mpiabi on some ranks only) do not form one job that works: at best MPI
        # fails at the first message between them, at worst it hangs or exchanges garbled
        # data later, far from the cause.
        why="ranks that load different MPI libraries cannot exchange messages reliably",
    ),
    Setting(
        "JAXMPI_MPI",
        refuse=False,
        # The library actually loaded is compared above; a different request that still
        # ends in the same library does no harm in this job, but is the sign of an
        # environment that is not forwarded.
        why="a different request, which may load a different library elsewhere",
    ),
    Setting(
        "JAXMPI_DISPATCH",
        refuse=False,
        # Each mode keeps its own rank's MPI calls in program order, so ranks in different
        # modes still match their calls; what differs is speed and where a failure of an op
        # without results is raised.
        why="results are the same; speed and where failures surface differ",
    ),
    Setting(
        "JAX_PLATFORMS",
        refuse=False,
        # Each rank moves its own arrays; MPI does not care where they live. But the
        # default dispatch mode and the GPU choice follow the platform, and a rank without
        # it may silently compute on another device than the user meant.
        why="ranks may compute on different devices than intended",
    ),
    Setting(
        "JAXMPI_CHECK",
        refuse=True,
        # Checked mode sends a header before every point-to-point message and runs an
        # extra allgather before every collective: a rank without it would take a header
        # for data and skip the allgather the others wait in.
        why="checked and unchecked ranks do not send the same messages",
    ),
    Setting(
        "JAXMPI_MESH_REDUCTIONS",
        refuse=True,
        # The default reduces among processes with MPI's own collectives; ordered with
        # messages between devices: ranks in different modes would wait in different calls.
        why="the two modes make different MPI calls for a reduction among devices",
    ),
    Setting(
        "JAXMPI_TIMEOUT",
        refuse=False,
        # Only decides how a hang ends: one rank's watchdog ends the whole job through
        # MPI_Abort, but a rank without it (e.g. on a host cut off) hangs on.
        why="ranks without it never end a hang on their own",
    ),
    Setting(
        "JAXMPI_DEBUG",
        refuse=False,
        why="only the ranks that have it log their calls",
    ),
    Setting(
        "JAXMPI_PROFILE",
        refuse=True,
        # Compared as set or unset (ranks may write to directories of their own): a
        # profile's ranks measure their clocks against rank 0's at the start and at exit,
        # where a rank without one would not answer.
        why="a profile's ranks measure their clocks together, which a rank without one skips",
    ),
    Setting(
        "JAXMPI_CUDA_AWARE",
        refuse=False,
        # Staged and direct transfers put the same bytes on the wire.
        why="only how each rank hands GPU memory to MPI differs",
    ),
    Setting(
        "JAXMPI_GPU",
        refuse=False,
        # Compared as its kind (auto, jax, a number): a wrapper that sets a different GPU
        # number per rank is a legitimate use.
        why="ranks choose their GPU by different rules",
    ),
)


def _gpu_kind(value: str) -> str:
    return "a GPU number" if value.strip().isdigit() else value


def _values(library: str) -> dict[str, str]:
    """This rank's value of every setting, canonical (unset is '')."""
    values = {s.name: os.environ.get(s.name, "").strip() for s in SETTINGS if s.name != "library"}
    values["library"] = library
    values["JAXMPI_GPU"] = _gpu_kind(values["JAXMPI_GPU"])
    values["JAXMPI_PROFILE"] = "a directory" if values["JAXMPI_PROFILE"] else ""
    return values


def _encode(values: dict[str, str]) -> bytes:
    return "\0".join(f"{name}={value}" for name, value in values.items()).encode()


def _decode(text: bytes) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.decode().split("\0"))


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2, 5'."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][-1] + 1:
            spans[-1].append(rank)
        else:
            spans.append([rank])
    text = ", ".join(f"{s[0]}-{s[-1]}" if len(s) > 2 else ", ".join(map(str, s)) for s in spans)
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def differences(per_rank: list[dict[str, str]]) -> list[tuple[Setting, str]]:
    """(setting, "NAME: 'a' on ranks 0-2, unset on rank 3") for every setting that
    differs between ranks."""
    found = []
    for setting in SETTINGS:
        by_value: dict[str, list[int]] = {}
        for rank, values in enumerate(per_rank):
            by_value.setdefault(values.get(setting.name, ""), []).append(rank)
        if len(by_value) > 1:
            parts = [
                f"{repr(value) if value else 'unset'} on {_ranks(ranks)}"
                for value, ranks in by_value.items()
            ]
            found.append((setting, f"{setting.name}: " + ", ".join(parts)))
    return found


def _advice(family: str, names: list[str]) -> str:
    env = [n for n in names if n != "library"]
    if env and slurm.started_by_srun():
        return slurm.EXPORT_ADVICE
    if family == "openmpi" and env:
        forward = " ".join(f"-x {n}" for n in env)
        return (
            f"Open MPI's mpirun passes variables to ranks on other hosts only when named: "
            f"mpirun {forward} ... (or export them in a script every rank runs)."
        )
    if env:
        return (
            "Set them the same for every rank: in the environment of the launcher (MPICH's "
            "mpiexec and srun forward it), not in a per-rank wrapper or a host's shell "
            "start-up files."
        )
    return "Make every rank load the same MPI library (the same JAXMPI_MPI and environment)."


def digest_words(text: bytes) -> list[int]:
    """A digest of `text` as 4 integers of 62 bits each, and their negations: the largest
    of every rank's list equals its negated smallest, word by word, exactly when every rank's
    digest is the same."""
    digest = hashlib.sha256(text).digest()
    words = [int.from_bytes(digest[i : i + 8], "little") >> 2 for i in range(0, 32, 8)]
    return words + [-w for w in words]


def same_everywhere(largest: list[int]) -> bool:
    """Whether every rank's `digest_words` were the same, from their largest, word by word."""
    return largest[:4] == [-w for w in largest[4:]]


def check(rank: int, family: str, library: str, allreduce_max, allgather) -> None:
    """Compares this rank's settings with every other rank's. `library` names the MPI
    library loaded (family and version); `allreduce_max(ints)` returns the largest of every
    rank's, element by element; `allgather(bytes)` returns every rank's bytes (equal
    lengths) in rank order. Raises ValueError on every rank if a setting that must match
    differs; warns on rank 0 about the others."""
    mine = _encode(_values(library))
    if same_everywhere(allreduce_max(digest_words(mine))):
        return
    # They differ: exchange the texts (padded to the longest) to say who differs.
    length = max(int.from_bytes(n, "little") for n in allgather(len(mine).to_bytes(8, "little")))
    texts = allgather(mine.ljust(length, b"\0"))
    found = differences([_decode(t.rstrip(b"\0")) for t in texts])
    refused = any(setting.refuse for setting, _ in found)
    if refused:
        atexit.register(_exit_without_finalize)
    if rank != 0:
        if refused:  # rank 0 says which and why; the others only stop
            raise ValueError("jaxmpi: the ranks disagree on their settings (rank 0 says how)")
        return
    found.sort(key=lambda item: not item[0].refuse)
    message = (
        "jaxmpi: the ranks of this job disagree on settings that must match:\n"
        + "".join(f"  {line} ({setting.why})\n" for setting, line in found)
        + _advice(family, [setting.name for setting, _ in found])
    )
    if refused:
        raise ValueError(message)
    # Shown as coming from jaxmpi itself (no source line of ours), filterable as usual.
    warnings.warn_explicit(message, UserWarning, "jaxmpi", 0, module="jaxmpi")


def _exit_without_finalize() -> None:
    """Ranks on different libraries cannot finalize together: across hosts, MPI_Finalize
    (mpi4py's, at exit) waited forever for the other library's ranks. Python's atexit
    handlers run after the traceback is printed and before MPI_Finalize: end the process
    there, which makes every launcher end the job."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
