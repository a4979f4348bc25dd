"""mpi4jax, as jaxmpi presents it: that release's ops over jaxmpi's (with tokens before 0.8).

`import mpi4jax` runs this file under JAXMPI_AS_MPI4JAX=<version>, so
the module has a file, a spec and a folder as a real mpi4jax's has; `jaxmpi._mpi4jax`
gives it the names that release had.
"""

from jaxmpi._mpi4jax import fill as _fill

_fill(globals())
