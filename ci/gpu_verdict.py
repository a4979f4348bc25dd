"""ci/gpu_verdict.py -- the GPU run's pass/fail judgement, kept apart so that CI can check it
on canned inputs (ci/gpu_check.sh) without a GPU.

usage: gpu_verdict.py junit DIR RANKS [--allow-skips]
         every rank's report DIR/rank<N>.xml exists, at least one test passed, none
         failed, none errored and (unless --allow-skips) none skipped. A CUDA
         test skips where there is no GPU, so a GPU run whose tests skipped did not test.
       gpu_verdict.py mode INFO_FILE RANKS staged|direct
         `python -m jaxmpi info` run at RANKS ranks printed RANKS "CUDA" lines, each with
         the mode asked for: the run tested the path it says it tested.
Prints "PASS: ..." or a "FAIL: ..." line per problem. Exit status 0 on PASS, 1 on FAIL, 2 on misuse.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def junit(folder: Path, ranks: int, allow_skips: bool) -> list[str]:
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
        if passed <= 0:  # skips allowed or not, a run where nothing passed tested nothing
            problems.append(f"rank {rank}: no test passed")
        if total["failures"] or total["errors"]:
            problems.append(f"rank {rank}: {total['failures']} failed, {total['errors']} errors")
        if total["skipped"] and not allow_skips:
            problems.append(f"rank {rank}: {total['skipped']} skipped ({str(first_skip)[:60]}...)")
    if problems:
        return problems
    print(f"PASS: {folder.name}: passed/collected per rank {', '.join(counts)}")
    return []


def mode(info_file: Path, ranks: int, wanted: str) -> list[str]:
    try:
        lines = info_file.read_text().splitlines()
    except OSError as err:
        return [f"no info output ({err})"]
    cuda = [line for line in lines if line.startswith("CUDA ")]
    if len(cuda) != ranks:
        return [f"{len(cuda)} CUDA lines for {ranks} ranks: {cuda}"]
    wrong = [line for line in cuda if f"mode: {wanted}" not in line]
    if wrong:
        return [f"wanted mode {wanted}, info says: {wrong[0].split(None, 1)[1]}"]
    print(f"PASS: {info_file.name}: {ranks} ranks in mode {wanted}")
    return []


def main(argv: list[str]) -> int:
    if len(argv) in (4, 5) and argv[1] == "junit" and argv[4:] in ([], ["--allow-skips"]):
        problems = junit(Path(argv[2]), int(argv[3]), allow_skips=len(argv) == 5)
    elif len(argv) == 5 and argv[1] == "mode" and argv[4] in ("staged", "direct"):
        problems = mode(Path(argv[2]), int(argv[3]), argv[4])
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    for problem in problems:
        print(f"FAIL: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
