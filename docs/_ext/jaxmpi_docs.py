"""Sphinx extension of jaxmpi's documentation: examples that CI runs, and an API
reference that cannot silently miss a public name.

``mpirun`` directive -- a Python block that ``ci/docs_examples.py`` runs under
``mpirun -n RANKS`` (default 2), the blocks of a page in page order, in one namespace::

    ```{mpirun}
    :ranks: 2                  (optional)
    :env: JAXMPI_CHECK=1       (optional: the job's environment; NAME=VALUE ...)
    :process: own              (optional: not shared with other pages' blocks)
    import jaxmpi
    print(jaxmpi.COMM_WORLD.Get_rank())
    ```

``output`` directive -- what the mpirun block just before it prints: every line of rank
0, then every line of rank 1, and so on (each rank's lines in order). ``...`` in a line
matches any text (as doctest's ELLIPSIS). A block without an output directive must print
nothing.

Both also work in docstrings (``.. mpirun::`` / ``.. output::``). A Python block that is
neither run nor marked ``:class: fragment`` (a piece of a program, shown on purpose
without running) is a warning, as is a doctest block: an example that CI does not run
can drift from the code. The build writes every example to ``_examples.json`` in the
output folder.

At the end of the build every name in ``jaxmpi.__all__`` must be documented as a Python
object (``jaxmpi.NAME``), else a warning; and ``api-gaps.txt`` (next to the output
folder) lists the public names whose docstrings lack a section the reference promises
(parameters, result, derivative, errors, example).
"""

from __future__ import annotations

import inspect
import json
import pathlib
import re
from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.directives.code import container_wrapper
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

PYTHON = {"python", "python3", "py", "ipython", "pycon"}
ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*")


def _examples(env: Any) -> dict[str, list[dict]]:
    if not hasattr(env, "jaxmpi_examples"):
        env.jaxmpi_examples = {}
    return env.jaxmpi_examples


class Mpirun(SphinxDirective):
    has_content = True
    optional_arguments = 1  # the language, for readers of the Markdown source
    option_spec: ClassVar[dict[str, Any]] = {
        "ranks": directives.positive_int,
        "env": directives.unchanged,
        "process": directives.unchanged,
    }

    def run(self) -> list[nodes.Node]:
        language = self.arguments[0] if self.arguments else "python"
        if language not in PYTHON:
            raise self.error(f"mpirun blocks are Python, not {language!r}")
        env_words = self.options.get("env", "").split()
        bad = [w for w in env_words if not ENV_WORD.fullmatch(w)]
        if bad:
            raise self.error(f":env: takes NAME=VALUE words, got {' '.join(bad)}")
        ranks = self.options.get("ranks", 2)
        code = "\n".join(self.content)
        literal = nodes.literal_block(code, code, language="python", classes=["jaxmpi-run"])
        self.set_source_info(literal)
        source, line = self.get_source_info()
        _examples(self.env).setdefault(self.env.docname, []).append(
            {
                "doc": self.env.docname,
                "source": source,
                "line": line,
                "ranks": ranks,
                "env": env_words,
                "process": self.options.get("process", ""),
                "code": code,
                "output": None,
            }
        )
        caption = " ".join([*env_words, f"mpirun -n {ranks} python"])
        return [container_wrapper(self, literal, caption)]


class Output(SphinxDirective):
    has_content = True

    def run(self) -> list[nodes.Node]:
        runs = _examples(self.env).get(self.env.docname, [])
        if not runs or runs[-1]["output"] is not None:
            raise self.error("an output block must follow an mpirun block (one per block)")
        text = "\n".join(self.content)
        runs[-1]["output"] = text
        literal = nodes.literal_block(text, text, language="text", classes=["jaxmpi-output"])
        self.set_source_info(literal)
        ranks = runs[-1]["ranks"]
        caption = (
            "output"
            if ranks == 1
            else "output: rank 0's lines, then rank 1's" + ("" if ranks == 2 else ", ...")
        )
        return [container_wrapper(self, literal, caption)]


def _unrun_examples(app: Sphinx, doctree: nodes.document) -> None:
    """Python shown to readers must run in CI, or say it is a fragment."""
    for node in doctree.findall(nodes.literal_block):
        classes = node.get("classes", [])
        if node.get("language") in PYTHON and not {"jaxmpi-run", "fragment"} & set(classes):
            logger.warning(
                "a Python block that CI does not run: make it an mpirun block (with an "
                "output block if it prints), or mark it `:class: fragment`",
                location=node,
                type="jaxmpi",
                subtype="unrun",
            )
    for node in doctree.findall(nodes.doctest_block):
        logger.warning(
            "a doctest block (>>>): CI does not run these; use `.. mpirun::` and `.. output::`",
            location=node,
            type="jaxmpi",
            subtype="unrun",
        )


def _purge(app: Sphinx, env: Any, docname: str) -> None:
    _examples(env).pop(docname, None)


def _merge(app: Sphinx, env: Any, docnames: set[str], other: Any) -> None:
    for docname in docnames:
        if docname in _examples(other):
            _examples(env)[docname] = _examples(other)[docname]


# --------------------------------------------------------------------------- the API


# Sections the reference promises for each public name, as napoleon renders them.
# Ops: every array-moving function; each has a derivative rule to state.
OPS = {
    "after", "allgather", "allgatherv", "allreduce", "alltoall", "alltoallv", "barrier",
    "bcast", "exscan", "gather", "gatherv", "irecv", "isend", "ragged_all_to_all", "recv",
    "reduce", "reduce_scatter", "scan", "scatter", "scatterv", "send", "sendrecv", "wait",
    "waitall",
}  # fmt: skip


def _sections(obj: Any, config: Any) -> set[str]:
    """The sections napoleon finds in obj's docstring: parameters, result, errors,
    example, derivative."""
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    doc = inspect.getdoc(obj) or ""
    rendered = "\n".join(GoogleDocstring(doc, config, what="function").lines())
    found = set()
    if re.search(r"^:(param|parameter|arg|keyword) ", rendered, re.M):
        found.add("parameters")
    if re.search(r"^:(returns|return|rtype|yields):", rendered, re.M):
        found.add("result")
    if re.search(r"^:raises", rendered, re.M):
        found.add("errors")
    if re.search(r"^\.\. rubric:: Examples?\s*$|^\.\. (mpirun|output)::", rendered, re.M):
        found.add("example")
    if re.search(r"^\.\. rubric:: Derivatives?\s*$|^:Derivatives?:", rendered, re.M):
        found.add("derivative")
    return found


def _wanted(name: str, obj: Any, method: bool = False) -> list[str]:
    if inspect.ismodule(obj):
        return []  # its functions are listed on their own
    if inspect.isclass(obj):
        return ["example"]
    if not callable(obj):
        return ["a `#:` comment in jaxmpi/__init__.py (no docstring is possible)"]
    signature = inspect.signature(obj)
    wanted = []
    if [p for p in signature.parameters if p not in ("self", "cls", "token")]:
        wanted.append("parameters")
    if signature.return_annotation not in (None, "None"):
        wanted.append("result")
    if not method:  # a method's class has the example; the errors are the class's
        wanted += ["errors", "example"]
    if name in OPS:
        wanted.append("derivative")
    return wanted


def _gaps(name: str, obj: Any, config: Any, method: bool = False) -> list[str]:
    """The line `NAME: what its docstring lacks`, or nothing."""
    wanted = _wanted(name.rsplit(".", 1)[1], obj, method)
    if callable(obj) or inspect.isclass(obj):
        missing = [] if inspect.getdoc(obj) else ["docstring"]
        missing += [s for s in wanted if s not in _sections(obj, config)]
    else:
        missing = wanted
    return [f"{name}: {', '.join(missing)}"] if missing else []


def _public_objects() -> dict[str, Any]:
    import jaxmpi
    import jaxmpi.distributed

    names = {f"jaxmpi.{name}": getattr(jaxmpi, name) for name in jaxmpi.__all__}
    for name in jaxmpi.distributed.__all__:
        names[f"jaxmpi.distributed.{name}"] = getattr(jaxmpi.distributed, name)
    return names


def _check_api(app: Sphinx, env: Any) -> None:
    documented = set(env.domains["py"].objects)
    gaps = []
    for name, obj in _public_objects().items():
        if name not in documented:
            logger.warning(
                f"{name} is public (jaxmpi.__all__) but not in the API reference: add it "
                "to a page of docs/api/",
                type="jaxmpi",
                subtype="api",
            )
        gaps += _gaps(name, obj, app.config)
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if not member.startswith("_") and callable(value):
                    gaps += _gaps(f"{name}.{member}", value, app.config, method=True)
    report = pathlib.Path(app.outdir).parent / "api-gaps.txt"
    report.write_text("".join(line + "\n" for line in gaps))


def _write_examples(app: Sphinx, error: Exception | None) -> None:
    if error is not None or app.builder.format != "html":
        return
    every = [run for doc in sorted(_examples(app.env)) for run in _examples(app.env)[doc]]
    (pathlib.Path(app.outdir) / "_examples.json").write_text(json.dumps(every, indent=1))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("mpirun", Mpirun)
    app.add_directive("output", Output)
    app.connect("doctree-read", _unrun_examples)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-check-consistency", _check_api)
    app.connect("build-finished", _write_examples)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
