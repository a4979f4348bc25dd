"""ci/gpu_verdict.py -- the GPU run's judgement, kept apart so that CI can check it on canned
inputs (ci/gpu_check.sh) without a GPU.

usage: gpu_verdict.py junit DIR RANKS EXPECTED [--skipped-because TEXT] [--exit STATUS]
                     [--rc-dir RCDIR]
         every rank's report DIR/rank<N>.xml exists and counts exactly EXPECTED tests (what
         pytest collects from the test files, never a number written down), none failed or
         errored, and none skipped but for TEXT (a CUDA test skips where there is no GPU).
         With --exit, the job's exit status (tests/run_pytest_mpi.sh's) must be 0, and
         with --rc-dir every rank's pytest exit status (RCDIR/rank<N>.rc) too: a rank that
         crashed or hung at exit after writing a clean report fails the step.
       gpu_verdict.py installed
         prints, as JSON, the versions of Python, jax, jaxlib and JAX's CUDA plugins that
         this interpreter has (nothing imported: the image's JAX is read, not started).
       gpu_verdict.py jax FILE [--driver NVIDIA_SMI] [--cpu]
         judges FILE (from `installed`): one CUDA plugin, of jaxlib's version, its pjrt
         half too, and a driver (nvidia-smi's output) for at least that CUDA major. With
         --cpu (the dry run: the CPU stands in) no plugin is needed. The line names the
         plugin's version and CUDA major, which the run's report must state.
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
Prints "PASS: ...", "FAIL: ..." or "INFO: ..." lines (ipc: one line of its own; installed:
JSON). Exit status 0 unless a check failed (1), or on misuse (2).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path


def _short(value, width: int = 70) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _exit_problems(rc_dir: Path, ranks: int, clean: list[bool]) -> list[str]:
    """What each rank's pytest exit status (the .rc files tests/run_pytest_mpi.sh writes)
    says beyond its report: a rank whose report is clean but whose process did not exit 0
    crashed or hung at exit (MPI_Finalize, CUDA teardown), which the report cannot show."""
    problems = []
    for rank in range(ranks):
        try:
            status = (rc_dir / f"rank{rank}.rc").read_text().strip()
        except OSError:
            problems.append(f"rank {rank}: no exit status (killed, or hung at exit)")
            continue
        if status != "0":
            after = " after a clean report (a crash at exit)" if clean[rank] else ""
            problems.append(f"rank {rank}: pytest exit status {status}{after}")
    return problems


def junit(
    folder: Path,
    ranks: int,
    expected: int,
    skipped_because: str | None = None,
    job_status: int | None = None,
    rc_dir: Path | None = None,
) -> list[str]:
    problems, counts, clean = [], [], []
    for rank in range(ranks):
        path = folder / f"rank{rank}.xml"
        try:
            suites = list(ET.parse(path).getroot().iter("testsuite"))
        except (OSError, ET.ParseError) as err:
            problems.append(f"rank {rank}: no readable report ({err})")
            clean.append(False)
            continue
        total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for suite in suites:
            for key in total:
                total[key] += int(suite.get(key, 0))
        reasons = [
            skip.get("message") or ""
            for suite in suites
            for skip in suite.iterfind("testcase/skipped")
        ]
        unexpected = [r for r in reasons if not (skipped_because and skipped_because in r)]
        passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
        counts.append(f"{passed}/{total['tests']}")
        before = len(problems)
        if total["failures"] or total["errors"]:
            problems.append(f"rank {rank}: {total['failures']} failed, {total['errors']} errors")
        if total["tests"] != expected:
            problems.append(
                f"rank {rank}: {total['tests']} tests ran, the test files hold {expected}"
            )
        if unexpected:
            problems.append(f"rank {rank}: {len(unexpected)} skipped ({_short(unexpected[0], 60)})")
        clean.append(len(problems) == before)
    if rc_dir is not None:
        problems += _exit_problems(rc_dir, ranks, clean)
    if job_status:
        problems.append(f"the job's exit status {job_status} (tests/run_pytest_mpi.sh)")
    if problems:
        return problems
    exits = ", every rank and the job exit 0" if rc_dir is not None else ""
    print(f"PASS: {folder.name}: passed/ran per rank {', '.join(counts)}{exits}")
    return []


# JAX's CUDA plugins by CUDA major: each comes as a plugin and a pjrt half, of jaxlib's
# version (jax[cudaNN] pins all three alike).
CUDA_MAJORS = (12, 13)
VERSIONED = ("jax", "jaxlib") + tuple(
    f"jax-cuda{major}-{half}" for major in CUDA_MAJORS for half in ("plugin", "pjrt")
)


def installed() -> dict:
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _driver_cuda(nvidia_smi: Path | None) -> tuple[int, int] | None:
    """The CUDA version the driver supports, from nvidia-smi's header."""
    try:
        text = nvidia_smi.read_text() if nvidia_smi else ""
    except OSError:
        return None
    match = re.search(r"CUDA Version: (\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def jax_check(found: dict, nvidia_smi: Path | None, cpu: bool) -> tuple[list[str], str]:
    """(problems, what was found) for the JAX a run tests."""
    problems = []
    said = f"python {found.get('python')}, jax {found.get('jax')}, jaxlib {found.get('jaxlib')}"
    plugins = [m for m in CUDA_MAJORS if f"jax-cuda{m}-plugin" in found]
    for major in plugins:
        plugin, pjrt = found[f"jax-cuda{major}-plugin"], found.get(f"jax-cuda{major}-pjrt")
        said += f"; jax-cuda{major}-plugin {plugin} (CUDA {major}), jax-cuda{major}-pjrt {pjrt}"
        if not plugin == pjrt == found.get("jaxlib"):
            problems.append(
                f"jax-cuda{major}-plugin {plugin} and -pjrt {pjrt} beside jaxlib "
                f"{found.get('jaxlib')}: JAX loads a CUDA plugin of jaxlib's version only"
            )
    if found.get("jax") != found.get("jaxlib"):
        said += " (jax and jaxlib differ: jax names the jaxlib it takes)"
    if len(plugins) > 1:
        problems.append("plugins for two CUDA majors: both would claim the GPU")
    if not plugins and not cpu:
        problems.append("no CUDA plugin (jax-cuda12-plugin or jax-cuda13-plugin): JAX has no GPU")
    driver = _driver_cuda(nvidia_smi)
    if driver:
        said += f"; driver for CUDA {driver[0]}.{driver[1]}"
        problems += [
            f"jax-cuda{m}-plugin needs a driver for CUDA {m}, this one is for {driver[0]}.{driver[1]}"
            for m in plugins
            if m > driver[0]
        ]
    elif plugins and not cpu:
        said += "; the driver's CUDA version unknown (no nvidia-smi header)"
    return problems, said


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
    usage = __doc__.split("\n\n")[1].removeprefix("usage: ")
    parser = argparse.ArgumentParser(prog="gpu_verdict.py", usage=usage)
    commands = parser.add_subparsers(dest="command", required=True)
    junit_args = commands.add_parser("junit")
    junit_args.add_argument("dir", type=Path)
    junit_args.add_argument("ranks", type=int)
    junit_args.add_argument("expected", type=int)
    junit_args.add_argument("--skipped-because")
    junit_args.add_argument("--exit", type=int, dest="job_status")
    junit_args.add_argument("--rc-dir", type=Path)
    commands.add_parser("installed")
    jax_args = commands.add_parser("jax")
    jax_args.add_argument("file", type=Path)
    jax_args.add_argument("--driver", type=Path)
    jax_args.add_argument("--cpu", action="store_true")
    for name in ("probe", "ipc"):
        folder_args = commands.add_parser(name)
        folder_args.add_argument("dir", type=Path)
        folder_args.add_argument("ranks", type=int)
    archive_args = commands.add_parser("archive")
    archive_args.add_argument("results", type=Path)
    archive_args.add_argument("out", type=Path)
    args = parser.parse_args(argv[1:])

    if args.command == "junit":
        problems = junit(
            args.dir, args.ranks, args.expected, args.skipped_because, args.job_status, args.rc_dir
        )
    elif args.command == "installed":
        print(json.dumps(installed()))
        return 0
    elif args.command == "jax":
        try:
            found = json.loads(args.file.read_text())
        except (OSError, ValueError) as err:
            found, problems, said = {}, [f"no versions read ({err})"], ""
        else:
            problems, said = jax_check(found, args.driver, args.cpu)
        if not problems:
            print(f"PASS: {said}")
        else:
            print(f"INFO: {said}")
    elif args.command == "probe":
        probe(args.dir, args.ranks)
        return 0
    elif args.command == "ipc":
        capable, why = legacy_ipc(args.dir, args.ranks)
        print(why)
        return 0 if capable else 1
    else:
        problems = archive(args.results, args.out)
    for problem in problems:
        print(f"FAIL: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
