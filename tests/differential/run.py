"""The device-rank layer's differential tester: generated sharded programs (generate.py)
run with JAX's collectives on gloo and on jaxmpi, in each layout of processes x devices,
compared block by block, bit for bit.

    python tests/differential/run.py [--seeds 0:6] [--layouts 2x1,2x2,...] [--ill-formed]
                                     [--timeout 60] [--out DIR] [--summary FILE] [--env K=V]

A program counts where gloo runs it: jaxmpi must then give gloo's blocks, bit for bit.
Where gloo fails or hangs, the program is recorded with what each route gave, and not
counted. Where jaxmpi differs, the reference (one process holding every device, XLA's
own collectives) runs it too, and the difference says whether it agrees with gloo.
`--ill-formed` programs break the rule that keeps every group on one path (generate.py):
nothing there counts; they are run to see that jaxmpi ends each with a result or an
error. Prints a table per layout (with how many of XLA's collectives the programs handed to
jaxmpi's pass: `calls`, compiled once each) and every counted difference; exit status 1 if there is
one or if nothing was counted (ill-formed: if a jaxmpi process crashed).

Runs under the MPI of --venv (PyPI MPICH's, from ci/setup.sh); each route's programs run
in one MPI job a layout, a new job starting after a program that failed or hung
(job.py). `ci/test.sh` runs fixed seeds; a soak runs any number (benches/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LAYOUTS = ("2x1", "2x2", "1x4", "4x1", "3x1", "3x2", "2x3", "4x2")


def seeds_of(text: str) -> list[int]:
    """ "0:6" (a range) or "3,8,11"."""
    if ":" in text:
        first, last = (int(n) for n in text.split(":"))
        return list(range(first, last))
    return [int(n) for n in text.split(",")]


class Route:
    """One route's outcomes in one layout: per seed "ok", "error", "hung" or "crashed",
    and the blocks each process holds."""

    def __init__(self, name: str, layout: str, out: Path):
        self.name, self.layout, self.folder = name, layout, out / layout / name
        self.folder.mkdir(parents=True, exist_ok=True)
        processes, local = (int(n) for n in layout.split("x"))
        self.processes = 1 if name == "local" else processes
        self.local = processes * local if name == "local" else local
        self.status: dict[int, str] = {}
        self.seconds = 0.0

    def files(self, seed: int, what: str) -> list[Path]:
        return [self.folder / f"{seed}.p{p}.{what}" for p in range(self.processes)]

    def outcome(self, seed: int) -> str | None:
        """What happened to `seed`, or None if it never started."""
        if all(f.exists() for f in self.files(seed, "npz")):
            return "ok"
        if any(f.exists() for f in self.files(seed, "error")):
            return "error"
        if any(f.exists() for f in self.files(seed, "hung")):
            return "hung"
        if any(f.exists() for f in self.files(seed, "start")):
            return "crashed"
        return None

    def run(self, seeds: list[int], args) -> None:
        left = list(seeds)
        start = time.monotonic()
        while left:
            self.launch(left, args)
            done = [s for s in left if self.outcome(s) is not None]
            for s in done:
                self.status[s] = self.outcome(s)
            if not done:  # the job ended before the first program started
                self.status[left[0]] = "crashed"
                done = [left[0]]
            stop = left.index(done[-1])
            left = left[stop + 1 :]
        self.seconds = time.monotonic() - start

    def launch(self, seeds: list[int], args) -> None:
        venv = ROOT / args.venv
        env = {
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
            "VIRTUAL_ENV": str(venv),
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={self.local}",
            "DIFFERENTIAL_TIMEOUT": str(args.timeout),
            "DIFFERENTIAL_ILL_FORMED": "1" if args.ill_formed else "0",
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }
        env.update(kv.split("=", 1) for kv in args.env)
        job = [str(venv / "bin/python"), str(HERE / "job.py"), self.name, self.layout]
        job += [str(self.folder)] + [str(s) for s in seeds]
        if self.name != "local":
            job = [str(venv / "bin/mpiexec"), "-n", str(self.processes)] + job
        log = self.folder / f"job-{seeds[0]}.log"
        with open(log, "w") as f:
            try:
                subprocess.run(
                    job,
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=len(seeds) * (args.timeout + 30) + 120,
                )
            except subprocess.TimeoutExpired:
                f.write("\nrun.py: the job outran its time and was killed\n")

    def blocks(self, seed: int) -> dict[str, np.ndarray]:
        held = {}
        for f in self.files(seed, "npz"):
            with np.load(f) as data:
                held.update({k: data[k] for k in data.files})
        return held

    def calls(self, seed: int) -> int:
        """How many of XLA's collectives jaxmpi's pass took over in `seed` (process 0's)."""
        f = self.files(seed, "calls")[0]
        return int(f.read_text()) if f.exists() else 0

    def why(self, seed: int) -> str:
        """The first line of the first error a process wrote for `seed`."""
        for f in self.files(seed, "error"):
            if f.exists():
                return f.read_text().splitlines()[0][:300]
        return self.status.get(seed, "?")


def differences(a: dict, b: dict) -> list[str]:
    """Where two routes' blocks differ (empty: the same bits)."""
    found = [f"block {k} missing on one side" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            bad = np.argwhere(x != y) if x.shape == y.shape else []
            found.append(
                f"block {k}: {len(bad)} values differ, first at {bad[0].tolist() if len(bad) else '?'}"
            )
    return found


def compare(layout: str, seeds: list[int], args, out: Path) -> dict:
    """Both routes, then, where they disagree, the reference as a hint: each seed's
    verdict. (The reference cannot judge: XLA's own collectives among one process's
    devices wait for every device at a collective-permute, so a program whose devices take
    different branches hangs there, where gloo and jaxmpi run it.)"""
    gloo, ours = Route("gloo", layout, out), Route("jaxmpi", layout, out)
    gloo.run(seeds, args)
    ours.run(seeds, args)
    verdicts, suspects = {}, []
    for s in seeds:
        if gloo.status[s] != "ok":
            verdicts[s] = ("gloo " + gloo.status[s], f"jaxmpi {ours.status[s]}: {ours.why(s)}")
        elif ours.status[s] == "ok" and not differences(gloo.blocks(s), ours.blocks(s)):
            verdicts[s] = ("same", "")
        else:
            suspects.append(s)
    reference = Route("local", layout, out)
    if suspects:
        reference.run(suspects, args)
    for s in suspects:
        if reference.status[s] != "ok":
            hint = f"reference {reference.status[s]}"
        elif differences(gloo.blocks(s), reference.blocks(s)):
            hint = "reference: unlike gloo"
        else:
            hint = "reference: as gloo"
        if ours.status[s] != "ok":
            verdicts[s] = ("JAXMPI " + ours.status[s].upper(), f"{ours.why(s)} ({hint})")
        else:
            shown = "; ".join(differences(gloo.blocks(s), ours.blocks(s))[:3])
            verdicts[s] = ("DIFFERS", f"{shown} ({hint})")
    times = {r.name: round(r.seconds, 1) for r in (gloo, ours, reference) if r.seconds}
    return {"verdicts": verdicts, "seconds": times, "calls": sum(map(ours.calls, seeds))}


COUNTED = ("same", "DIFFERS", "JAXMPI ERROR", "JAXMPI HUNG", "JAXMPI CRASHED")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:6", help='"first:last" (a range) or "3,8,11"')
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--ill-formed", action="store_true", help="count nothing (see above)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a program may take")
    parser.add_argument("--out", default="/tmp/jaxmpi-differential")
    parser.add_argument("--venv", default=".venvs/mpich")
    parser.add_argument("--summary", help="write every verdict there, as JSON")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set in every job (JAXMPI_MESH_REDUCTIONS=ordered, say); may be repeated",
    )
    args = parser.parse_args()
    seeds, out = seeds_of(args.seeds), Path(args.out)
    counts = COUNTED if not args.ill_formed else ()
    results = {}
    print(
        f"{'layout':8} {'programs':>8} {'calls':>6} {'counted':>8} {'same':>6} {'differ':>7}  not counted"
    )
    for layout in args.layouts.split(","):
        results[layout] = result = compare(layout, seeds, args, out)
        kinds = [v[0] for v in result["verdicts"].values()]
        counted = [k for k in kinds if k in counts]
        others = ", ".join(f"{k} {kinds.count(k)}" for k in sorted(set(kinds) - set(counts)))
        differ = len(counted) - counted.count("same")
        print(
            f"{layout:8} {len(seeds):8} {result['calls']:6} {len(counted):8} "
            f"{counted.count('same'):6} {differ:7}  "
            f"{others or '-'}; seconds {result['seconds']}",
            flush=True,
        )
    every = [(layout, s, v) for layout, r in results.items() for s, v in r["verdicts"].items()]
    for layout, s, (kind, detail) in every:
        if kind not in counts:
            print(f"recorded, not counted: {layout} seed {s}: {kind}; {detail[:200]}")
    failures = [(layout, s, v) for layout, s, v in every if v[0] in counts and v[0] != "same"]
    for layout, s, (kind, detail) in failures:
        print(f"DIFFERENCE: {layout} seed {s}: {kind}: {detail}")
    if args.summary:
        data = {
            layout: {str(s): v for s, v in r["verdicts"].items()} for layout, r in results.items()
        }
        Path(args.summary).write_text(json.dumps(data, indent=1))
    if args.ill_formed:
        crashed = [e for e in every if e[2][0] == "JAXMPI CRASHED"]
        print(
            f"{len(every)} ill-formed programs, none counted; {len(crashed)} where jaxmpi crashed"
        )
        return 1 if crashed else 0
    counted = sum(1 for _, _, v in every if v[0] in counts)
    print(f"{counted} programs counted, {len(failures)} where jaxmpi differs from gloo")
    return 1 if failures or counted == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
