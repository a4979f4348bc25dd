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
Prints "PASS: ...", "FAIL: ..." or "INFO: ..." lines. Exit status 0 unless a check failed
(1), or on misuse (2).
"""

from __future__ import annotations

import json
import sys
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


def main(argv: list[str]) -> int:
    if len(argv) in (5, 7) and argv[1] == "junit" and argv[5:6] in ([], ["--skipped"]):
        skipped = int(argv[6]) if len(argv) == 7 else 0
        problems = junit(Path(argv[2]), int(argv[3]), int(argv[4]), skipped)
    elif len(argv) == 4 and argv[1] == "probe":
        probe(Path(argv[2]), int(argv[3]))
        return 0
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    for problem in problems:
        print(f"FAIL: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
