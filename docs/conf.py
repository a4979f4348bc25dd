"""Sphinx configuration of jaxmpi's documentation (built by ci/docs.sh)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent / "_ext"))

import jaxmpi  # the API reference is read from the installed package

project = "jaxmpi"
author = "the jaxmpi developers"
copyright = "the jaxmpi developers"
release = version = jaxmpi.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",  # the summary tables of api/index.md (no generated pages)
    "sphinx.ext.napoleon",
    "myst_parser",
    "jaxmpi_docs",  # _ext/: mpirun and output blocks, the API's completeness
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Markdown: anchors for headings up to ###, so links like page.md#a-heading resolve (and
# a broken one is a warning, which -W makes an error).
myst_heading_anchors = 3
myst_enable_extensions = ["deflist"]

# The API from the docstrings, read through the public names (jaxmpi.sendrecv, never
# jaxmpi._ops.sendrecv), so that moving code between private modules changes nothing.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# The package's aliases of Any (mpi4py is optional; a pytree has no type) shown as what
# they accept. (An alias inside a union or a generic, `Comm | None`, renders as Sphinx's
# internal TypeAliasForwardRef(...): only whole annotations are aliased.)
autodoc_type_aliases = {
    "ArrayLike": "jax.typing.ArrayLike",
    "CommArg": "jaxmpi.Comm | mpi4py.MPI.Intracomm",
    "OpArg": "jaxmpi.Op | mpi4py.MPI.Op",
    "StatusArg": "mpi4py.MPI.Status",
    "Counts": "Sequence[int] | jax.typing.ArrayLike",
    "PyTree": "PyTree",
}
autosummary_generate = False  # summary tables only, no stub pages
# `x` in a docstring is code, as in the Markdown pages.
default_role = "literal"
# Google-style sections; "Derivative:" for the rule each op's JVP and transpose follow.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = ["Derivative"]
napoleon_use_ivar = True  # Attributes: one compact field list (MPIError's)

html_theme = "furo"
html_title = f"jaxmpi {release}"
html_static_path = ["_static"]
html_css_files = ["jaxmpi.css"]
html_show_sourcelink = False
pygments_style = "friendly"
