"""Which JAX versions jaxmpi supports, checked at import before anything reaches into JAX.

jaxmpi uses private JAX (all of it in `_binding/jax_shim.py`), so a JAX outside the range below
can fail in ways that say nothing about versions. Older than OLDEST: refused with a
message saying what to install. Newer than NEWEST_TESTED: a warning, since it may work.
NEWEST_TESTED is the newest JAX that ./ci/test.sh runs the test suite on (ci/setup.sh
pins it); the README states the same range.
"""

from __future__ import annotations

import re
import warnings

# 0.6.0/0.6.1 drop MPI calls whose results a rank does not use when they differentiate
# (jax._src.effects.partial_eval_kept_effects arrived in 0.6.2).
OLDEST = "0.6.2"
NEWEST_TESTED = "0.12.1"
SUPPORTED = f"{OLDEST} to {NEWEST_TESTED}, the newest tested"


class UntestedJaxWarning(UserWarning):
    """The installed JAX is newer than any jaxmpi was tested with."""


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: "0.12.0.1" -> (0, 12, 0, 1). A pre- or
    dev-release ("0.13.0.dev20261101", "0.7.0rc1") counts as its release."""
    match = re.match(r"\d+(\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"not a version number: {version!r}")
    return tuple(int(part) for part in match.group().split("."))


def check_jax(version: str) -> str | None:
    """None when `version` is in the tested range; the warning text when it is newer.
    Raises ImportError when it is older than OLDEST."""
    if release(version) < release(OLDEST):
        raise ImportError(
            f"jaxmpi needs JAX {OLDEST} or newer, but JAX {version} is installed "
            f'(supported: {SUPPORTED}). Upgrade it: pip install "jax>={OLDEST}"'
        )
    if release(version) > release(NEWEST_TESTED):
        return (
            f"JAX {version} is newer than the newest JAX jaxmpi was tested with "
            f"({NEWEST_TESTED}); jaxmpi uses private JAX internals, so if something fails, "
            f'try pip install "jax=={NEWEST_TESTED}" and please report it'
        )
    return None


def _check_installed() -> None:
    import jax

    message = check_jax(jax.__version__)
    if message is not None:
        # Frames: here, this module, jaxmpi/__init__ (importlib's own are skipped), then
        # the user's `import jaxmpi`, where the warning points.
        warnings.warn(message, UntestedJaxWarning, stacklevel=4)


_check_installed()
