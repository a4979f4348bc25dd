"""Tables and a plot from the benchmark's JSON files.

    python report.py RESULTS.md PLOT.png OPS_2.json [OPS_4.json ...] [--sw SW.json]

Writes the tables into RESULTS.md between the markers `<!-- results:begin -->` and
`<!-- results:end -->` (the text around them, the analysis, is kept; a missing file is
created with the markers), and the plot of time per call against message size.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
IMPLS = ["raw", "jaxmpi", "mpi4jax"]
TARGET = 1.10  # jaxmpi / raw


def fmt_us(us: float | None) -> str:
    if us is None:
        return "–"
    return f"{us:.3g}" if us < 100 else f"{us:,.0f}"


def ratio(a, b, mark: float | None = None) -> str:
    if a is None or b is None:
        return "–"
    r = a / b
    text = f"{r:.2f}"
    return f"**{text}**" if mark is not None and r > mark else text


def size_label(n: int) -> str:
    if n == 0:
        return "–"
    for unit, scale in (("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return str(n)


def machine_lines(m: dict) -> list[str]:
    return [
        (f"- CPU: {m['cpu']}, {m['cores']} cores (`os.cpu_count()`), a shared VM"),
        f"- MPI: {m['mpi']} (`{m['mpi_library']}`), thread level {m['thread_level']}",
        (
            f"- Python {m['python']}, jax/jaxlib {m['jax']}, jaxmpi {m['jaxmpi']}, mpi4jax "
            f"{m['mpi4jax']}, mpi4py {m['mpi4py']}"
        ),
    ]


def ops_table(data: dict) -> list[str]:
    ranks = data["machine"]["ranks"]
    rows = data["ops"]
    have_m4j = any("mpi4jax_us" in row for row in rows)
    have_min = any("minimal_us" in row for row in rows)
    head = ["op", "float32 elements", "raw C µs/call"]
    head += ["leanest FFI µs/call"] if have_min else []
    head += ["jaxmpi µs/call"] + (["mpi4jax µs/call"] if have_m4j else [])
    head += ["jaxmpi / raw"] + (["jaxmpi / mpi4jax"] if have_m4j else [])
    head += ["big copies in loop body (jaxmpi, mpi4jax)"]
    align = ["---", "---:", "---:"] + ["---:"] * (len(head) - 4) + ["---"]
    title = f"#### {ranks} ranks"
    if ranks > data["machine"]["cores"]:
        title += " (oversubscribed)"
    load = data["machine"]["load_average"][0], data["machine"]["load_average_after"][0]
    title += f" (load average {load[0]:.1f} before, {load[1]:.1f} after)"
    out = [title, "", "| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for row in rows:
        cells = [row["op"], size_label(row["elements"]), fmt_us(row["raw_us"])]
        if have_min:
            cells.append(fmt_us(row.get("minimal_us")))
        cells.append(fmt_us(row["jaxmpi_us"]))
        if have_m4j:
            cells.append(fmt_us(row.get("mpi4jax_us")))
        cells.append(ratio(row["jaxmpi_us"], row["raw_us"], TARGET))
        if have_m4j:
            cells.append(ratio(row["jaxmpi_us"], row.get("mpi4jax_us"), 1.0))
        copies = row.get("copies", {})
        cells.append(
            ", ".join(str(copies.get(k, "–")) for k in ("jaxmpi", "mpi4jax"))
            if row["elements"] >= 4096
            else ""
        )
        out.append("| " + " | ".join(cells) + " |")
    over = [r for r in rows if r["jaxmpi_us"] > TARGET * r["raw_us"]]
    summary = f"{len(rows) - len(over)} of {len(rows)} rows within {TARGET:.2f}x of the raw loop"
    if over:
        summary += "; over it: " + ", ".join(f"{r['op']} {size_label(r['elements'])}" for r in over)
    out += ["", summary + ". Bold: jaxmpi / raw above 1.10, or jaxmpi slower than mpi4jax.", ""]
    return out


def overhead_table(datas: list[dict]) -> list[str]:
    cases = [row["case"] for d in datas for row in d.get("overhead", [])]
    cases = list(dict.fromkeys(cases))
    if not cases:
        return []
    head = (
        "| per iteration, each rank on a 1-rank communicator | "
        + " | ".join(f"{d['machine']['ranks']} ranks (ns)" for d in datas)
        + " |"
    )
    out = [head, "|---|" + "---:|" * len(datas)]
    for case in cases:
        values = [
            next((f"{r['ns']:.0f}" for r in d.get("overhead", []) if r["case"] == case), "–")
            for d in datas
        ]
        out.append(f"| {case} | " + " | ".join(values) + " |")
    return out + [""]


def dispatch_table(datas: list[dict]) -> list[str]:
    cases = []
    for d in datas:
        for row in d.get("dispatch", []):
            name = row["case"].rsplit(" [", 1)[0]
            if name not in cases:
                cases.append(name)
    if not cases:
        return []
    head = (
        "| a Python loop calling | "
        + " | ".join(
            f"{d['machine']['ranks']} ranks: queued (async) | {d['machine']['ranks']} ranks: "
            "each waited for (sync)"
            for d in datas
        )
        + " |"
    )
    out = [head, "|---|" + "---:|" * (2 * len(datas))]
    for name in cases:
        cells = [name]
        for d in datas:
            values = {row["case"]: row["us"] for row in d.get("dispatch", [])}
            if name.startswith("raw"):
                cells += [fmt_us(values.get(name + " [async]", values.get(name))), "–"]
            else:
                cells += [
                    fmt_us(values.get(f"{name} [async]")),
                    fmt_us(values.get(f"{name} [sync]")),
                ]
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", "(µs per call; the raw row is one MPI_Allreduce of 1 float from C.)", ""]


def sw_table(sw: dict) -> list[str]:
    out = [
        (
            "| ranks | ours on jaxmpi (s) | mpi4jax's example on mpi4jax (s) | mpi4jax's "
            "example on jaxmpi, drop-in (s) | ours / mpi4jax's | drop-in / mpi4jax |"
        ),
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for run in sw["runs"]:
        b = run["best_s"]
        ours, theirs = b.get("ours (jaxmpi)"), b.get("mpi4jax example (mpi4jax)")
        drop = b.get("mpi4jax example (jaxmpi drop-in)")

        def f(v):
            return "failed" if v is None else f"{v:.2f}"

        out.append(
            f"| {run['ranks']} | {f(ours)} | {f(theirs)} | {f(drop)} | "
            f"{ratio(ours, theirs)} | {ratio(drop, theirs)} |"
        )
        for name, error in run.get("errors", {}).items():
            out.append(f"\n{name} on {run['ranks']} ranks failed: `{error.strip()[-300:]}`\n")
    return out + [
        "",
        (
            f"Best of {sw['rounds']} rounds; grid {sw['grid']}, {sw['days']} model days, "
            "100 steps per jitted call, float32."
        ),
        "",
    ]


def plot(path: str, datas: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in dict.fromkeys(r["op"] for d in datas for r in d["ops"]) if op != "barrier"]
    cols = 4
    rows = -(-len(ops) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False, layout="constrained"
    )
    colors = {"raw": "black", "jaxmpi": "tab:blue", "mpi4jax": "tab:orange"}
    # (the leanest FFI binding is in the tables; the plot shows the three implementations)
    styles = ["-", "--", ":"]
    for ax, op in zip(axes.flat, ops):
        for k, d in enumerate(datas):
            data = [r for r in d["ops"] if r["op"] == op]
            for impl in IMPLS:
                pts = [(r["elements"] * 4, r[f"{impl}_us"]) for r in data if f"{impl}_us" in r]
                if pts:
                    x, y = zip(*pts)
                    ax.loglog(
                        x,
                        y,
                        styles[k % 3],
                        marker="o",
                        ms=3,
                        color=colors[impl],
                        label=f"{impl}, {d['machine']['ranks']} ranks",
                    )
        ax.set(title=op, xlabel="bytes per rank", ylabel="µs per call")
        ax.grid(True, which="major", alpha=0.3)
    for ax in list(axes.flat)[len(ops) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower right", fontsize=8)
    fig.suptitle("Time per call inside a jitted fori_loop (raw: the same MPI call in a C loop)")
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("png")
    parser.add_argument("ops", nargs="+")
    parser.add_argument("--sw")
    args = parser.parse_args()
    datas = [json.loads(pathlib.Path(p).read_text()) for p in args.ops]
    lines = [BEGIN, "", "### Machine", ""] + machine_lines(datas[0]["machine"]) + [""]
    lines += ["### Time per call of each op inside a jitted `fori_loop`", ""]
    for d in datas:
        lines += ops_table(d)
    lines += [f"![time per call vs message size]({pathlib.Path(args.png).name})", ""]
    lines += ["### Overhead of one op per loop iteration, without waiting for a partner", ""]
    lines += overhead_table(datas)
    lines += ["### Dispatch: a tiny jitted function called from Python", ""]
    lines += dispatch_table(datas)
    if args.sw:
        lines += ["### Shallow water: solve time", ""]
        lines += sw_table(json.loads(pathlib.Path(args.sw).read_text()))
    lines.append(END)
    block = "\n".join(lines)
    path = pathlib.Path(args.results)
    text = path.read_text() if path.exists() else f"# Benchmark results\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        text = re.sub(
            re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.DOTALL
        )
    else:
        text += "\n" + block + "\n"
    path.write_text(text)
    plot(args.png, datas)
    print(f"report: wrote {path} and {args.png}")


if __name__ == "__main__":
    main()
