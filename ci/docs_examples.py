"""Runs the documentation's examples and compares what they print with the page.

    python ci/docs_examples.py docs/_build/html/_examples.json LOG_DIR [--build pypi-mpich-5]

The examples are the pages' mpirun blocks (docs/_ext/jaxmpi_docs.py), which the Sphinx
build lists in _examples.json. They run under ci/matrix.sh's `matrix_exec` (the build's
launcher and clean environment; PyPI MPICH 5 by default), in as few jobs as sound: one
job per (ranks, environment), plus one per page for blocks marked `:process:` (a page
that changes process-wide state, such as starting jax.distributed). In a job every rank
runs the pages in order; a page's blocks run in page order in one namespace, and each
page starts with a fresh one. After a block raises, the rest of its page is skipped.

Each rank writes what each block printed (and any traceback) to LOG_DIR, the job's own
output to LOG_DIR/JOB.log. A block passes if it ran on every rank and the lines printed
(rank 0's, then rank 1's, ...) match its output block line for line, where `...` in an
expected line matches any text. Exit status 1 lists every failing block by page and line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
JOB_TIMEOUT = 120  # seconds for one job: a hang (a rank waiting for one that failed) ends


def jobs(examples: list[dict]) -> dict[tuple, list[dict]]:
    """Examples grouped into jobs, in page order within each."""
    grouped: dict[tuple, list[dict]] = {}
    for number, example in enumerate(examples):
        example["id"] = number
        own = (example["doc"], example["process"]) if example["process"] else ()
        key = (example["ranks"], tuple(example["env"]), own)
        grouped.setdefault(key, []).append(example)
    return grouped


def job_name(key: tuple) -> str:
    ranks, env, own = key
    words = [f"n{ranks}", *env] + ([f"{own[0]}-{own[1]}"] if own else [])
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", "-".join(words))


# --------------------------------------------------------------------------- each rank


def worker(blocks_file: str, out_dir: str) -> None:
    rank = next(
        int(os.environ[v])
        for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
        if v in os.environ
    )
    blocks = json.loads(pathlib.Path(blocks_file).read_text())
    results = pathlib.Path(out_dir) / f"rank{rank}.jsonl"
    namespace: dict = {}
    doc, failed_doc = None, None
    with results.open("w") as out:
        for block in blocks:
            if block["doc"] != doc:
                doc, namespace = block["doc"], {"__name__": "__main__"}
            if failed_doc == doc:
                continue
            printed, error = io.StringIO(), None
            code = compile(block["code"], f"{block['source']}:{block['line']}", "exec")
            try:
                with contextlib.redirect_stdout(printed):
                    exec(code, namespace)
            except BaseException:  # SystemExit too: a block must not exit
                error = traceback.format_exc()
                failed_doc = doc
            out.write(json.dumps({"id": block["id"], "stdout": printed.getvalue(), "error": error}))
            out.write("\n")
            out.flush()


# --------------------------------------------------------------------------- the driver


def matches(expected: str, line: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, line) is not None


def judge(example: dict, per_rank: list[dict | None]) -> str | None:
    """None if the example passed, else why not."""
    where = f"{example['source']}:{example['line']}"
    if any(r is None for r in per_rank):
        missing = [str(k) for k, r in enumerate(per_rank) if r is None]
        return f"{where}: never ran on rank {', '.join(missing)} (an earlier block of its page failed there, or the job ended: see its log)"
    errors = [(k, r["error"]) for k, r in enumerate(per_rank) if r["error"]]
    if errors:
        rank, text = errors[0]
        return f"{where}: raised on rank {rank}:\n{text}"
    got = [line.rstrip() for r in per_rank for line in r["stdout"].splitlines()]
    want = [line.rstrip() for line in (example["output"] or "").splitlines()]
    if len(got) == len(want) and all(matches(w, g) for w, g in zip(want, got)):
        return None
    shown = "\n".join(f"    {line}" for line in got) or "    (nothing)"
    expected = "\n".join(f"    {line}" for line in want) or "    (nothing)"
    return f"{where}: printed (rank 0's lines, then rank 1's, ...)\n{shown}\n  the page shows\n{expected}"


def run_job(key: tuple, examples: list[dict], log_dir: pathlib.Path, build: str) -> list[str]:
    name = job_name(key)
    out_dir = log_dir / name
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank*.jsonl"):
        stale.unlink()
    blocks_file = out_dir / "blocks.json"
    blocks_file.write_text(json.dumps(examples))
    ranks, env, _ = key
    script = 'source ci/matrix.sh && build=$1 && n=$2 && shift 2 && matrix_exec "$build" "$n" "$@"'
    argv = ["bash", "-c", script, "_", build, str(ranks), "JAX_PLATFORMS=cpu", *env, "--",
            "python", str(ROOT / "ci" / "docs_examples.py"), "--worker", str(blocks_file),
            str(out_dir)]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, JAXMPI_CELL_TIMEOUT=str(JOB_TIMEOUT), JAXMPI_ROOT=str(ROOT)),
    )
    (log_dir / f"{name}.log").write_text(done.stdout + done.stderr)
    seconds = time.monotonic() - started
    results: list[dict[int, dict]] = []
    for rank in range(ranks):
        path = out_dir / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        results.append({r["id"]: r for r in map(json.loads, lines)})
    failures = []
    for example in examples:
        verdict = judge(example, [results[k].get(example["id"]) for k in range(ranks)])
        if verdict:
            failures.append(f"{example['doc']}: {verdict}")
    pages = len({e["doc"] for e in examples})
    status = "ok" if not failures else f"{len(failures)} failed"
    print(
        f"  job {name}: {len(examples)} blocks of {pages} pages, exit {done.returncode}, "
        f"{seconds:.1f}s: {status}",
        flush=True,
    )
    if failures and done.returncode != 0:
        failures.append(f"job {name} ended with status {done.returncode}: log {log_dir / name}.log")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "examples", help="_examples.json of the build (or, with --worker, a job's blocks)"
    )
    parser.add_argument("log_dir")
    parser.add_argument("--build", default="pypi-mpich-5", help="a build of ci/matrix.sh")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.examples, args.log_dir)
        return 0
    examples = json.loads(pathlib.Path(args.examples).read_text())
    if not examples:
        print("docs_examples: no examples in the build: is the extension loaded?")
        return 1
    log_dir = pathlib.Path(args.log_dir)
    failures = []
    for key, group in jobs(examples).items():
        failures += run_job(key, group, log_dir, args.build)
    pages = len({e["doc"] for e in examples})
    failed = sum(not f.startswith("job ") for f in failures)
    print(
        f"docs_examples: {len(examples) - failed} of {len(examples)} examples of {pages} pages passed"
    )
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
