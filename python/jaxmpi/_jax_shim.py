"""Every use of JAX's private internals, in one place.

jaxmpi needs three things JAX has no public API for: an ordered effect (so MPI calls keep
program order on every rank without user-visible tokens), the default eager
implementation of a primitive, and a lowering that threads the effect's token through an
XLA FFI call. Each is written here once, for every supported JAX (0.6.2 to the newest).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from functools import partial

import jax
import numpy as np
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
from jax._src import pjit as _pjit
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import pxla as _pxla
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


def lower_ordered_ffi_call(ctx, target: str, operands, kept, attributes: dict, aliases: dict):
    """Lowers to the XLA FFI call `target` on the operands at the indices `kept`, with the
    effect's token as the last operand and result, so XLA keeps MPI calls in program order
    across the whole program. The other operands (receive templates) exist for JAX's rules
    but never reach the compiled call, so XLA neither computes nor keeps them; `aliases`
    index the kept operands."""
    rule = jax.ffi.ffi_lowering(
        target, operand_output_aliases=aliases or None, has_side_effect=True
    )
    with_token = ctx.replace(
        avals_in=[*(ctx.avals_in[i] for i in kept), abstract_token],
        avals_out=[*ctx.avals_out, abstract_token],
    )
    kept_operands = [operands[i] for i in kept]
    token_in = ctx.tokens_in.get(effect)
    *results, token_out = rule(with_token, *kept_operands, token_in, **attributes)
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


def is_tracing() -> bool:
    """Whether JAX is tracing (under jit, grad, vmap, ...) rather than executing."""
    return not _core.trace_state_clean()


def use_only_gpu(ordinal: int) -> None:
    """Makes JAX use GPU `ordinal` alone (effective before JAX starts its GPU client)."""
    jax.config.update("jax_cuda_visible_devices", str(ordinal))


# --- Dispatch: fast (default on CPU) or ordered ----------------------------------------


class _FastDispatch:
    """Why a jitted function holding MPI ops costs no more to call than one without.

    Any effect in a program's top-level jaxpr turns JAX's C++ dispatch path off, and an
    ordered one also makes JAX pass a runtime token from each call to the next: ~40x the
    cost of a plain call. Inside one program the token is indispensable (XLA would reorder
    or overlap custom calls without it); between programs it is redundant on the CPU,
    where the PJRT client starts an execution only after the previous one launched from
    the same thread on the same device has finished. So the MPI effect stays on every
    equation (DCE, partial eval, AD, remat and control flow keep treating MPI calls as
    today) and is taken off only the top-level jaxpr handed to lowering; the token that
    chains the program's calls is then created inside `main` instead of passed in.

    What the runtime token gave for free is paid here and in _runtime: `effects_barrier`
    (and exit) drains the thread's stream with a small program of its own, and a failure
    of an op whose result nobody reads is kept by the core and raised later.

    Used only on the CPU with one device per process: on CUDA order between programs is
    not yet shown on a GPU, and several devices each have their own queue. Every program
    lowered this way is checked (the first one thoroughly); if this JAX lowers
    differently, dispatch falls back to ordered, with one warning.
    """

    def __init__(self) -> None:
        self.requested = ""  # JAXMPI_DISPATCH: "", "fast" or "ordered"
        self.decision: tuple[str, str] | None = None  # (mode, why), once known
        self.checked = False
        self.used = False  # a program was lowered the fast way in this process
        self.draining = True
        self.lowering = threading.local()
        self.on_fast: list = []  # called once, when the first program is lowered fast
        self.on_barrier: list = []  # called after every effects_barrier

    def mode(self) -> tuple[str, str]:
        if self.decision is None:
            self.decision = self._decide()
        return self.decision

    def lowered_fast(self) -> None:
        if not self.used:
            self.used = True
            for callback in self.on_fast:
                callback()

    def _decide(self) -> tuple[str, str]:
        if self.requested == "ordered":
            return "ordered", "JAXMPI_DISPATCH=ordered"
        platform = jax.default_backend()
        devices = max(jax.local_device_count(), jax.device_count())
        if devices != 1:
            return "ordered", (
                f"{devices} {platform} devices: each runs its own queue of programs, "
                "so only a token keeps MPI calls across programs in order"
            )
        if self.requested == "fast":
            return "fast", "JAXMPI_DISPATCH=fast"
        if platform != "cpu":
            return "ordered", (
                f"default on {platform}: order between programs is verified on the CPU only"
            )
        return "fast", "default on the CPU with one device"

    def fallback(self, why: str) -> None:
        warnings.warn(
            f"jaxmpi: this JAX ({jax.__version__}) does not lower programs the way fast "
            f"dispatch assumes ({why}); using ordered dispatch (each call threads a "
            "runtime token, slower). Set JAXMPI_DISPATCH=ordered to silence this.",
            RuntimeWarning,
            stacklevel=2,
        )
        self.decision = ("ordered", f"fast dispatch failed its self-check: {why}")


_fast = _FastDispatch()
_lower_to_hlo = _pxla._cached_lowering_to_hlo
_subcomp = _mlir.jaxpr_subcomp
_block_until_ready = _dispatch.RuntimeTokenSet.block_until_ready


def _has_mpi_effect(effects) -> bool:
    return any(isinstance(e, MpiEffect) for e in effects)


def _lowering_without_effect(closed_jaxpr, *args, **kwargs):
    if not _has_mpi_effect(closed_jaxpr.effects) or _fast.mode()[0] != "fast":
        return _lower_to_hlo(closed_jaxpr, *args, **kwargs)
    kept = [e for e in closed_jaxpr.effects if not isinstance(e, MpiEffect)]
    stripped = _core.replace_jaxpr_effects(closed_jaxpr, kept)
    state = _fast.lowering
    state.active, state.created = True, 0
    try:
        result = _lower_to_hlo(stripped, *args, **kwargs)
    finally:
        state.active = False
    why = _self_check(result, state.created, thorough=not _fast.checked)
    _fast.checked = True
    if why:
        _fast.fallback(why)
        return _lower_to_hlo(closed_jaxpr, *args, **kwargs)
    _fast.lowered_fast()
    return result


def _self_check(result, created: int, thorough: bool) -> str:
    """What differs from what fast dispatch assumes of this lowering, or ''."""
    if created != 1:
        return f"the program's MPI token was created {created} times, expected once"
    if not thorough:
        return ""
    for part in result:
        if isinstance(part, (list, tuple)) and _has_mpi_effect(
            e for e in part if isinstance(e, _effects.Effect)
        ):
            return "the executable still carries the MPI effect"
    module = result[0]
    for op in module.body.operations:
        if op.operation.name == "func.func" and str(op.attributes["sym_name"]) == '"main"':
            if "token" in str(op.type):
                return "main still takes or returns a token"
            return ""
    return "no main function in the lowered module"


def _subcomp_creating_token(ctx, jaxpr, name_stack, tokens, *args, **kwargs):
    state = _fast.lowering
    if (
        not getattr(state, "active", False)
        or effect in tokens.effects()
        or not any(effect in eqn.effects for eqn in jaxpr.eqns)
    ):
        return _subcomp(ctx, jaxpr, name_stack, tokens, *args, **kwargs)
    # The top level of a program lowered without the effect: its first MPI call starts
    # the chain; no token leaves the program.
    state.created += 1
    tokens = _mlir.TokenSet({**dict(tokens.items()), effect: _mlir.create_token()})
    outs, tokens_out = _subcomp(ctx, jaxpr, name_stack, tokens, *args, **kwargs)
    return outs, _mlir.TokenSet({e: t for e, t in tokens_out.items() if e is not effect})


def _effects_barrier(self) -> None:
    _block_until_ready(self)
    if _fast.used and _fast.draining:
        # Executions launched from one thread on the CPU run one after the other: once a
        # new one has finished, every MPI call this thread dispatched before it has too.
        _drain(np.zeros((), np.int32)).block_until_ready()
    for callback in _fast.on_barrier:
        callback()


_drain = jax.jit(lambda x: x + 1)


def configure_dispatch(requested: str, on_fast, on_barrier) -> None:
    """Installs fast dispatch unless `requested` is "ordered". `on_fast()` runs when the
    first program is lowered the fast way, `on_barrier()` after every effects_barrier."""
    _fast.requested = requested
    _fast.on_fast.append(on_fast)
    _fast.on_barrier.append(on_barrier)
    _dispatch.RuntimeTokenSet.block_until_ready = _effects_barrier
    if requested != "ordered":
        _pxla._cached_lowering_to_hlo = _lowering_without_effect
        _mlir.jaxpr_subcomp = _subcomp_creating_token


def dispatch_mode() -> tuple[str, str]:
    """("fast" or "ordered", why). Decides now if no program was lowered yet."""
    return _fast.mode()


def stop_draining() -> None:
    """After MPI_Finalize: effects_barrier has nothing left to wait for."""
    _fast.draining = False


@contextlib.contextmanager
def count_python_dispatches():
    """Counts the jitted calls that JAX dispatches from Python (its slow path) instead of
    from C++, in a list of one int."""
    original, count = _pjit._pjit_call_impl_python, [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    _pjit._pjit_call_impl_python = counting
    try:
        yield count
    finally:
        _pjit._pjit_call_impl_python = original
