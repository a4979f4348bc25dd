"""ci/gpu_verdict.py -- the GPU run's judgement, kept apart so that CI can check it on canned
inputs (ci/gpu_check.sh) without a GPU.

usage: gpu_verdict.py junit DIR RANKS COLLECTED [--skipped K]
         every rank's report DIR/rank<N>.xml exists and counts exactly COLLECTED tests, of
         which exactly K (default 0) skipped and none failed or errored. The counts are
         pinned: a test that went missing, or skipped where it must run (a CUDA test skips
         where there is no GPU), fails the run as a failure does.
       gpu_verdict.py probe DIR RANKS
         summarizes ci/gpu_probe.py's files DIR/rank<N>.json in INFO lines: the driver and
         every libcuda in the process, the GPU each rank chose and when, what the driver
         says of JAX's buffers and what jaxmpi does with them. A diagnostic: exit status 0
         whatever it finds.
       gpu_verdict.py ipc DIR RANKS
         whether those files show every JAX buffer probed, on every rank, shareable by
         legacy CUDA IPC: prints why, exit status 0 if so, 1 if not or if a rank did not say.
       gpu_verdict.py archive RESULTS OUT
         packs the folder RESULTS into OUT/results.tar.gz, then checks that the device
         machine would bring all of OUT back: at most 8 files (subfolders counted), each at
         most 16 MiB, 64 MiB in all, at most 2 folders down, plain names.
Prints "PASS: ...", "FAIL: ..." or "INFO: ..." lines (ipc: one line of its own). Exit status
0 unless a check failed (1), or on misuse (2).
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path


def junit(folder: Path, ranks: int, collected: int, skipped: int) -> list[str]:
    problems, counts = [], []
    for rank in range(ranks):
        path = folder / f"rank{rank}.xml"
        try:
            suites = ET.parse(path).getroot().iter("testsuite")
        except (OSError, ET.ParseError) as err:
            problems.append(f"rank {rank}: no readable report ({err})")
            continue
        total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        first_skip = None
        for suite in suites:
            for key in total:
                total[key] += int(suite.get(key, 0))
            skip = suite.find("testcase/skipped")
            first_skip = first_skip or (skip is not None and skip.get("message"))
        passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
        counts.append(f"{passed}/{total['tests']}")
        if total["failures"] or total["errors"]:
            problems.append(f"rank {rank}: {total['failures']} failed, {total['errors']} errors")
        if total["tests"] != collected:
            problems.append(f"rank {rank}: {total['tests']} tests collected, {collected} pinned")
        if total["skipped"] != skipped:
            why = f" ({str(first_skip)[:60]}...)" if first_skip else ""
            problems.append(f"rank {rank}: {total['skipped']} skipped, {skipped} pinned{why}")
    if problems:
        return problems
    print(f"PASS: {folder.name}: passed/collected per rank {', '.join(counts)}")
    return []


def _short(value, width: int = 70) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def probe(folder: Path, ranks: int) -> None:
    """INFO lines, one per finding; nothing here fails the run."""
    name = folder.name
    for rank in range(ranks):
        path = folder / f"rank{rank}.json"
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            print(f"INFO: {name} rank {rank}: no probe report ({err})")
            continue

        def say(text: str, rank: int = rank) -> None:
            print(f"INFO: {name} rank {rank}: {text}")

        if "import" in found:
            say(f"import jaxmpi failed: {found['import']}")
            continue
        cuda = found.get("cuda", {})
        aware = found.get("cuda_aware", {})
        say(f"CUDA-aware {aware.get('cuda_aware')}: {_short(aware.get('cuda_aware_reason'), 200)}")
        if cuda.get("unused"):
            say(f"CUDA not used: {cuda['unused']}")
            continue
        if not cuda.get("driver"):
            say(f"driver does not load: {cuda.get('driver_error')}")
            continue
        version = cuda.get("driver_version") or 0
        mapped = cuda.get("libcudas_mapped", [])
        say(
            f"driver {cuda.get('libcuda')} (CUDA {version // 1000}.{version % 1000 // 10}), "
            f"{cuda.get('devices')} GPU(s); libcuda files mapped: {len(mapped)}"
            + ("" if len(mapped) == 1 else f" UNEXPECTED (want 1): {mapped}")
        )
        after = found.get("driver_after", {})
        later = after.get("libcudas_mapped", []) if isinstance(after, dict) else []
        say(
            f"libcuda files mapped after JAX and MPI started: {len(later)}"
            + ("" if len(later) == 1 else f" UNEXPECTED (want 1): {later or after}")
        )
        say(f"GPU {cuda.get('rank_gpu')}: {cuda.get('chosen')}; {cuda.get('when')}")
        say(f"mode: {cuda.get('mode')}")
        buffers = found.get("buffers", {})
        if isinstance(buffers, str):
            say(f"buffers: {buffers}")
            continue
        for size, attributes in buffers.items():
            shown = ", ".join(
                f"{k}={_short(v, 40)}" for k, v in attributes.items() if k not in ("mode", "why")
            )
            say(f"JAX buffer of {size}: {shown}")
            say(f"  -> {attributes.get('mode')}: {_short(attributes.get('why'), 200)}")


def legacy_ipc(folder: Path, ranks: int) -> tuple[bool, str]:
    """Whether every rank's probe found every JAX buffer it made shareable by legacy CUDA
    IPC, the way Intel MPI moves device buffers between the ranks of a node; and why."""
    sizes = set()
    for rank in range(ranks):
        try:
            found = json.loads((folder / f"rank{rank}.json").read_text())
        except (OSError, ValueError) as err:
            return False, f"rank {rank}: no probe report ({_short(err, 120)})"
        buffers = found.get("buffers")
        if not isinstance(buffers, dict) or not buffers:
            why = found.get("import") or found.get("cuda", {}).get("unused") or buffers
            return False, f"rank {rank}: no buffer probed ({_short(why or 'no driver', 120)})"
        for size, attributes in buffers.items():
            capable = attributes.get("is_legacy_cuda_ipc_capable")
            if capable != 1:
                return False, (
                    f"rank {rank}: JAX buffer of {size}: is_legacy_cuda_ipc_capable="
                    f"{_short(capable, 80)} (auto: {attributes.get('mode')})"
                )
            sizes.add(size)
    return True, f"every rank's JAX buffers ({', '.join(sorted(sizes))}) are legacy-IPC capable"


# What the device machine brings back of its $OUT (its tool's documented limits).
ARCHIVE = "results.tar.gz"
MOST_FILES, MOST_FILE_BYTES, MOST_BYTES, MOST_FOLDERS = 8, 16 << 20, 64 << 20, 2
PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")
# Of a bigger file (an MPI debug log run wild), the archive keeps the start and the end.
KEPT_BYTES = 6 << 20


def _kept(data: bytes) -> bytes:
    if len(data) <= KEPT_BYTES:
        return data
    head, tail = KEPT_BYTES // 3, KEPT_BYTES - KEPT_BYTES // 3
    cut = f"\n[... {len(data) - head - tail} bytes left out by gpu_verdict.py archive ...]\n"
    return data[:head] + cut.encode() + data[-tail:]


def archive(results: Path, out: Path) -> list[str]:
    """RESULTS into OUT/results.tar.gz (replaced whole: a run killed while packing keeps
    the last archive), then what of OUT would not come back."""
    if results.is_dir():
        partial = out / f".{ARCHIVE}.partial"
        with tarfile.open(partial, "w:gz") as tar:
            for path in sorted(p for p in results.rglob("*") if p.is_file()):
                # Read whole, then sized: a rank still writing its log cannot break the tar.
                data = _kept(path.read_bytes())
                entry = tarfile.TarInfo(f"{results.name}/{path.relative_to(results)}")
                entry.size, entry.mtime, entry.mode = len(data), int(path.stat().st_mtime), 0o644
                tar.addfile(entry, io.BytesIO(data))
        os.replace(partial, out / ARCHIVE)
    files = sorted(p for p in out.rglob("*") if not p.is_dir())
    names = [str(p.relative_to(out)) for p in files]
    problems = []
    if len(files) > MOST_FILES:
        problems.append(f"{len(files)} files under {out}, at most {MOST_FILES} come back: {names}")
    for path, name in zip(files, names, strict=True):
        if path.is_symlink() or not path.is_file():
            problems.append(f"{name}: not a plain file, does not come back")
        elif path.stat().st_size > MOST_FILE_BYTES:
            problems.append(f"{name}: {path.stat().st_size} bytes, over {MOST_FILE_BYTES}")
        if len(Path(name).parts) - 1 > MOST_FOLDERS or not all(
            PLAIN_NAME.fullmatch(part) for part in Path(name).parts
        ):
            problems.append(f"{name}: too deep or not a plain name, does not come back")
    total = sum(p.stat().st_size for p in files if p.is_file())
    if total > MOST_BYTES:
        problems.append(f"{total} bytes under {out}, over {MOST_BYTES}")
    if not problems:
        print(f"PASS: {len(files)} files to bring back ({', '.join(names)}), {total} bytes")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) in (5, 7) and argv[1] == "junit" and argv[5:6] in ([], ["--skipped"]):
        skipped = int(argv[6]) if len(argv) == 7 else 0
        problems = junit(Path(argv[2]), int(argv[3]), int(argv[4]), skipped)
    elif len(argv) == 4 and argv[1] == "probe":
        probe(Path(argv[2]), int(argv[3]))
        return 0
    elif len(argv) == 4 and argv[1] == "ipc":
        capable, why = legacy_ipc(Path(argv[2]), int(argv[3]))
        print(why)
        return 0 if capable else 1
    elif len(argv) == 4 and argv[1] == "archive":
        problems = archive(Path(argv[2]), Path(argv[3]))
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    for problem in problems:
        print(f"FAIL: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
