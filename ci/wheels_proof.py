"""The README's example with its results checked: one jitted step with an allreduce and a
sendrecv around the ring. ci/wheels_proof.sh runs it at 2 ranks where a release wheel
claims to run; exit status 1 on a wrong result."""

import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi

rank, size = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()


@jax.jit
def step(x):
    total = jaxmpi.allreduce(x, jaxmpi.SUM)
    right = jaxmpi.sendrecv(x, x, source=(rank - 1) % size, dest=(rank + 1) % size)
    return total, right


total, right = step(jnp.full(3, float(rank)))
ok = np.array_equal(total, np.full(3, float(sum(range(size))))) and np.array_equal(
    right, np.full(3, float((rank - 1) % size))
)
print(
    f"rank {rank}/{size}: allreduce {np.asarray(total)} sendrecv {np.asarray(right)} "
    f"{'ok' if ok else 'WRONG'} ({platform.machine()}, glibc {platform.libc_ver()[1]}, "
    f"Python {platform.python_version()}, jax {jax.__version__})"
)
sys.exit(0 if ok else 1)
