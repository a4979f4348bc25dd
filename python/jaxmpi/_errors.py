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
    """Turns the error JAX raises for a failed jaxmpi call into `jaxmpi.MPIError`.

    A context manager and a decorator. Eager ops and `Comm` methods raise `MPIError`
    themselves, but inside your own `jax.jit` function JAX raises its own exception for
    a failed MPI call (`JaxRuntimeError`, or a `ValueError` when JAX re-runs a compiled
    function): wrap the call in it to get the `MPIError`, with its attributes. Other
    exceptions pass through unchanged. On leaving without an exception, outside of
    tracing, it raises a failure kept since an earlier op whose result nobody read (fast
    dispatch: a send, say).

    Raises:
        MPIError: A jaxmpi call inside failed, or an earlier one's failure was kept.

    Example:
        .. mpirun::

            import jax
            import jax.numpy as jnp
            import jaxmpi

            rank = jaxmpi.COMM_WORLD.Get_rank()

            @jax.jit
            def step(x):
                if rank == 0:
                    jaxmpi.send(jnp.ones(4), dest=1, tag=21)  # 2 more than rank 1 takes
                    return x
                return jaxmpi.recv(x, source=0, tag=21)

            try:
                with jaxmpi.raise_mpi_errors():
                    jax.block_until_ready(step(jnp.zeros(2)))
            except jaxmpi.MPIError as err:
                print(f"rank {err.rank}: {err.op} failed")

        .. output::

            rank 1: recv failed
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
