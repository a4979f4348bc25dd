"""The supported JAX range: the rule (with given versions) and the real import path (in a
fresh process whose JAX claims another version)."""

from __future__ import annotations

import jax
import pytest
from test_startup import rank_0_only, run_alone

from jaxmpi._runtime import support as _support

# JAX versions, checked at import, whatever the MPI.
pytestmark = [pytest.mark.same_on_every_mpi, pytest.mark.same_at_every_size]


def test_release_numbers():
    assert _support.release("0.12.0.1") == (0, 12, 0, 1)
    assert _support.release("0.6.2") == (0, 6, 2)
    assert _support.release("0.13.0.dev20261101") == (0, 13, 0)
    assert _support.release("0.7.0rc1") == (0, 7, 0)
    with pytest.raises(ValueError, match="not a version number"):
        _support.release("latest")


@pytest.mark.parametrize(
    "version", ["0.6.2", "0.7.1", "0.10.2", "0.11.2", "0.12.0", "0.12.0.1", "0.12.1"]
)
def test_versions_in_the_range_pass_silently(version):
    assert _support.check_jax(version) is None


@pytest.mark.parametrize("version", ["0.6.1", "0.6.0", "0.5.3", "0.4.38"])
def test_older_versions_are_refused_saying_what_to_install(version):
    with pytest.raises(ImportError) as err:
        _support.check_jax(version)
    message = str(err.value)
    assert f"JAX {version} is installed" in message
    assert f"0.6.2 to {_support.NEWEST_TESTED}" in message
    assert 'pip install "jax>=0.6.2"' in message


@pytest.mark.parametrize("version", ["0.12.1.1", "0.12.2", "0.13.0.dev20261101", "1.0"])
def test_newer_versions_warn_naming_both(version):
    message = _support.check_jax(version)
    assert message is not None
    assert f"JAX {version} is newer" in message
    assert f"({_support.NEWEST_TESTED})" in message


def test_the_installed_jax_is_in_the_tested_range():
    # Every CI cell's JAX must be covered: a newer pin in ci/setup.sh needs NEWEST_TESTED
    # (and the README) raised with it.
    assert _support.check_jax(jax.__version__) is None, jax.__version__


@rank_0_only
def test_import_refuses_an_old_jax_before_touching_it():
    result = run_alone(
        "import jax; jax.__version__ = '0.6.1'\n"
        "try:\n"
        "    import jaxmpi\n"
        "except ImportError as err:\n"
        "    print('REFUSED', err)\n"
    )
    assert "REFUSED jaxmpi needs JAX 0.6.2 or newer, but JAX 0.6.1" in result.stdout, (
        result.stdout + result.stderr
    )


@rank_0_only
def test_import_warns_once_under_a_newer_jax_and_works():
    result = run_alone(
        "import warnings\n"
        "import jax; jax.__version__ = '0.99.0'\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import jaxmpi  # the import line the warning points at\n"
        "ours = [w for w in caught if issubclass(w.category, jaxmpi._runtime.support.UntestedJaxWarning)]\n"
        "print('WARNINGS', len(ours), ours[0].filename == '<string>', ours[0].message)\n"
        "print('OK', jaxmpi.allreduce(jax.numpy.ones(2), jaxmpi.SUM).tolist())\n"
    )
    out = result.stdout
    assert "WARNINGS 1 True JAX 0.99.0 is newer" in out, out + result.stderr
    assert "OK [1.0, 1.0]" in out, out + result.stderr


@rank_0_only
def test_info_shows_the_supported_range():
    result = run_alone(
        "import runpy, sys; sys.argv = ['jaxmpi', 'info']; runpy.run_module('jaxmpi', run_name='__main__')"
    )
    assert f"(jaxmpi supports 0.6.2 to {_support.NEWEST_TESTED}" in result.stdout, (
        result.stdout + result.stderr
    )
