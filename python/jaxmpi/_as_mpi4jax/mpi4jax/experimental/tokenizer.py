"""mpi4jax.experimental.tokenizer, as jaxmpi presents it: 0.3.7 to 0.3.15's auto_tokenize.

`import mpi4jax.experimental.tokenizer` runs this file under JAXMPI_AS_MPI4JAX=<version>, so
the module has a file, a spec and a folder as a real mpi4jax's has; `jaxmpi._mpi4jax`
gives it the names that release had.
"""

from jaxmpi._mpi4jax import fill as _fill

_fill(globals())
