"""Checks of a jaxmpi profile's files and of their merge, for tests/profile_jobs.sh:

    python tests/profile_check.py MODE DIR JOB_OUTPUT [OPTIONS]

Reads the per-rank files (rank<N>.trace.json) and the job's output (its "EXPECT rank R OP
KIND CALLS BYTES" lines); merges with `python -m jaxmpi profile`'s own code, loaded from
the file without importing jaxmpi (no MPI, no JAX: fast), and checks what MODE names:

- trace: the merged trace field by field (every event's ph, ts, dur, pid, tid, name, args);
  every EXPECT line against the events of its rank and against that rank's totals; the
  merged table's calls = the sum of the ranks' calls = the events; the named call sites;
  the clocks: the ends of one barrier on every rank within 1 ms of each other (--skewed:
  rank 1's clock ran 5 s ahead and 500 ppm fast, and the measurement saw it);
- full: the records overflowed (--capacity N) and the totals did not;
- routes: the routes named by --routes appear, with the EXPECT lines;
- bad: the merge's answers to bad input (ranks without a file, a file cut short or left
  half written, files of two runs (--other DIR2: a profile of another run), no profile,
  no matplotlib): each said, and what is there merged.

Prints "pass ..." or "FAIL ..." per check; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import pathlib
import re
import shutil
import statistics
import sys
import tempfile

failed = 0


def verdict(name: str, ok: bool, detail: str = "") -> None:
    global failed
    print(f"{'pass' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail else ""))
    failed += not ok


def report_module():
    """jaxmpi's _profile_report.py, loaded by path: the package itself is not imported."""
    spec = importlib.util.find_spec("jaxmpi")
    assert spec is not None and spec.origin is not None, "jaxmpi is not installed"
    path = pathlib.Path(spec.origin).parent / "_profile_report.py"
    module_spec = importlib.util.spec_from_file_location("jaxmpi_profile_report", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # dataclasses look their module up
    module_spec.loader.exec_module(module)
    return module


REPORT = report_module()


def merge(directory: pathlib.Path, *args: str) -> tuple[int, str]:
    """`python -m jaxmpi profile DIRECTORY ARGS`, in this process: (status, output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = REPORT.main([str(directory), *args])
    return status, out.getvalue()


def expected(job_output: str) -> dict[tuple[int, str, str], tuple[int, int]]:
    """(rank, op, kind) -> (calls, bytes per call), from the job's EXPECT lines."""
    found = {}
    for rank, op, kind, calls, size in re.findall(
        r"^EXPECT rank (\d+) (\S+) (\S+) (\d+) (\d+)$", job_output, re.M
    ):
        found[(int(rank), op, kind)] = (int(calls), int(size))
    return found


def table_calls(output: str) -> dict[tuple[str, str], int]:
    """(op, route) -> calls, summed over call sites, from the merge's per-op table."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Per op and call site"))
    calls: dict[tuple[str, str], int] = {}
    for line in lines[start + 2 :]:
        words = line.split()
        if not words or not line.startswith("  "):
            break
        calls[(words[0], words[1])] = calls.get((words[0], words[1]), 0) + int(words[3])
    return calls


KINDS = {"call", "start", "wait", "in flight"}
ROUTES = {"jaxmpi", "MeshComm", "pass", "plug-in"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def check_events(trace: dict, size: int) -> list[str]:
    """What is wrong with the merged trace, field by field (empty: nothing)."""
    wrong = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["no traceEvents list"]
    if trace.get("displayTimeUnit") != "ms":
        wrong.append("displayTimeUnit is not ms")
    if trace.get("otherData", {}).get("jaxmpi_profile_merged") != 1:
        wrong.append("otherData.jaxmpi_profile_merged is not 1")
    named = set()
    for i, e in enumerate(trace["traceEvents"]):
        where = f"event {i} ({e.get('name')!r})"
        if e.get("ph") not in ("M", "X"):
            wrong.append(f"{where}: ph {e.get('ph')!r}")
            continue
        if not (type(e.get("pid")) is int and 0 <= e["pid"] < size):
            wrong.append(f"{where}: pid {e.get('pid')!r}")
        if not (type(e.get("tid")) is int and e["tid"] >= 0):
            wrong.append(f"{where}: tid {e.get('tid')!r}")
        if not (isinstance(e.get("name"), str) and e["name"]):
            wrong.append(f"{where}: name {e.get('name')!r}")
        args = e.get("args")
        if not isinstance(args, dict):
            wrong.append(f"{where}: args {args!r}")
            continue
        if e["ph"] == "M":
            if e["name"] not in METADATA:
                wrong.append(f"{where}: metadata {e['name']!r}")
            if e["name"].endswith("_name") and not isinstance(args.get("name"), str):
                wrong.append(f"{where}: args.name {args.get('name')!r}")
            if e["name"].endswith("_sort_index") and type(args.get("sort_index")) is not int:
                wrong.append(f"{where}: args.sort_index {args.get('sort_index')!r}")
            if e["name"] == "process_name":
                named.add(e["pid"])
            continue
        for key in ("ts", "dur"):
            if type(e.get(key)) not in (int, float):
                wrong.append(f"{where}: {key} {e.get(key)!r}")
        if type(e.get("ts")) in (int, float) and e["ts"] < -1000:
            wrong.append(f"{where}: ts {e['ts']} before the profile's start")
        if type(e.get("dur")) in (int, float) and e["dur"] < 0:
            wrong.append(f"{where}: dur {e['dur']}")
        if args.get("route") not in ROUTES or e.get("cat") != args.get("route"):
            wrong.append(f"{where}: route {args.get('route')!r}, cat {e.get('cat')!r}")
        if args.get("kind") not in KINDS:
            wrong.append(f"{where}: kind {args.get('kind')!r}")
        if not (type(args.get("bytes")) is int and args["bytes"] >= 0):
            wrong.append(f"{where}: bytes {args.get('bytes')!r}")
        if args.get("route") in ("jaxmpi", "plug-in") and not re.fullmatch(
            r"0x[0-9a-f]+", str(args.get("comm"))
        ):
            wrong.append(f"{where}: comm {args.get('comm')!r}")
        if (
            args.get("kind") in ("start", "wait", "in flight")
            and type(args.get("request")) is not int
        ):
            # A collective that completed at its start has no request.
            if not (args.get("kind") != "in flight" and "request" not in args):
                wrong.append(f"{where}: request {args.get('request')!r}")
        if "site" in args and not isinstance(args["site"], str):
            wrong.append(f"{where}: site {args['site']!r}")
    if named != set(range(size)):
        wrong.append(f"process_name events for ranks {sorted(named)}, not 0..{size - 1}")
    return wrong[:10]


def per_rank_files(directory: pathlib.Path) -> dict[int, dict]:
    return {
        int(m.group(1)): json.loads(p.read_text())
        for p in directory.iterdir()
        if (m := REPORT.RANK_FILE.match(p.name))
    }


def check_trace(args, directory: pathlib.Path, job: str) -> None:
    status, output = merge(directory, "--png", str(directory / "profile.png"))
    print("\n".join("      | " + line for line in output.splitlines()))
    verdict("the merge ran", status == 0, f"exit {status}")
    merged_path = directory / REPORT.MERGED
    trace = json.loads(merged_path.read_text())
    files = per_rank_files(directory)
    size = len(files)
    problems = check_events(trace, size)
    verdict(
        f"the merged trace, event by event ({len(trace['traceEvents'])} events)",
        not problems,
        "; ".join(problems),
    )
    png = (
        (directory / "profile.png").read_bytes()[:8]
        if (directory / "profile.png").exists()
        else b""
    )
    verdict("the PNG", png == b"\x89PNG\r\n\x1a\n", "written" if png else "missing")

    # Every EXPECT line: the rank's events and totals.
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    want = expected(job)
    verdict("the job said what it called", len(want) > 0, f"{len(want)} EXPECT lines")
    for (rank, op, kind), (calls, size_each) in sorted(want.items()):
        mine = [
            e for e in events if e["pid"] == rank and e["name"] == op and e["args"]["kind"] == kind
        ]
        totals = [
            t for t in files[rank]["otherData"]["totals"] if t["name"] == op and t["kind"] == kind
        ]
        total_calls = sum(t["calls"] for t in totals)
        sizes = {e["args"]["bytes"] for e in mine}
        verdict(
            f"rank {rank}: {calls} {op} ({kind}) of {size_each} bytes",
            len(mine) == calls == total_calls and sizes <= {size_each},
            f"{len(mine)} events, {total_calls} in its totals, bytes {sorted(sizes)}",
        )
    # The table: per op, the sum over ranks of their calls, which are the events.
    table = table_calls(output)
    for (op, route), calls in sorted(table.items()):
        in_totals = sum(
            t["calls"]
            for f in files.values()
            for t in f["otherData"]["totals"]
            if t["name"] == op and t["route"] == route and t["kind"] != "in flight"
        )
        in_events = sum(
            1
            for e in events
            if e["name"] == op and e["args"]["route"] == route and e["args"]["kind"] != "in flight"
        )
        verdict(
            f"merged {op} ({route}): {calls} calls = the ranks' totals = the events",
            calls == in_totals == in_events,
            f"totals {in_totals}, events {in_events}",
        )
    for op, scope in args.sites:
        sites = {e["args"].get("site", "") for e in events if e["name"] == op}
        verdict(
            f"{op}'s call site names its scope {scope!r}",
            bool(sites) and all(s.endswith(scope) for s in sites),
            f"sites {sorted(sites)}",
        )
    if args.barriers:
        check_barriers(events, size, args.barriers)
    if args.skewed:
        clock = files[1]["otherData"]["clock"]
        offset, drift = clock["start"]["offset_ns"], clock["drift_ppm"]
        verdict(
            "rank 1's clock measured 5 s ahead, 500 ppm fast",
            abs(offset + 5e9) < 5e6 and abs(drift - 500) < 200 and not clock["shared"],
            f"offset {offset / 1e9:.6f} s, drift {drift:.1f} ppm",
        )


def check_barriers(events: list[dict], size: int, count: int) -> None:
    """The i-th barrier ends on every rank within 1 ms (its ends can only be as close as
    the ranks are scheduled: a shared, loaded machine spreads some; the closest shows the
    clocks' agreement, which every barrier would share)."""
    ends = []
    for rank in range(size):
        mine = sorted(
            e["ts"] + e["dur"] for e in events if e["pid"] == rank and e["name"] == "barrier"
        )
        ends.append(mine)
    if any(len(e) != count for e in ends):
        verdict(f"{count} barriers on every rank", False, f"{[len(e) for e in ends]}")
        return
    spreads = [max(e[i] for e in ends) - min(e[i] for e in ends) for i in range(count)]
    verdict(
        "the ends of one barrier on every rank lie within 1 ms",
        min(spreads) < 1000,
        f"closest {min(spreads):.1f} us, median {statistics.median(spreads):.1f} us, "
        f"widest {max(spreads):.1f} us over {count} barriers",
    )


def check_full(args, directory: pathlib.Path, job: str) -> None:
    status, output = merge(directory, "--no-png")
    files = per_rank_files(directory)
    want = expected(job)
    for rank, f in sorted(files.items()):
        meta = f["otherData"]
        calls = sum(t["calls"] for t in meta["totals"])
        events = sum(1 for e in f["traceEvents"] if e["ph"] == "X")
        verdict(
            f"rank {rank}: {args.capacity} calls recorded, the rest dropped, all counted",
            meta["recorded"] == events == args.capacity
            and meta["dropped"] == calls - args.capacity
            and calls == sum(c for (r, _, _), (c, _) in want.items() if r == rank),
            f"recorded {meta['recorded']}, events {events}, dropped {meta['dropped']}, "
            f"totals {calls}",
        )
    verdict(
        "the merge says the records were full",
        status == 0 and "records were full" in output and "JAXMPI_PROFILE_CAPACITY" in output,
        output.splitlines()[-1] if output else "",
    )
    verdict(
        "the job said it when writing",
        "the records were full" in args.job_text and "JAXMPI_PROFILE_CAPACITY" in args.job_text,
    )
    verdict(
        "JAXMPI_PROFILE started it and rank 0 said where it went",
        all(f["otherData"]["source"] == "JAXMPI_PROFILE" for f in files.values())
        and "profile of 2 rank(s) written to" in args.job_text,
    )


def check_bad(args, directory: pathlib.Path) -> None:
    work = pathlib.Path(tempfile.mkdtemp())
    try:
        bad_input(args, directory, work)
    finally:
        shutil.rmtree(work)


def bad_input(args, directory: pathlib.Path, work: pathlib.Path) -> None:
    def copy(name: str) -> pathlib.Path:
        target = work / name
        target.mkdir()
        for p in directory.glob("rank*.trace.json"):
            shutil.copy(p, target / p.name)
        return target

    died = copy("died")
    (died / "rank1.trace.json").unlink()
    status, out = merge(died, "--no-png")
    verdict(
        "a rank without a file: said, the others merged",
        status == 0 and "rank 1 of 2 wrote no file" in out and "covers rank 0 only" in out,
        out.splitlines()[-2] if out else "",
    )
    cut = copy("cut")
    text = (cut / "rank1.trace.json").read_text()
    (cut / "rank1.trace.json").write_text(text[: len(text) // 2])
    status, out = merge(cut, "--no-png")
    verdict(
        "a file cut short: said, the others merged",
        status == 0 and "rank 1's file rank1.trace.json is not a complete trace" in out,
    )
    partial = copy("partial")
    (partial / "rank1.trace.json").rename(partial / "rank1.trace.json.partial")
    status, out = merge(partial, "--no-png")
    verdict(
        "a file left half written: said, the others merged",
        status == 0 and "rank 1 stopped while writing its file" in out,
    )
    mixed = copy("mixed")
    other = next(args.other.glob("rank1.trace.json"))
    shutil.copy(other, mixed / "rank1.trace.json")
    shutil.copy(directory / "rank1.trace.json", mixed / "rank1.trace.json.old")
    status, out = merge(mixed, "--no-png")
    runs = re.search(r"holds files of 2 runs: merging run (\w+)", out)
    verdict(
        "files of two runs: said, the newest run merged",
        status == 0 and runs is not None and "--run RUN merges another" in out,
        out.splitlines()[-3] if out else "",
    )
    first = json.loads((directory / "rank0.trace.json").read_text())["otherData"]["run"]
    status, out = merge(mixed, "--no-png", "--run", first)
    verdict(
        "--run merges the other run",
        status == 0 and f"run {first}:" in out and "rank 1 of 2 wrote no file" in out,
    )
    empty = work / "empty"
    empty.mkdir()
    status, out = merge(empty, "--no-png")
    verdict(
        "no profile at all: said, exit 1",
        status == 1 and "holds no jaxmpi profile to merge" in out,
        out.strip(),
    )
    status, out = merge(copy("unwritable"), "--no-png", "--trace", "/proc/no/such/dir/merged.json")
    verdict(
        "a merged trace that cannot be written: said, exit 1",
        status == 1 and "cannot write the merged trace" in out,
    )
    # Without matplotlib: the PNG is left out, with a message, the rest written.
    saved = sys.modules.get("matplotlib")
    sys.modules["matplotlib"] = None  # type: ignore[assignment]
    try:
        target = copy("no-matplotlib")
        status, out = merge(target)
    finally:
        if saved is None:
            del sys.modules["matplotlib"]
        else:
            sys.modules["matplotlib"] = saved
    verdict(
        "no matplotlib: no PNG, said; the trace merged",
        status == 0
        and "no PNG: matplotlib is not installed" in out
        and (target / REPORT.MERGED).exists()
        and not (target / REPORT.PNG).exists(),
    )


def check_routes(args, directory: pathlib.Path, job: str) -> None:
    status, output = merge(directory, "--png", str(directory / "profile.png"))
    print("\n".join("      | " + line for line in output.splitlines()))
    trace = json.loads((directory / REPORT.MERGED).read_text())
    files = per_rank_files(directory)
    problems = check_events(trace, len(files))
    verdict("the merged trace, event by event", status == 0 and not problems, "; ".join(problems))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    routes = {e["args"]["route"] for e in events}
    verdict(f"routes {args.routes}", set(args.routes) <= routes, f"seen {sorted(routes)}")
    for (rank, op, kind), (calls, size_each) in sorted(expected(job).items()):
        mine = [
            e for e in events if e["pid"] == rank and e["name"] == op and e["args"]["kind"] == kind
        ]
        verdict(
            f"rank {rank}: {calls} {op} ({kind}) of {size_each} bytes",
            len(mine) == calls and {e["args"]["bytes"] for e in mine} <= {size_each},
            f"{len(mine)} events",
        )
    for op, scope in args.sites:
        sites = {e["args"].get("site", "") for e in events if e["name"] == op}
        verdict(
            f"{op}'s call site names its scope {scope!r}",
            bool(sites) and all(scope in s.split("/") for s in sites),
            f"sites {sorted(sites)}",
        )
    png = (
        (directory / "profile.png").read_bytes()[:4]
        if (directory / "profile.png").exists()
        else b""
    )
    verdict("the PNG", png == b"\x89PNG")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["trace", "full", "bad", "routes"])
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("job_output", type=pathlib.Path)
    parser.add_argument("--barriers", type=int, default=0)
    parser.add_argument("--skewed", action="store_true")
    parser.add_argument("--capacity", type=int, default=0)
    parser.add_argument("--other", type=pathlib.Path)
    parser.add_argument("--routes", nargs="*", default=[])
    parser.add_argument(
        "--site", nargs=2, action="append", dest="sites", default=[], metavar=("OP", "SCOPE")
    )
    args = parser.parse_args()
    job = args.job_output.read_text(errors="replace")
    args.job_text = job
    if args.mode == "trace":
        check_trace(args, args.directory, job)
    elif args.mode == "full":
        check_full(args, args.directory, job)
    elif args.mode == "bad":
        check_bad(args, args.directory)
    else:
        check_routes(args, args.directory, job)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
