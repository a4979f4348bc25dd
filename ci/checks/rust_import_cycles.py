#!/usr/bin/env python3
"""ci/checks/rust_import_cycles.py -- no import circle among the files of one Rust folder.

    python3 ci/checks/rust_import_cycles.py [--graph] [--root DIR]

A folder of Rust modules (a "room": core/src/xla/hlo/, backends/src/mpi/, ...) reads one
way: if order.rs uses rewrite.rs, rewrite.rs does not use order.rs, directly or through a
third file of the folder. A circle means two files are one concern cut in two, or share a
piece that belongs in a file of its own.

Reads every tracked .rs file as text (nothing is compiled): every path that starts with
`super::`, `crate::` or `self::`, in a `use` (groups expanded) or inline in the code
(`super::p2p::wait(..)`), outside comments and strings, is resolved to the module it names.
An edge joins two files where that module lies under another file of the same folder, a
subfolder counting as one file (so abi/mpich.rs using `super::super::library` is the
edge abi -> library in the folder mpi/). A folder's own mod.rs is its door, not a member:
a path to an item of the folder itself (`super::MpiLibrary`) goes to the member the
door's `use`/`pub use` takes it from, and to no one if the door defines it.

Prints each circle (a strongly connected set of files) with one line per edge and where
it is written, and fails on any but the KNOWN ones still being taken apart; an entry of
KNOWN that no circle needs any more fails too (delete it). `--graph` prints every
folder's edges too; `--root` reads another checkout. Runs in well under a second.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

# Circles there before this check, each to be taken apart (issue #50, "Rooms" in
# ARCHITECTURE.md; none is left): a circle among some of the files of one entry passes
# with a note; a circle that spans files of no entry fails.
KNOWN: dict[str, tuple[str, ...]] = {}

Module = tuple[str, ...]  # a module's path below its crate root: ("xla", "hlo", "order")


def crate_of(path: Path) -> tuple[Path, Module] | None:
    """(the crate root's folder, the module path) of a source file, or None for a file
    that is no crate's module (build.rs, a file outside any src/)."""
    parts = path.parts
    if "src" not in parts:
        return None
    at = len(parts) - 1 - parts[::-1].index("src")
    src = Path(*parts[: at + 1])
    rest = list(parts[at + 1 :])
    if rest[:1] == ["bin"]:  # a binary: src/bin/NAME.rs or src/bin/NAME/main.rs is a root
        if len(rest) == 2:
            return src / "bin" / rest[1], ()
        src, rest = src / "bin" / rest[1], rest[2:]
    rest[-1] = rest[-1].removesuffix(".rs")
    if rest[-1] in ("mod", "lib", "main") and (len(rest) > 1 or rest[-1] != "mod"):
        rest = rest[:-1]
    return src, tuple(rest)


def strip(text: str) -> str:
    """The code without comments, string and char literals (kept as blanks, so that line
    numbers hold)."""
    out = []
    i, n = 0, len(text)
    raw = re.compile(r'r(#*)"')
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif (m := raw.match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i : i + 12])):
            out.append("' '")  # a char literal; a lifetime ('a) has no closing quote
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def blank(text: str) -> str:
    """`text` as blanks of the same length and lines."""
    return re.sub(r"[^\n]", " ", text)


def expand(tree: str) -> list[str]:
    """The paths of a use tree: "super::{a, b::{c, self}}" -> super::a, super::b::c, super::b."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))  # `a as b` names a
    depth, start, items = 0, 0, []
    brace = tree.find("{")
    if brace < 0:
        return [tree] if tree else []
    prefix, body = tree[:brace], tree[brace + 1 : tree.rindex("}")]
    for i, c in enumerate(body + ","):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    paths = []
    for item in filter(None, items):
        for path in expand(item):
            paths.append(prefix.removesuffix("::") if path == "self" else prefix + path)
    return paths


USE = re.compile(r"\b(?:pub\s*(?:\([^)]*\))?\s*)?use\s+([^;]+);")
PATH = re.compile(r"\b(?:crate|super|self)(?:\s*::\s*(?:super|self|[A-Za-z_]\w*))+")
INLINE_MOD = re.compile(r"\bmod\s+([A-Za-z_]\w*)\s*\{")
PATH_ATTRIBUTE = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*mod\s+(\w+)\s*;')
RESTRICTED = re.compile(r"\bpub\s*\(\s*(?:in\s[^)]*|crate|super|self)\s*\)")


def resolve(path: str, here: Module) -> Module | None:
    """The absolute module path a `crate::`/`super::`/`self::` path names, or None."""
    parts = [p for p in re.split(r"\s*::\s*", path.strip()) if p]
    if parts[0] == "crate":
        return tuple(parts[1:])
    at = list(here)
    for i, part in enumerate(parts):
        if part == "super":
            if not at:
                return None
            at.pop()
        elif part != "self":
            return tuple(at + parts[i:])
    return tuple(at)


def read(path: Path) -> list[tuple[Module, Module, int, str]]:
    """(the module that writes it, the module it names, line, the path as written) for
    every path of a file that starts at the crate or a module (and, for a door, every
    `use child::Item` of its own children)."""
    found = crate_of(path)
    assert found is not None
    _, module = found
    text = RESTRICTED.sub(lambda m: blank(m.group()), strip(path.read_text()))
    # Inline modules (`mod tests { use super::*; }`) shift what `super` means inside them.
    spans = []  # (start, end, name) of each inline module's body
    for m in INLINE_MOD.finditer(text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        spans.append((m.end(), j, m.group(1)))

    def module_at(offset: int) -> Module:
        inner = [name for start, end, name in spans if start <= offset < end]
        return module + tuple(inner)

    refs = []
    for m in USE.finditer(text):
        here = module_at(m.start())
        line = text.count("\n", 0, m.start()) + 1
        for used in expand(m.group(1)):
            head = used.split("::")[0]
            if head in ("crate", "super", "self"):
                target = resolve(used, here)
            elif "::" in used:  # 2018 paths: `use child::Item` names a child of this module
                target = here + tuple(used.split("::"))
            else:
                continue
            if target is not None:
                refs.append((here, target, line, used))
    rest = USE.sub(lambda m: blank(m.group()), text)  # the paths left are inline ones
    for m in PATH.finditer(rest):
        target = resolve(m.group(), module_at(m.start()))
        if target is not None:
            refs.append(
                (module_at(m.start()), target, rest.count("\n", 0, m.start()) + 1, m.group())
            )
    return refs


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[argv.index("--root") + 1]).resolve() if "--root" in argv else ROOT
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard", "*.rs"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    files: dict[tuple[Path, Module], Path] = {}  # (crate root, module) -> file
    for name in listed:
        found = crate_of(Path(name))
        if found is not None and (root / name).exists():
            files.setdefault(found, Path(name))
    # `#[path = "staged_tests.rs"] mod tests;` in staged.rs: that file is staged::tests.
    for (crate, module), path in list(files.items()):
        for m in PATH_ATTRIBUTE.finditer((root / path).read_text()):
            moved = next((k for k, v in files.items() if v == path.parent / m.group(1)), None)
            if moved is not None:
                files[(crate, (*module, m.group(2)))] = files.pop(moved)
    # A module has members (it is a folder) when another module lies directly under it.
    members: dict[tuple[Path, Module], set[str]] = defaultdict(set)
    for crate, module in files:
        if module:
            members[(crate, module[:-1])].add(module[-1])

    # Each folder's door: which member an item of the folder itself comes from.
    refs = {key: read(root / path) for key, path in files.items()}
    door: dict[tuple[Path, Module], dict[str, str]] = defaultdict(dict)
    for (crate, module), found in refs.items():
        for here, target, _, _ in found:
            if here == module and len(target) == len(module) + 2 and target[:-2] == module:
                if target[-2] in members[(crate, module)]:
                    door[(crate, module)][target[-1]] = target[-2]

    edges: dict[tuple[Path, Module], dict[tuple[str, str], list[str]]] = defaultdict(dict)
    for (crate, module), found in refs.items():
        for _, target, line, text in found:
            common = 0
            while common < min(len(module), len(target)) and module[common] == target[common]:
                common += 1
            folder = module[:common]
            if len(module) == common:  # the door itself, or a module using its own children
                continue
            source = module[common]
            if len(target) > common + 1 or (
                len(target) == common + 1 and target[common] in members[(crate, folder)]
            ):
                dest = target[common]
            elif len(target) == common + 1:
                dest = door[(crate, folder)].get(target[common], "")
            else:
                continue
            if dest and dest != source and dest in members[(crate, folder)]:
                edges[(crate, folder)].setdefault((source, dest), []).append(
                    f"{files[(crate, module)]}:{line}: {text}"
                )

    problems = 0
    unneeded = dict(KNOWN)
    for (crate, folder), found in sorted(edges.items()):
        graph: dict[str, set[str]] = defaultdict(set)
        for source, dest in found:
            graph[source].add(dest)
        where = crate.joinpath(*folder)
        if "--graph" in argv[1:]:
            print(f"{where}/:")
            for (source, dest), places in sorted(found.items()):
                print(f"  {source} -> {dest}  ({places[0]})")
        for cycle in find_cycles(graph):
            if set(cycle) <= set(KNOWN.get(str(where), ())):
                unneeded.pop(str(where), None)
                print(
                    f"known import circle in {where}/ (KNOWN, to be taken apart): {', '.join(cycle)}"
                )
                continue
            problems += 1
            print(f"import circle in {where}/: {', '.join(cycle)}")
            for (source, dest), places in sorted(found.items()):
                if source in cycle and dest in cycle:
                    print(
                        f"  {source} -> {dest}: {places[0]}"
                        + (f" (+{len(places) - 1} more)" if len(places) > 1 else "")
                    )
    for where in unneeded:
        problems += 1
        print(f"{where}/ has no import circle any more: delete its entry in KNOWN")
    print(
        f"{len(files)} Rust modules in {len(edges)} folders, "
        f"{sum(map(len, edges.values()))} imports between files of a folder: "
        + (f"{problems} circle(s)" if problems else "no circle")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
