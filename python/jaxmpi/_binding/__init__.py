"""The JAX binding: the layer between the public API (`jaxmpi/`) and the process runtime
(`_runtime/`). It makes MPI ops JAX primitives and teaches JAX to run them:

- `primitives.py`: every op as a primitive, one row each, lowered to its XLA FFI handler
  (which it registers);
- `rules/`: every primitive's JVP, transpose and batching rule, one row each, by op family;
- `dispatch.py`: how jitted programs holding MPI ops are dispatched (fast or ordered);
- `placement.py`: where an op may run in a program over several devices;
- `requests.py`: a wait outside jit, and requests never waited for refused;
- `jax_collectives.py`: which route JAX's collectives take (jaxmpi's pass, XLA's MPI
  backend through jaxmpi's plug-in, or gloo);
- `jax_shim.py`: every use of JAX's private internals, and nothing else.

The public API binds primitives after checking what users pass; rules bind primitives
too, never the public functions. This file imports nothing.
"""
