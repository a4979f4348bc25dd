"""The benchmarks' plots, drawn with matplotlib from the benchmarks' own JSON output.

    python benches/plots.py RESULTS_DIR OUT_DIR

reads what the benchmarks wrote into RESULTS_DIR (benches/results/: see its README.md for
the run each file comes from) and draws into OUT_DIR:

- latency.png: time per call against message size, per op: the raw MPI call from C,
  jaxmpi and mpi4jax (bench_ops.py: ops.json), and JAX's own collectives over gloo and
  over MPI through jaxmpi (bench_jax_collectives.py --json: jax_collectives.json);
- overlap.png: what overlapping an exchange with computation gains over the blocking
  exchange followed by the computation (bench_overlap.py --out: overlap.json);
- ragged.png: the particle migration step with counts computed inside jit, against
  padding to static shapes and exchanging with mpi4py outside jit (bench_ragged.py
  --json: ragged.json).

A missing input skips its plot, saying so. The benchmarks call the same functions for
their own --plot option.
"""

from __future__ import annotations

import json
import pathlib
import sys

# The op of bench_ops.py and the collective of JAX that does the same, per panel.
LATENCY_PANELS = [("allreduce", "psum"), ("allgather", "all_gather"), ("sendrecv", "ppermute")]
COLOURS = {
    "raw": "black",
    "jaxmpi": "tab:blue",
    "mpi4jax": "tab:orange",
    "gloo": "tab:red",
    "mpi": "tab:green",
}


def _pyplot(font_size: int = 9):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": font_size, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _bytes_label(n: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def _count_label(n: float) -> str:
    return _bytes_label(n).replace("iB", "i").removesuffix(" B")


def _bytes_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _bytes_label(v)))


def latency(ops: dict | None, jax_collectives: dict | None, png: pathlib.Path) -> None:
    """Time per call against bytes per rank, one panel per op, every implementation measured."""
    plt = _pyplot(font_size=11)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.6), layout="constrained")
    for ax, (op, collective) in zip(axes, LATENCY_PANELS):
        series = {}
        if ops:
            rows = sorted((r for r in ops["ops"] if r["op"] == op), key=lambda r: r["elements"])
            for impl, label in (
                ("raw", "MPI from C"),
                ("jaxmpi", "jaxmpi"),
                ("mpi4jax", "mpi4jax"),
            ):
                pts = [(4 * r["elements"], r[f"{impl}_us"]) for r in rows if f"{impl}_us" in r]
                series[impl] = (f"{label} (jitted loop)", pts)
        if jax_collectives:
            for impl, label in (("gloo", "gloo"), ("mpi", "MPI via jaxmpi")):
                rows = [
                    r
                    for r in jax_collectives["rows"]
                    if r["impl"] == impl and r["case"] == collective
                ]
                pts = sorted((4 * r["elements"], r["us"]) for r in rows)
                series[impl] = (f"JAX's collective in shard_map, {label}", pts)
        for impl, (label, pts) in series.items():
            if pts:
                x, y = zip(*pts)
                style = "--" if impl in ("gloo", "mpi") else "-"
                ax.loglog(x, y, style, marker="o", ms=3, color=COLOURS[impl], label=label)
        _bytes_axis(ax)
        ax.set(title=f"{op} / {collective}", xlabel="bytes per rank", ylabel="µs per call")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=10)
    fig.suptitle("Time per call inside a jitted loop, 2 ranks on one node (lower is better)")
    fig.savefig(png, dpi=100)
    plt.close(fig)


def overlap(results: list[dict], png: pathlib.Path, build: str = "pypi-mpich-5") -> None:
    """Gain of isend/irecv + computation + wait over sendrecv then the computation."""
    plt = _pyplot()
    rows = [r for r in results if r["build"] == build and "error" not in r]
    sizes = [o["bytes"] for o in rows[0]["overlap"]]
    fig, (ax, sw) = plt.subplots(
        1, 2, figsize=(12, 3.8), layout="constrained", gridspec_kw={"width_ratios": [3, 1.3]}
    )
    width = 0.8 / len(rows)
    for k, r in enumerate(rows):
        label = f"progress {r['progress']}" + (", pinned" if r["pin"] else "")
        gains = [o["gain_vs_sendrecv"] for o in r["overlap"]]
        ax.bar([i + k * width for i in range(len(sizes))], gains, width, label=label)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(sizes))], map(_bytes_label, sizes))
    ax.set(
        ylabel="(sendrecv + compute) / overlapped",
        title="one exchange hidden behind computation of equal length (> 1: overlap pays)",
    )
    ax.legend(fontsize=7, ncol=2)
    # Times, not the speedup alone: a setting that slows every call (MPICH's own progress
    # thread on 2 busy cores) shows a large speedup over its own slow blocking step.
    labels = [f"{r['progress']}{' pinned' if r['pin'] else ''}" for r in rows]
    at = range(len(rows))
    sw.barh([i + 0.2 for i in at], [r["shallow"]["blocking_us"] for r in rows], 0.4,
            color="tab:gray", label="blocking")  # fmt: skip
    sw.barh([i - 0.2 for i in at], [r["shallow"]["overlap_us"] for r in rows], 0.4,
            color="tab:blue", label="--overlap")  # fmt: skip
    sw.set_yticks(list(at), labels)
    sw.set_xscale("log")
    sw.set(xlabel="µs per step (lower is better)", title="shallow water 360 x 180")
    sw.legend(fontsize=7)
    fig.suptitle(f"Non-blocking overlap, {build}, 2 ranks on 2 cores")
    fig.savefig(png, dpi=100)
    plt.close(fig)


def ragged(data: dict, png: pathlib.Path) -> None:
    """Time per particle migration step against the number of particles, per method."""
    from matplotlib.ticker import FuncFormatter

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8), layout="constrained")
    labels = {
        "ragged": "alltoallv with recv_capacity= (in jit)",
        "padded": "alltoall padded to static shapes (in jit)",
        "mpi4py": "mpi4py outside jit",
    }
    colours = {"ragged": "tab:blue", "padded": "tab:orange", "mpi4py": "tab:gray"}
    rows = sorted(data["rows"], key=lambda r: r["particles"])
    for method, label in labels.items():
        ax.loglog(
            [r["particles"] for r in rows],
            [r[f"{method}_us"] / 1e3 for r in rows],
            marker="o",
            ms=3,
            color=colours[method],
            label=label,
        )
    ax.set(xlabel="particles (all ranks)", ylabel="ms per step", title="particle migration step")
    _bytes_axis(ax)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _count_label(v)))
    ax.legend(fontsize=7)
    fig.suptitle(f"Counts computed inside jit, {data['ranks']} ranks")
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _read(path: pathlib.Path):
    if not path.is_file():
        print(f"plots: {path} missing: its plot is skipped")
        return None
    return json.loads(path.read_text())


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    results, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    ops = _read(results / "ops.json")
    jax_collectives = _read(results / "jax_collectives.json")
    drawn = []
    if ops or jax_collectives:
        latency(ops, jax_collectives, out / "latency.png")
        drawn.append("latency.png")
    if (data := _read(results / "overlap.json")) is not None:
        overlap(data, out / "overlap.png")
        drawn.append("overlap.png")
    if (data := _read(results / "ragged.json")) is not None:
        ragged(data, out / "ragged.png")
        drawn.append("ragged.png")
    print(f"plots: {', '.join(drawn) or 'nothing'} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
