"""Every use of JAX's private internals, in one place.

jaxmpi needs three things JAX has no public API for: an ordered effect (so MPI calls keep
program order on every rank without user-visible tokens), the default eager
implementation of a primitive, and a lowering that threads the effect's token through an
XLA FFI call. Each is written here once, for every supported JAX (0.6.2 to the newest).
"""

from __future__ import annotations

from functools import partial

import jax
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
from jax.interpreters import ad as _ad
from jax.interpreters import batching as _batching
from jax.interpreters import mlir

try:  # public since JAX 0.4.32
    from jax.extend.core import Primitive
except ImportError:  # pragma: no cover - older JAX is not supported anyway
    from jax.core import Primitive

ShapedArray = _core.ShapedArray
abstract_token = _core.abstract_token


class MpiEffect(_effects.Effect):
    """The side effect of an MPI call: ordered, allowed in control flow, AD and remat."""

    def __str__(self) -> str:
        return "jaxmpi"

    __repr__ = __str__


effect = MpiEffect()
for _registry in (
    _effects.lowerable_effects,
    _effects.ordered_effects,
    _effects.control_flow_allowed_effects,
    _effects.custom_derivatives_allowed_effects,
    _effects.remat_allowed_effects,
    # Without this, linearization drops an MPI call whose result a rank does not use (a
    # send's tangent has no result at all), and the ranks' derivative programs would no
    # longer make the same calls. It exists from JAX 0.6.2 on: the oldest we support.
    _effects.partial_eval_kept_effects,
):
    _registry.add_type(MpiEffect)


def new_primitive(name: str, abstract_eval) -> Primitive:
    """A multiple-results primitive carrying the MPI effect, executed eagerly through a
    one-op jit like any JAX primitive."""
    primitive = Primitive(name)
    primitive.multiple_results = True
    primitive.def_impl(partial(_dispatch.apply_primitive, primitive))
    primitive.def_effectful_abstract_eval(
        lambda *avals, **params: (abstract_eval(*avals, **params), {effect})
    )
    return primitive


def lower_ordered_ffi_call(ctx, target: str, operands, attributes: dict, aliases: dict):
    """Lowers to the XLA FFI call `target`, with the effect's token as the last operand and
    result, so XLA keeps MPI calls in program order across the whole program."""
    rule = jax.ffi.ffi_lowering(
        target, operand_output_aliases=aliases or None, has_side_effect=True
    )
    with_token = ctx.replace(
        avals_in=[*ctx.avals_in, abstract_token],
        avals_out=[*ctx.avals_out, abstract_token],
    )
    *results, token_out = rule(with_token, *operands, ctx.tokens_in.get(effect), **attributes)
    ctx.set_tokens_out(mlir.TokenSet({effect: token_out}))
    return results


def register_lowering(primitive: Primitive, rule, platform: str) -> None:
    mlir.register_lowering(primitive, rule, platform=platform)


def register_ffi_target(name: str, capsule, platform: str) -> None:
    jax.ffi.register_ffi_target(name, capsule, platform=platform, api_version=1)


# --- Autodiff and batching rules ----------------------------------------------------------
# jax.interpreters.ad/batching are JAX's rule registries; their signatures have changed
# between releases, so rules are registered only through these functions.


def def_jvp(primitive: Primitive, rule) -> None:
    """`rule(primals, tangents, **params) -> (primal_outs, tangent_outs)`; tangents are
    materialized (no symbolic zeros reach the rule)."""

    def jvp(primals, tangents, **params):
        return rule(primals, [_ad.instantiate_zeros(t) for t in tangents], **params)

    _ad.primitive_jvps[primitive] = jvp


def def_transpose(primitive: Primitive, rule) -> None:
    """`rule(cotangents, *args, **params) -> one cotangent (or None) per arg`, with the
    cotangents materialized and `is_linear(arg)` telling the inputs being transposed."""

    def transpose(cotangents, *args, **params):
        return rule([_ad.instantiate_zeros(ct) for ct in cotangents], *args, **params)

    _ad.primitive_transposes[primitive] = transpose


def is_linear(arg) -> bool:
    """Whether `arg` is an input a transpose rule must produce a cotangent for."""
    return _ad.is_undefined_primal(arg)


def aval_of(arg):
    """The abstract value of an argument of a transpose rule."""
    return arg.aval


def def_batching(primitive: Primitive, rule) -> None:
    """`rule(args, batch_dims, **params) -> (outs, out_batch_dims)`."""
    _batching.primitive_batchers[primitive] = rule


def pass_tokens_through(ctx) -> None:
    """For a lowering that makes no MPI call: the program order token flows on."""
    ctx.set_tokens_out(ctx.tokens_in)


def has_cuda_plugin() -> bool:
    """Whether this jaxlib can run on CUDA GPUs (a CUDA PJRT plugin is installed)."""
    import importlib.util

    names = (
        "jax_cuda12_plugin",
        "jax_cuda13_plugin",
        "jax_plugins.xla_cuda12",
        "jax_plugins.xla_cuda13",
    )
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except ModuleNotFoundError:
            continue
    return False


def use_only_gpu(ordinal: int) -> None:
    """Makes JAX use GPU `ordinal` alone (effective before JAX starts its GPU client)."""
    jax.config.update("jax_cuda_visible_devices", str(ordinal))


def lower_ordered_ffi_call_of(ctx, kept, target: str, operands, attributes: dict, aliases):
    """`lower_ordered_ffi_call` passing XLA only the operands at the indices `kept`: the
    others (receive templates) exist for JAX's rules but never reach the compiled call, so
    XLA neither computes nor keeps them. `aliases` index the kept operands."""
    inner = ctx.replace(avals_in=[ctx.avals_in[i] for i in kept], tokens_out=None)
    results = lower_ordered_ffi_call(
        inner, target, [operands[i] for i in kept], attributes, aliases
    )
    ctx.set_tokens_out(inner.tokens_out)
    return results
