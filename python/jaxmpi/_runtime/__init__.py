"""The process runtime: the bottom layer of the package, below the JAX binding
(`_binding/`) and the public API (`jaxmpi/`). It knows MPI and the extension module
(`jaxmpi._native`), and of JAX only its public API:

- `support.py`: the JAX versions jaxmpi supports, checked first of all;
- `library.py`: the MPI library chosen, initialized and finalized; `info`;
- `agree.py`: the settings every rank must share, compared once;
- `gpu_choice.py`: the rule choosing this rank's GPU, applied before MPI_Init;
- `gpu.py`: this rank's GPU, where jaxlib has CUDA, checked after MPI_Init; `cuda`;
- `errors.py`: `MPIError`, which the extension raises, and failures kept for later;
- `encodings.py`: the values the handlers read for peers, tags and reductions.

Importing `library` (or `gpu`) initializes MPI; this file imports nothing, so that
`support` runs before it.
"""
