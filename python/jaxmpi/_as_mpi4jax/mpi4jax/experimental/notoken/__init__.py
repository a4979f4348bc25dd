"""mpi4jax.experimental.notoken, as jaxmpi presents it: 0.4 to 0.6's token-free ops.

`import mpi4jax.experimental.notoken` runs this file under JAXMPI_AS_MPI4JAX=<version>, so
the module has a file, a spec and a folder as a real mpi4jax's has; `jaxmpi._mpi4jax`
gives it the names that release had.
"""

from jaxmpi._mpi4jax import fill as _fill

_fill(globals())
