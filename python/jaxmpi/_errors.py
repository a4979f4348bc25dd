"""`jaxmpi.raise_mpi_errors`: what JAX raises for a failed jaxmpi call, as the
`jaxmpi.MPIError` it stands for. The exception itself is the runtime's
(`_runtime/errors.py`: the extension raises it from initialization on); this is the part
that must know whether JAX is tracing."""

from __future__ import annotations

import contextlib
from typing import Literal

from ._binding import jax_shim
from ._runtime.errors import MPIError, raise_kept_failure


class raise_mpi_errors(contextlib.ContextDecorator):
    """Turns what JAX raises for a failed jaxmpi call into `jaxmpi.MPIError`:

        @jaxmpi.raise_mpi_errors()
        def step(x): return jitted_step(x)

        with jaxmpi.raise_mpi_errors():
            y = jitted_step(x)

    Other exceptions pass through unchanged. Leaving it without an exception, outside of
    tracing, raises a failure kept since an earlier op nobody could read (fast dispatch):
    every jaxmpi op and `Comm` method is wrapped in it, so the next one reports it.
    """

    def __enter__(self) -> raise_mpi_errors:
        return self

    def __exit__(
        self, exc_type: object, exc: BaseException | None, traceback: object
    ) -> Literal[False]:
        if exc is None and not jax_shim.is_tracing():
            raise_kept_failure()
        if exc is None or isinstance(exc, MPIError):
            return False
        error = MPIError.from_exception(exc)
        if error is None:
            return False
        raise error.with_traceback(traceback) from None
