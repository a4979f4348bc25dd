"""jaxmpi's startup hook: what must happen before a program imports anything. jaxmpi's wheel
installs it with a .pth file, which Python runs at every start in the environment; each
part costs nothing where it does not apply (about a millisecond in all, measured).

JAX's own collectives over MPI. jaxlib carries MPItrampoline, which dlopens the library
named by MPITRAMPOLINE_LIB when jax is imported and sends XLA's MPI calls (JAX's own
collectives, with `jax_cpu_collectives_implementation="mpi"`) there. jaxmpi's extension
module is such a library, but most programs import jax before jaxmpi: `install()` puts a
finder ahead of every other that, when jax (or jaxlib) is first imported, sets
MPITRAMPOLINE_LIB to the extension module of the jaxmpi that `import jaxmpi` will give.
It decides then, not while the .pth file runs: Python is still building sys.path at that
point, and a jax in a site directory processed later (jaxmpi in the user site and jax in
the interpreter's, a venv made with --system-site-packages, site directories layered by
another .pth file) would not be found yet. Loading the module at `import jax` runs none of
its code and loads no MPI: programs that never use MPI collectives are untouched
(`jaxmpi.distributed.initialize` chooses MPI or gloo). jaxmpi's own import calls
`install()` too, for a jaxmpi imported before jax from a source tree. Nothing is set where
MPITRAMPOLINE_LIB is set when jax is imported (the user's plug-in wins), or where the jaxlib
it imports is not one whose MPItrampoline jaxmpi's plug-in was checked against (a newer one
could resolve names the plug-in lacks, and MPItrampoline ends the process at `import jax`
when it cannot).

The mpi4jax name. With JAXMPI_AS_MPI4JAX=<version> set, `import mpi4jax` gives jaxmpi
presenting that mpi4jax release (`jaxmpi._mpi4jax`), whether or not mpi4jax is installed:
a finder ahead of every other. Unset, nothing is installed.
"""

from __future__ import annotations

import os
import sys

# jaxlib minor releases whose MPItrampoline (5.3.1: MPI ABI 2.9, 634 names) the plug-in
# implements, checked by ci/xla_plugin_contract.py; keep the newest in step with
# jaxmpi._runtime.support.NEWEST_TESTED.
CHECKED_JAXLIB = ((0, 6), (0, 12))


def _jaxlib_version(folder: str) -> tuple[int, int] | None:
    """(major, minor) from jaxlib's version.py, read as text: importing jaxlib is not free."""
    try:
        with open(os.path.join(folder, "version.py"), encoding="utf-8") as source:
            for line in source:
                if line.startswith("_version"):
                    text = line.split("=", 1)[1].strip().strip("'\"")
                    major, minor = text.split(".")[:2]
                    return int(major), int(minor)
    except (OSError, ValueError):
        pass
    return None


def _package(name: str, beside: str | None) -> str | None:
    """The folder of top-level package `name`, found without importing it: in `beside` where
    given, else the one `import name` gives (imported already, or found on sys.path now)."""
    if beside is not None:
        folder = os.path.join(beside or ".", name)
        return folder if os.path.isfile(os.path.join(folder, "__init__.py")) else None
    module = sys.modules.get(name)
    if module is not None:
        path = getattr(module, "__file__", None)
        return os.path.dirname(path) if path else None
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations), None)


def plugin(beside: str | None = None) -> str | None:
    """jaxmpi's extension module, the plug-in (of the jaxmpi `_package` finds), resolved to
    the file the loader sees: a copy or another path to it would be another library."""
    folder = _package("jaxmpi", beside)
    if folder is None:
        return None
    wheel = os.path.join(folder, "_native.abi3.so")  # what maturin names it
    if os.path.isfile(wheel):
        return os.path.realpath(wheel)
    for name in sorted(os.listdir(folder)):  # a source build may name it for one Python
        if name.startswith("_native.") and name.endswith(".so"):
            return os.path.realpath(os.path.join(folder, name))
    return None


def checked_jaxlib(beside: str | None = None) -> bool:
    """Whether the jaxlib `_package` finds is one the plug-in's contract was checked
    against."""
    folder = _package("jaxlib", beside)
    version = _jaxlib_version(folder) if folder else None
    return version is not None and CHECKED_JAXLIB[0] <= version <= CHECKED_JAXLIB[1]


def decide() -> None:
    """Sets MPITRAMPOLINE_LIB to jaxmpi's plug-in, unless it is set or cannot work."""
    if "MPITRAMPOLINE_LIB" in os.environ:
        return
    path = plugin()
    if path is not None and checked_jaxlib():
        os.environ["MPITRAMPOLINE_LIB"] = path


class AtImportJax:
    """A finder that finds nothing: asked for jax or jaxlib (whichever comes first), it
    leaves sys.meta_path and calls `decide`, before jaxlib can load MPItrampoline."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "jax" or name == "jaxlib":
            try:
                sys.meta_path.remove(AtImportJax)
            except ValueError:
                pass  # another thread's import got here first
            else:
                decide()
        return None


def install() -> None:
    """MPITRAMPOLINE_LIB decided at the first `import jax`, where it can still take
    effect (not once jax or jaxlib is imported)."""
    if "jax" in sys.modules or "jaxlib" in sys.modules or AtImportJax in sys.meta_path:
        return
    sys.meta_path.insert(0, AtImportJax)


class Mpi4jaxFinder:
    """Finds `mpi4jax` and its submodules before any other finder: the files of
    `jaxmpi._mpi4jax` for the release JAXMPI_AS_MPI4JAX names (which also refuses a bad
    value, or a module that release did not have, at the import)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "mpi4jax" and not name.startswith("mpi4jax."):
            return None
        from jaxmpi import _mpi4jax

        return _mpi4jax.spec(name, os.environ.get("JAXMPI_AS_MPI4JAX", ""))


def present_mpi4jax() -> None:
    """With JAXMPI_AS_MPI4JAX set, `import mpi4jax` finds jaxmpi from now on."""
    if os.environ.get("JAXMPI_AS_MPI4JAX", "").strip() and Mpi4jaxFinder not in sys.meta_path:
        sys.meta_path.insert(0, Mpi4jaxFinder)


install()
present_mpi4jax()
