#!/usr/bin/env python3
"""ci/import_layers.py -- checks that python/jaxmpi imports one way, top to bottom.

    python3 ci/import_layers.py [--graph] [--package DIR]

Reads every module of the package with `ast` (nothing is imported or run) and draws its
import graph: every `import` and `from ... import`, at module level or inside a function
(a deferred import is a dependency like any other), of a jaxmpi module. Fails when
  - a module imports one of a higher layer than its own (LAYERS, top first),
  - the graph has a cycle (imports within one layer are allowed, in one direction),
  - a module of the package is in no layer (a new module takes its place here),
and prints one line per problem. `--graph` also prints every import, by layer;
`--package` reads another copy of the package (default: this checkout's python/jaxmpi).

Packages' implicit imports (running `jaxmpi/__init__.py` before any submodule) are
Python's, not the design's, and are not edges. Runs in well under a second.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "jaxmpi"

# The layers, top first. A pattern is a module's dotted name, or a package's followed by
# ".*" for everything below it. The extension module (`jaxmpi._native`, built from
# python/src) is at the bottom: it is compiled, not read, and imports nothing of ours.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("entry points", ("jaxmpi.__main__", "jaxmpi._mpi4jax", "jaxmpi._as_mpi4jax.*", "jaxmpi._profile_report")),
    ("the package's face", ("jaxmpi",)),
    ("public API: ops", (
        "jaxmpi.distributed", "jaxmpi._nonblocking", "jaxmpi._varcount", "jaxmpi._ragged",
        "jaxmpi._reductions", "jaxmpi._collectives", "jaxmpi._p2p", "jaxmpi._profile",
    )),
    ("public API: what ops take", (
        "jaxmpi._trees", "jaxmpi._requests", "jaxmpi._args", "jaxmpi._comm", "jaxmpi._errors", "jaxmpi._token",
        "jaxmpi._mesh_comm",
    )),
    ("JAX binding: rules and registrations", (
        "jaxmpi._binding", "jaxmpi._binding.rules", "jaxmpi._binding.rules.*",
        "jaxmpi._binding.requests", "jaxmpi._binding.jax_collectives",
    )),
    ("JAX binding: primitives and dispatch", (
        "jaxmpi._binding.primitives", "jaxmpi._binding.dispatch", "jaxmpi._binding.hlo_pass",
    )),
    ("JAX binding: placement", ("jaxmpi._binding.placement",)),
    ("JAX binding: private JAX", ("jaxmpi._binding.jax_shim",)),
    ("runtime: this rank's GPU", ("jaxmpi._runtime", "jaxmpi._runtime.gpu")),
    ("runtime: the MPI library", ("jaxmpi._runtime.library",)),
    ("runtime: its parts", (
        "jaxmpi._runtime.support", "jaxmpi._runtime.agree", "jaxmpi._runtime.errors",
        "jaxmpi._runtime.encodings", "jaxmpi._runtime.slurm", "jaxmpi._runtime.gpu_choice",
        "jaxmpi._runtime.profile",
    )),
    ("extension module", ("jaxmpi._native",)),
)  # fmt: skip


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__.py)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("jaxmpi", *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    found["jaxmpi._native"] = root / "_native.pyi"  # the extension, typed by its stub
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(jaxmpi module imported, line) for every import statement in the module."""
    if path.suffix == ".pyi":
        return []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.append((submodule if submodule in known else source, node.lineno))
    return [(target, line) for target, line in found if target.split(".")[0] == "jaxmpi"]


def layer_of(name: str) -> int | None:
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if name == pattern or (pattern.endswith(".*") and name.startswith(pattern[:-1])):
                return index
    return None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def main(argv: list[str]) -> int:
    package = Path(argv[argv.index("--package") + 1]) if "--package" in argv else PACKAGE
    known = modules(package)
    problems = []
    graph: dict[str, set[str]] = {name: set() for name in known}
    lines: dict[tuple[str, str], int] = {}
    for name, path in known.items():
        for target, line in imports(name, path, known):
            if target == name:
                continue
            if target not in known:
                problems.append(f"{path.name}:{line}: imports {target}, which does not exist")
                continue
            graph[name].add(target)
            lines.setdefault((name, target), line)
    for name in sorted(known):
        if layer_of(name) is None:
            problems.append(f"{name}: in no layer; give it one in ci/import_layers.py's LAYERS")
    for (source, target), line in sorted(lines.items()):
        above, below = layer_of(source), layer_of(target)
        if above is not None and below is not None and below < above:
            problems.append(
                f"{known[source].relative_to(package)}:{line}: {source} "
                f"({LAYERS[above][0]}) imports {target}, of a higher layer ({LAYERS[below][0]})"
            )
    cycle = find_cycle(graph)
    if cycle:
        problems.append("import cycle: " + " -> ".join(cycle))
    if "--graph" in argv[1:]:
        for index, (title, _) in enumerate(LAYERS):
            print(f"{title}:")
            for name in sorted(n for n in known if layer_of(n) == index):
                targets = ", ".join(sorted(graph[name])) or "-"
                print(f"  {name} -> {targets}")
    for problem in problems:
        print(problem)
    edges = sum(map(len, graph.values()))
    print(
        f"{len(known)} modules in {len(LAYERS)} layers, {edges} imports: "
        + (f"{len(problems)} problem(s)" if problems else "no cycle, no import upward")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
