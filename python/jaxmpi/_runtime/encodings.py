"""The values the handlers read for peers, tags and reductions, as the extension declares
them (core/src/xla/frame/attributes.rs): the same in every MPI library, unlike MPI's own
ANY_SOURCE, PROC_NULL and ANY_TAG (`jaxmpi._comm`). The public API encodes what users pass
into them; the JAX binding's rules read them back."""

from __future__ import annotations

from .. import _native

_ENCODINGS = _native.constants()
PEER_ANY: int = _ENCODINGS["PEER_ANY"]
PEER_NULL: int = _ENCODINGS["PEER_NULL"]
TAG_ANY: int = _ENCODINGS["TAG_ANY"]
OP_USER: int = _ENCODINGS["OP_USER"]

#: The predefined reductions by name (SUM, ...); a reduction's code is its index here.
PREDEFINED_OPS: list[str] = _native.reduce_ops()
