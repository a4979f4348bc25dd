"""`python -m jaxmpi profile DIR`: the ranks' profile files (JAXMPI_PROFILE, jaxmpi.profile)
merged into what an mpiP user expects: per op and call site the calls, bytes, total and
mean time, share of the run's wall time, the slowest rank and the imbalance across ranks;
one merged Chrome trace (a track per rank) and a PNG (time in communication per rank and
op, and a timeline of one step).

It reads only the files: it needs no MPI job (run it anywhere the files are). Whatever is
wrong with them (a rank without a file, a file cut short, files of several runs, records
that overflowed) is said, and the rest is merged.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

#: The per-rank files' format this reader knows (`_runtime/profile.py`).
FORMAT = 1
RANK_FILE = re.compile(r"^rank(\d+)\.trace\.json$")
PARTIAL_FILE = re.compile(r"^rank(\d+)\.trace\.json\.partial$")
MERGED = "merged.trace.json"
PNG = "profile.png"

#: Ops whose calls every participant makes together: a call's start against the latest
#: start of the same call elsewhere is the time it waited for the last one to arrive.
COLLECTIVES = {
    *"allreduce reduce scan exscan reduce_scatter bcast gather allgather scatter alltoall".split(),
    *"gatherv allgatherv scatterv alltoallv barrier ragged_alltoallv".split(),
    *"hlo_all_reduce hlo_all_gather hlo_reduce_scatter hlo_all_to_all".split(),
    "hlo_ragged_all_to_all",
    *"MPI_Allreduce MPI_Allgather MPI_Alltoall MPI_Reduce_scatter MPI_Bcast MPI_Barrier".split(),
}


@dataclass
class RankFile:
    rank: int
    path: pathlib.Path
    meta: dict
    events: list[dict]


@dataclass
class Merged:
    directory: pathlib.Path
    run: str
    size: int
    files: dict[int, RankFile]
    #: What is wrong with the input, one sentence each.
    notes: list[str] = field(default_factory=list)

    @property
    def present(self) -> list[int]:
        return sorted(self.files)

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.size) if r not in self.files]


class ProfileError(Exception):
    """Nothing can be merged (said why)."""


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _when(unix_ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_ns / 1e9))


def load(directory: pathlib.Path, run: str | None = None) -> Merged:
    """The files of one run in `directory` (the newest, unless `run` names one)."""
    if not directory.is_dir():
        raise ProfileError(f"{directory} is not a directory")
    notes: list[str] = []
    by_run: dict[str, dict[int, RankFile]] = defaultdict(dict)
    for path in sorted(directory.iterdir()):
        partial = PARTIAL_FILE.match(path.name)
        if partial:
            notes.append(
                f"rank {partial.group(1)} stopped while writing its file ({path.name} is left, "
                "incomplete): that rank is left out"
            )
            continue
        match = RANK_FILE.match(path.name)
        if not match:
            continue
        rank = int(match.group(1))
        try:
            trace = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            notes.append(
                f"rank {rank}'s file {path.name} is not a complete trace ({err}): left out"
            )
            continue
        meta = trace.get("otherData") if isinstance(trace, dict) else None
        if not isinstance(meta, dict) or meta.get("jaxmpi_profile") != FORMAT:
            notes.append(
                f"{path.name} is not a jaxmpi profile of format {FORMAT} (no otherData."
                "jaxmpi_profile): left out"
            )
            continue
        events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict)]
        by_run[str(meta.get("run"))][rank] = RankFile(rank, path, meta, events)
    if not by_run:
        found = "; ".join(notes) if notes else "no rank<N>.trace.json file"
        raise ProfileError(f"{directory} holds no jaxmpi profile to merge: {found}")

    def started(files: dict[int, RankFile]) -> int:
        return max(int(f.meta.get("started_unix_ns", 0)) for f in files.values())

    runs = sorted(by_run, key=lambda r: started(by_run[r]))
    if run is None:
        chosen = runs[-1]
    elif run in by_run:
        chosen = run
    else:
        raise ProfileError(f"{directory} holds no file of run {run} (runs: {', '.join(runs)})")
    if len(runs) > 1:
        others = [
            f"run {r} ({_ranks(sorted(by_run[r]))}, started {_when(started(by_run[r]))})"
            for r in runs
            if r != chosen
        ]
        notes.append(
            f"{directory} holds files of {len(runs)} runs: merging run {chosen} "
            f"({_ranks(sorted(by_run[chosen]))}, started {_when(started(by_run[chosen]))}"
            f"{', the newest' if run is None else ''}), leaving out {'; '.join(others)} "
            "(--run RUN merges another)"
        )
    files = by_run[chosen]
    size = max(int(f.meta.get("size", 0)) for f in files.values())
    merged = Merged(directory, chosen, size, files, notes)
    if merged.missing:
        notes.append(
            f"{_ranks(merged.missing)} of {size} wrote no file (a rank that died before the "
            "profile ended, or wrote elsewhere): the summary covers "
            f"{_ranks(merged.present)} only"
        )
    for rank in merged.present:
        meta = files[rank].meta
        if meta.get("dropped"):
            notes.append(
                f"rank {rank}'s records were full: its first {meta['recorded']} calls are on "
                f"the timeline, {meta['dropped']} more only in the totals (raise "
                "JAXMPI_PROFILE_CAPACITY, or jaxmpi.profile's capacity=)"
            )
        if meta.get("untallied"):
            notes.append(
                f"rank {rank}: {meta['untallied']} calls fell outside the totals (more than "
                "4096 op, call site and route): its totals are short"
            )
    return merged


# --------------------------------------------------------------------------- the summary


@dataclass
class Row:
    op: str
    route: str
    site: str
    #: Per rank: calls, bytes, µs, waited µs.
    calls: dict[int, int] = field(default_factory=dict)
    bytes: dict[int, int] = field(default_factory=dict)
    time_us: dict[int, float] = field(default_factory=dict)
    waited_us: dict[int, float] = field(default_factory=dict)
    #: Per rank: µs spent before the last participant of the same collective arrived.
    late_us: dict[int, float] = field(default_factory=dict)


def _label(name: str, kind: str) -> str:
    return f"{name} in flight" if kind == "in flight" else name


def rows(merged: Merged) -> list[Row]:
    """Every (op, route, call site), from each rank's exact totals."""
    table: dict[tuple[str, str, str], Row] = {}
    for rank, rank_file in merged.files.items():
        for total in rank_file.meta.get("totals", []):
            key = (_label(total["name"], total["kind"]), total["route"], total["site"])
            row = table.setdefault(key, Row(*key))
            for name in ("calls", "bytes"):
                getattr(row, name)[rank] = getattr(row, name).get(rank, 0) + total[name]
            row.time_us[rank] = row.time_us.get(rank, 0.0) + total["time_us"]
            row.waited_us[rank] = row.waited_us.get(rank, 0.0) + total["waited_us"]
    for key, late in late_arrivals(merged).items():
        if key in table:
            table[key].late_us = late
    return sorted(table.values(), key=lambda r: -sum(r.time_us.values()))


def late_arrivals(merged: Merged) -> dict[tuple[str, str, str], dict[int, float]]:
    """Per collective (op, route, call site), per rank: the time its calls waited for the
    last participant to arrive. The n-th call of an op on one communicator (or, JAX's
    collectives, at one call site) is the same collective on every participant (a rank,
    or a device); matched over the calls every participant recorded."""
    # (op, route, site, communicator) -> participant -> [(start, end)]
    calls: dict[tuple, dict[tuple[int, int], list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for rank, rank_file in merged.files.items():
        for e in rank_file.events:
            args = e.get("args", {})
            if e.get("ph") != "X" or args.get("kind") != "call" or e["name"] not in COLLECTIVES:
                continue
            route = args.get("route", "")
            where = args.get("meshcomm", args.get("comm", "")) if route != "pass" else ""
            if route in ("jaxmpi", "plug-in"):
                where = ""  # handles differ between ranks; one order per op and site
            key = (e["name"], route, args.get("site", ""), where)
            participant = (rank, int(args.get("device", -1)))
            calls[key][participant].append((e["ts"], e["ts"] + e["dur"]))
    late: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    for (op, route, site, _), by_participant in calls.items():
        if len(by_participant) < 2:
            continue
        spans = [sorted(s) for s in by_participant.values()]
        count = min(len(s) for s in spans)
        last = [max(s[i][0] for s in spans) for i in range(count)]
        for (rank, _), s in zip(by_participant, spans):
            waited = sum(min(max(last[i] - s[i][0], 0.0), s[i][1] - s[i][0]) for i in range(count))
            late[(op, route, site)][rank] = late[(op, route, site)].get(rank, 0.0) + waited
    return late


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _table(header: list[str], lines: list[list[str]], left: int) -> list[str]:
    """Columns aligned: the first `left` to the left, numbers to the right."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *lines)]
    out = []
    for line in [header, *lines]:
        cells = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(map(str, line), widths))
        ]
        out.append("  " + "  ".join(cells).rstrip())
    return out


def _short(site: str, width: int = 40) -> str:
    return site if len(site) <= width else "..." + site[-(width - 3) :]


def wall_us(merged: Merged) -> float:
    """The run's wall time: the profile's span on its longest rank."""
    return max(float(f.meta.get("wall_us", 0.0)) for f in merged.files.values())


def summary(merged: Merged, top: int = 40) -> list[str]:
    present = merged.present
    wall = wall_us(merged)
    first = merged.files[present[0]].meta
    table = rows(merged)
    out = [
        f"jaxmpi profile of {merged.directory}",
        f"  run {merged.run}: started {_when(int(first.get('started_unix_ns', 0)))} "
        f"({first.get('source', '?')}), {len(present)} of {merged.size} ranks, "
        f"{wall / 1e6:.3f} s; {first.get('mpi', '')}",
        "  " + clocks(merged),
        "",
        "Per rank (time in jaxmpi's calls, not counting started ops' time in flight):",
    ]
    lines = []
    for rank in present:
        meta = merged.files[rank].meta
        busy = sum(r.time_us.get(rank, 0.0) for r in table if not r.op.endswith(" in flight"))
        calls = sum(r.calls.get(rank, 0) for r in table if not r.op.endswith(" in flight"))
        own_wall = float(meta.get("wall_us", 0.0))
        lines.append(
            [
                str(rank),
                str(meta.get("host", "")),
                f"{own_wall / 1e6:.3f}",
                str(calls),
                f"{busy / 1e3:.3f}",
                f"{100 * busy / own_wall:.2f}" if own_wall else "-",
                str(meta.get("recorded", 0)),
                str(meta.get("dropped", 0)),
            ]
        )
    out += _table(
        ["rank", "host", "wall s", "calls", "in calls ms", "% wall", "recorded", "dropped"],
        lines,
        2,
    )
    out += [
        "",
        f"Per op and call site (summed over the {len(present)} ranks; % of their wall time; "
        "waiting: in collectives, time before the last rank arrived):",
    ]
    lines = []
    calls_rows = [r for r in table if not r.op.endswith(" in flight")]
    for row in calls_rows[:top]:
        per_rank = [row.time_us.get(r, 0.0) for r in present]
        total = sum(per_rank)
        calls = sum(row.calls.values())
        mean_rank = total / len(present)
        slowest = max(present, key=lambda r: row.time_us.get(r, 0.0))
        lines.append(
            [
                row.op,
                row.route,
                _short(row.site) or "-",
                str(calls),
                _size(sum(row.bytes.values())),
                f"{total / 1e3:.3f}",
                f"{total / calls:.1f}" if calls else "-",
                f"{100 * total / (wall * len(present)):.2f}" if wall else "-",
                f"{sum(row.late_us.values()) / 1e3:.3f}" if row.late_us else "-",
                f"{slowest} ({row.time_us.get(slowest, 0.0) / 1e3:.3f} ms)",
                f"{max(per_rank) / mean_rank:.2f}" if mean_rank else "-",
            ]
        )
    out += _table(
        [
            "op",
            "route",
            "call site",
            "calls",
            "bytes",
            "total ms",
            "mean us",
            "% wall",
            "waiting ms",
            "slowest rank",
            "max/mean",
        ],
        lines,
        3,
    )
    if len(calls_rows) > top:
        out.append(f"  ... and {len(calls_rows) - top} more (--top N shows more)")
    flights = [r for r in table if r.op.endswith(" in flight")]
    if flights:
        out += [
            "",
            "Started ops from start to completion (waited: their waits' time before "
            "completion, the part the program did not hide):",
        ]
        lines = []
        for row in flights:
            total = sum(row.time_us.values())
            waited = sum(row.waited_us.values())
            calls = sum(row.calls.values())
            lines.append(
                [
                    row.op.removesuffix(" in flight"),
                    row.route,
                    str(calls),
                    _size(sum(row.bytes.values())),
                    f"{total / 1e3:.3f}",
                    f"{waited / 1e3:.3f}",
                    f"{100 * (1 - waited / total):.1f}" if total else "-",
                ]
            )
        out += _table(
            ["op", "route", "requests", "bytes", "in flight ms", "waited ms", "% hidden"],
            lines,
            2,
        )
    return out


def _duration(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.6f} s"
    return f"{ns / 1e6:.3f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us"


def clocks(merged: Merged) -> str:
    others = [r for r in merged.present if r != 0]
    shared = [r for r in others if merged.files[r].meta.get("clock", {}).get("shared")]
    measured = [r for r in others if r not in shared]
    parts = []
    if shared:
        parts.append(f"{_ranks(shared)} read rank 0's clock (one host)")
    if measured:
        clock = [merged.files[r].meta.get("clock", {}) for r in measured]
        offset = max(abs(c["start"]["offset_ns"]) for c in clock)
        trip = max(max(c["start"]["round_trip_ns"], c["end"]["round_trip_ns"]) for c in clock)
        drift = max(abs(c.get("drift_ppm", 0.0)) for c in clock)
        parts.append(
            f"{_ranks(measured)} set against rank 0's by round trips: offsets up to "
            f"{_duration(offset)}, drift up to {drift:.2f} ppm, round trips up to "
            f"{_duration(trip)} (an offset is good to half of one)"
        )
    return "clocks: " + ("; ".join(parts) if parts else "rank 0's only")


# --------------------------------------------------------------------------- the merged trace


def write_merged(merged: Merged, path: pathlib.Path) -> int:
    """One trace of every rank's events (a process per rank); returns the call events."""
    metas = {}
    for rank, rank_file in merged.files.items():
        metas[str(rank)] = {k: v for k, v in rank_file.meta.items() if k != "totals"}
    other = {
        "jaxmpi_profile_merged": FORMAT,
        "run": merged.run,
        "size": merged.size,
        "ranks": metas,
        "missing": merged.missing,
        "notes": merged.notes,
    }
    events = [e for rank in merged.present for e in merged.files[rank].events]
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("w") as out:
        out.write('{"displayTimeUnit":"ms","otherData":')
        json.dump(other, out, separators=(",", ":"))
        out.write(',"traceEvents":[\n')
        for i, event in enumerate(events):
            if i:
                out.write(",\n")
            json.dump(event, out, separators=(",", ":"))
        out.write("\n]}\n")
    tmp.replace(path)
    return sum(1 for e in events if e.get("ph") == "X")


# --------------------------------------------------------------------------- the picture


def one_step(merged: Merged) -> tuple[float, float]:
    """A window of one step of the program (µs): one period of the first rank's sequence of
    calls (each named by op, call site and bytes: a halo's rows and columns differ), the
    one of median length among those around the middle of the run; the whole run where no
    period shows."""
    rank = merged.present[0]
    calls = sorted(
        (
            e
            for e in merged.files[rank].events
            if e.get("ph") == "X" and e["args"].get("kind") != "in flight"
        ),
        key=lambda e: e["ts"],
    )
    keys = [(e["name"], e["args"].get("site", ""), e["args"].get("bytes")) for e in calls]
    n = len(keys)
    for period in range(1, min(400, n // 3) + 1):
        at = min(n // 2, n - 2 * period - 1)
        if at < 0:
            break
        if any(keys[at + i] != keys[at + period + i] for i in range(period)):
            continue
        # Of the steps around the middle, the one of median length: a typical step.
        starts = [calls[i]["ts"] for i in range(at % period, n, period)]
        middle = len(starts) // 2
        steps = list(itertools.pairwise(starts))[max(0, middle - 25) : middle + 25]
        steps.sort(key=lambda step: step[1] - step[0])
        return steps[len(steps) // 2]
    if not calls:
        return 0.0, wall_us(merged)
    return calls[0]["ts"], max(e["ts"] + e["dur"] for e in calls)


def plot(merged: Merged, path: pathlib.Path) -> str | None:
    """Writes the PNG; returns why not, if it cannot (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "no PNG: matplotlib is not installed in this Python (pip install matplotlib); "
            "the summary and the merged trace are complete without it"
        )
    table = [r for r in rows(merged) if not r.op.endswith(" in flight")]
    present = merged.present
    shown = [f"{r.op} ({r.route})" for r in table[:8]]
    colors = {label: plt.get_cmap("tab10")(i) for i, label in enumerate(shown)}
    other_color = (0.6, 0.6, 0.6, 1.0)

    figure, (bars, timeline) = plt.subplots(
        2, 1, figsize=(11, 3.2 + 0.55 * len(present) * 2), height_ratios=[1, 1.3]
    )
    # Time in communication per rank and op.
    for y, rank in enumerate(present):
        left = 0.0
        for row in table:
            label = f"{row.op} ({row.route})"
            ms = row.time_us.get(rank, 0.0) / 1e3
            if ms <= 0:
                continue
            bars.barh(
                y,
                ms,
                left=left,
                color=colors.get(label, other_color),
                edgecolor="white",
                linewidth=0.3,
            )
            left += ms
        wall_ms = float(merged.files[rank].meta.get("wall_us", 0.0)) / 1e3
        if wall_ms:
            bars.text(
                left,
                y,
                f" {100 * left / wall_ms:.1f}% of {wall_ms / 1e3:.2f} s",
                va="center",
                fontsize=8,
            )
    bars.set_yticks(range(len(present)), [f"rank {r}" for r in present])
    bars.invert_yaxis()
    bars.set_xlabel("time in jaxmpi's calls (ms)")
    bars.set_title("Time in communication per rank and op", fontsize=10, loc="left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[s]) for s in shown]
    if len(table) > len(shown):
        handles.append(plt.Rectangle((0, 0), 1, 1, color=other_color))
        shown = [*shown, "other"]
    bars.legend(handles, shown, fontsize=7, loc="lower right", ncols=2)
    bars.margins(x=0.25)

    # One step, every rank (a row per rank, or per device of a rank).
    begin, end = one_step(merged)
    spans = [
        (rank, int(e["args"].get("device", -1)), e)
        for rank in present
        for e in merged.files[rank].events
        if e.get("ph") == "X" and e["ts"] + e["dur"] >= begin and e["ts"] <= end
    ]
    lanes = {lane: y for y, lane in enumerate(sorted({(r, d) for r, d, _ in spans}))}
    for rank, device, e in spans:
        left, width = (e["ts"] - begin) / 1e3, e["dur"] / 1e3
        if e["args"].get("kind") == "in flight":
            # A started op's request from start to completion: a thin bar under the calls.
            label = f"{e['name']} ({e['args'].get('route', '')})"
            timeline.barh(
                lanes[(rank, device)] + 0.42,
                width,
                left=left,
                color=colors.get(label, other_color),
                height=0.12,
                alpha=0.6,
            )
            continue
        label = f"{e['name']} ({e['args'].get('route', '')})"
        timeline.barh(
            lanes[(rank, device)],
            width,
            left=left,
            color=colors.get(label, other_color),
            height=0.7,
            edgecolor="white",
            linewidth=0.4,
        )
    timeline.set_yticks(
        list(lanes.values()),
        [f"rank {r}" + (f" device {d}" if d >= 0 else "") for r, d in lanes],
    )
    timeline.invert_yaxis()
    timeline.set_xlim(0, max((end - begin) / 1e3, 1e-3))
    timeline.set_xlabel("ms from the step's first call (rank 0's clock; gaps: computation)")
    timeline.set_title(
        f"One step: {(end - begin) / 1e3:.3f} ms from {begin / 1e6:.3f} s", fontsize=10, loc="left"
    )
    figure.suptitle(
        f"jaxmpi profile, run {merged.run}: {len(present)} of {merged.size} ranks, "
        f"{wall_us(merged) / 1e6:.2f} s",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None


# --------------------------------------------------------------------------- the command


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxmpi profile",
        description="Merges the per-rank files of a jaxmpi profile (JAXMPI_PROFILE=DIR, "
        "jaxmpi.profile(DIR)): prints the time per op and call site, writes one merged "
        "trace and a PNG.",
    )
    parser.add_argument("directory", type=pathlib.Path, help="where the ranks wrote their files")
    parser.add_argument(
        "--run", help="the run to merge, where DIR holds several (default: the newest)"
    )
    parser.add_argument(
        "--trace", type=pathlib.Path, help=f"the merged trace (default: DIR/{MERGED})"
    )
    parser.add_argument("--png", type=pathlib.Path, help=f"the picture (default: DIR/{PNG})")
    parser.add_argument("--no-png", action="store_true", help="draw no picture")
    parser.add_argument("--top", type=int, default=40, help="rows of the per-op table (default 40)")
    args = parser.parse_args(argv)
    try:
        merged = load(args.directory, args.run)
    except ProfileError as err:
        print(f"jaxmpi profile: {err}", file=sys.stderr)
        return 1
    print("\n".join(summary(merged, args.top)))
    for note in merged.notes:
        print(f"note: {note}")
    failed = False
    trace = args.trace or args.directory / MERGED
    try:
        events = write_merged(merged, trace)
        print(
            f"merged trace: {trace} ({events} calls of {len(merged.present)} ranks; open it in "
            "https://ui.perfetto.dev or chrome://tracing)"
        )
    except OSError as err:
        print(
            f"jaxmpi profile: cannot write the merged trace: {err} (--trace PATH writes it elsewhere)",
            file=sys.stderr,
        )
        failed = True
    if not args.no_png:
        png = args.png or args.directory / PNG
        try:
            why = plot(merged, png)
        except OSError as err:
            why = f"cannot write the PNG: {err} (--png PATH writes it elsewhere)"
            failed = True
        print(f"picture: {png}" if why is None else f"jaxmpi profile: {why}")
    return 1 if failed else 0
