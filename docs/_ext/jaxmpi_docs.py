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
object (``jaxmpi.NAME``), and every public name's docstring must have the sections the
reference promises (parameters, result, derivative, errors, example: which ones follows
from what the name is, by the rules above `_check_api`); each gap is a warning naming
the name and the section, which the build's -W makes an error.
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

# What the reference promises of a public name follows from what the name is, by these
# rules alone (no list of names, no exception per name):
#
#   every name           a description: its docstring; a constant's `#:` comment where
#                        jaxmpi/__init__.py assigns it (an int or an Op has no docstring
#                        of its own)
#   function, method     Args naming exactly its parameters (but self and cls), where it
#                        has any; Returns, unless annotated `-> None`; an Example
#   function             Raises, where it takes parameters: what it refuses. A function of
#                        nothing has nothing to refuse; a method's failures are its
#                        object's (a freed Comm), said where they exist
#   taking or returning  Derivative: what jvp, transpose and vmap do (an annotation
#   a JAX value          naming ArrayLike, Array, Request or PyTree says it does)
#   class                an Example. Its constructor is jaxmpi's own (COMM_WORLD and
#                        Dup, isend, a failed call): its parameters are neither shown
#                        (`_hide_constructor`) nor documented
#   property             a description
#
# An Example is an mpirun block: CI runs it. A constant is exempt from all but the
# description: it has no parameters, result, errors or derivative, and the entries of the
# functions that take it show it in use.
JAX_VALUE = re.compile(r"\b(ArrayLike|Array|Request|PyTree)\b")

# The sections as napoleon renders them (conf.py's napoleon_custom_sections adds
# Derivative).
RENDERED = {
    "Returns": r"^:returns?:",
    "Raises": r"^:raises",
    "Derivative": r"^\.\. rubric:: Derivative\s*$",
    "Example": r"^\.\. rubric:: Examples?\s*$",
}


def _rendered(obj: Any, config: Any, what: str) -> str:
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    return "\n".join(GoogleDocstring(inspect.getdoc(obj) or "", config, what=what).lines())


def _example_gaps(rendered: str) -> list[str]:
    if not re.search(RENDERED["Example"], rendered, re.M):
        return ["its docstring has no Example section"]
    if not re.search(r"^\s*\.\. mpirun::", rendered, re.M):
        return ["its Example has no `.. mpirun::` block (examples run in CI)"]
    return []


def _callable_gaps(obj: Any, config: Any, method: bool) -> list[str]:
    rendered = _rendered(obj, config, "method" if method else "function")
    signature = inspect.signature(obj)
    parameters = [p for p in signature.parameters if p not in ("self", "cls")]
    named = [
        field.split()[-1].replace("\\", "").lstrip("*")
        for field in re.findall(r"^:param ([^:]+):", rendered, re.M)
    ]
    gaps = [f"its Args section does not name parameter `{p}`" for p in parameters if p not in named]
    gaps += [
        f"its Args section names `{p}`, which is no parameter" for p in named if p not in parameters
    ]
    wanted = []
    if signature.return_annotation not in (None, "None"):
        wanted.append("Returns")
    if parameters and not method:
        wanted.append("Raises")
    annotations = [p.annotation for p in signature.parameters.values()]
    if any(JAX_VALUE.search(str(a)) for a in [*annotations, signature.return_annotation]):
        wanted.append("Derivative")
    gaps += [
        f"its docstring has no {s} section"
        for s in wanted
        if not re.search(RENDERED[s], rendered, re.M)
    ]
    return gaps + _example_gaps(rendered)


def _gaps(obj: Any, config: Any, described: bool, method: bool = False) -> list[str]:
    """What the entry of a public name lacks, by the rules above. `described`: whether a
    constant has its `#:` comment."""
    if not (callable(obj) or inspect.ismodule(obj) or isinstance(obj, property)):
        return [] if described else ["no `#:` comment where jaxmpi/__init__.py assigns it"]
    if not inspect.getdoc(obj):
        return ["no docstring"]
    if inspect.isclass(obj):
        return _example_gaps(_rendered(obj, config, "class"))
    if inspect.ismodule(obj) or isinstance(obj, property):
        return []  # described; a module's functions have entries of their own
    return _callable_gaps(obj, config, method)


def _where(obj: Any) -> str:
    """The source file and line of a docstring, in the repository (python/jaxmpi/...)."""
    import jaxmpi

    try:
        target = inspect.unwrap(obj.fget if isinstance(obj, property) else obj)
        path = pathlib.Path(inspect.getsourcefile(target) or "")
        line = inspect.getsourcelines(target)[1]
        relative = path.relative_to(pathlib.Path(jaxmpi.__file__).parent)
    except (TypeError, OSError, ValueError):
        return ""
    return f"python/jaxmpi/{relative}:{line}"


def _public_objects() -> dict[str, Any]:
    """Every public name: jaxmpi.__all__, jaxmpi.distributed's, the public members of the
    public classes."""
    import jaxmpi
    import jaxmpi.distributed

    names = {f"jaxmpi.{name}": getattr(jaxmpi, name) for name in jaxmpi.__all__}
    for name in jaxmpi.distributed.__all__:
        names[f"jaxmpi.distributed.{name}"] = getattr(jaxmpi.distributed, name)
    for name, obj in list(names.items()):
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if not member.startswith("_"):
                    names[f"{name}.{member}"] = value
    return names


def _check_api(app: Sphinx, env: Any) -> None:
    """Every public name is in the reference, with the sections the rules above ask for:
    each gap is a warning (an error under -W) naming the name and the section."""
    from sphinx.pycode import ModuleAnalyzer

    documented = set(env.domains["py"].objects)
    attr_docs = ModuleAnalyzer.for_module("jaxmpi").find_attr_docs()
    comments = {name for (namespace, name) in attr_docs if not namespace}
    objects = _public_objects()
    for name, obj in objects.items():
        owner, _, short = name.rpartition(".")
        member = owner not in ("jaxmpi", "jaxmpi.distributed")
        if not member and name not in documented:
            logger.warning(
                f"{name} is public (jaxmpi.__all__) but not in the API reference: add it "
                "to a page of docs/api/",
                type="jaxmpi",
                subtype="api",
            )
        if isinstance(obj, (classmethod, staticmethod)):
            obj = getattr(objects[owner], short)
        for gap in _gaps(obj, app.config, short in comments, method=member):
            where = _where(obj)
            logger.warning(
                f"{name}: {gap}" + (f" ({where})" if where else ""),
                type="jaxmpi",
                subtype="api",
            )


def _hide_constructor(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, signature: Any, annotation: Any
) -> tuple[str, None] | None:
    """A public class is made by jaxmpi, never by users with arguments (the rules above):
    its entry shows no constructor parameters."""
    if what in ("class", "exception") and signature not in (None, "", "()"):
        return "", None
    return None


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
    app.connect("autodoc-process-signature", _hide_constructor)
    app.connect("build-finished", _write_examples)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
