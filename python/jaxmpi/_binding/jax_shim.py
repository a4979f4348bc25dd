"""Every use of JAX's private internals, in one place, and nothing else.

jaxmpi needs what JAX has no public API for: an ordered effect (so MPI calls keep program
order on every rank without user-visible tokens), the default eager implementation of a
primitive, a lowering that threads the effect's token through an XLA FFI call, JAX's rule
registries, for fast dispatch (`dispatch.py`, the policy), three hooks into how JAX
lowers, compiles and drains a program, and, inside shard_map, the lowering's axis context
(which devices share an op's block, which processes run the program), the results' varying
manual axes and the manual sharding GSPMD wants on a side-effecting call, and whether
jaxlib can run XLA's CPU collectives over MPI. Each is written here once, for every
supported JAX (0.6.2 to the newest).
"""

from __future__ import annotations

import inspect
import math
from functools import partial

import jax
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
from jax._src import mesh as _mesh
from jax._src import sharding_impls as _sharding_impls
from jax._src import xla_bridge as _xla_bridge
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import pxla as _pxla
from jax._src.lib import xla_client as _xc
from jax.extend.core import Primitive  # public since JAX 0.4.32
from jax.interpreters import ad as _ad
from jax.interpreters import batching as _batching
from jax.interpreters import mlir

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
        lambda *avals, **params: (_varying_like(abstract_eval(*avals, **params), avals), {effect})
    )
    return primitive


def _varying_like(outs, avals):
    """Inside shard_map (JAX 0.7+, check_vma), results vary over the mesh axes the
    operands vary over: each process gets its own result, and a loop carrying one keeps
    its type."""
    varying = frozenset().union(*map(_varying_axes, avals))
    if not varying:
        return outs
    like = next(aval for aval in avals if _varying_axes(aval))
    return [_with_varying_axes(out, varying, like) for out in outs]


def _varying_axes(aval) -> frozenset:
    manual = getattr(aval, "mat", None)  # JAX 0.10+
    return manual.varying if manual is not None else getattr(aval, "vma", frozenset())


def _with_varying_axes(aval, axes: frozenset, like):
    """`aval` varying over `axes`, on the mesh of `like` (an operand that varies)."""
    if hasattr(aval, "update_manual_axis_type"):  # JAX 0.10+
        on_mesh = aval.update(sharding=like.sharding.update(spec=(None,) * aval.ndim))
        return on_mesh.update_manual_axis_type(_core.ManualAxisType(varying=axes))
    return aval.update(vma=axes)  # JAX 0.7 to 0.9


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
    _mark_per_device(ctx, token_out)
    ctx.set_tokens_out(mlir.TokenSet({effect: token_out}))
    return results


def _mark_per_device(ctx, token_out) -> None:
    """Inside a shard_map (manual sharding), marks the FFI call as running on each
    device's own block, as JAX marks its own callbacks there: GSPMD's partitioner (the
    default before JAX 0.7) refuses a side-effecting op without a sharding. Shardy, the
    later default, takes it from the manual region around the call."""
    context = ctx.module_context.axis_context
    if _config.use_shardy_partitioner.value or not isinstance(
        context, _sharding_impls.SPMDAxisContext
    ):
        return
    if context.manual_axes:
        manual = mlir.ir.StringAttr.get(repr(_xc.HloSharding.manual()))
        token_out.owner.attributes["mhlo.sharding"] = manual  # the call made the token


def new_identity_primitive(name: str) -> Primitive:
    """A multiple-results primitive that returns its operands, with no effect: a rule's
    identity that must stay a primitive so that rules of its own can be attached."""
    primitive = Primitive(name)
    primitive.multiple_results = True
    primitive.def_impl(lambda *operands, **_: operands)
    primitive.def_abstract_eval(lambda *avals, **_: avals)
    mlir.register_lowering(primitive, lambda ctx, *operands, **_: operands)
    return primitive


def register_lowering(primitive: Primitive, rule, platform: str) -> None:
    mlir.register_lowering(primitive, rule, platform=platform)


def register_ffi_target(name: str, capsule, platform: str) -> None:
    jax.ffi.register_ffi_target(name, capsule, platform=platform, api_version=1)


def is_token(value) -> bool:
    """Whether `value` is a JAX token (`jax.lax.create_token()`, or a tracer of one)."""
    try:
        return isinstance(jax.typeof(value), _core.AbstractToken)
    except TypeError:  # not a JAX type at all
        return False


def in_shard_map() -> bool:
    """Whether the trace is inside shard_map (manual over some mesh axis): there one
    program serves every process, so ops must lower the same on every rank (vmap's named
    axes are not manual: not inside)."""
    return bool(_mesh.get_abstract_mesh().manual_axes)


def backends_started() -> bool:
    """Whether JAX's backends (its CPU and GPU clients) have started: options they read
    when they start, such as jax_cuda_visible_devices, no longer change anything."""
    return _xla_bridge.backends_are_initialized()


def has_hlo_pass_hook() -> bool:
    """Whether JAX can hand every CPU module to a pass of ours before XLA compiles it
    (`jax.extend.xla.register_hlo_module_transformation`, public from JAX 0.10.2, which
    needs jaxlib 0.10.2 too)."""
    try:
        from jax.extend import xla as _extend_xla
    except ImportError:
        return False
    if not hasattr(_extend_xla, "register_hlo_module_transformation"):
        return False
    from jax._src.lib import _xla

    return hasattr(_xla, "register_xla_transform")


def salt_compilation_cache(salt: str) -> None:
    """Makes every persistent compilation cache key depend on `salt` too: JAX leaves
    registered passes out of its keys, so an executable compiled without the pass would
    otherwise be served to a run with it, and the reverse (`jax._src.cache_key`'s
    `custom_hook`, hashed into every key)."""
    from jax._src import cache_key

    earlier = cache_key.custom_hook
    cache_key.custom_hook = lambda: earlier() + salt


def jaxlib_has_mpi_collectives() -> bool:
    """Whether this jaxlib builds XLA's MPI CPU collectives (`jax_cpu_collectives_implementation
    ="mpi"`, through the MPItrampoline it carries)."""
    return hasattr(_xc._xla, "make_mpi_collectives")


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


def is_tracing() -> bool:
    """Whether JAX is tracing (under jit, grad, vmap, ...) rather than executing."""
    return not _core.trace_state_clean()


def current_trace():
    """The trace JAX records into now (its identity tells one function, branch or loop
    body being traced from another)."""
    return _core.trace_ctx.trace


def jaxprs_in(eqn) -> list:
    """The jaxprs nested in an equation (cond branches, loop bodies, inner jits)."""
    return [getattr(j, "jaxpr", j) for j in _core.jaxprs_in_params(eqn.params)]


def where(eqn) -> str:
    """The user's line that made an equation: the innermost frame outside JAX and jaxmpi."""
    from jax._src import source_info_util

    package = __file__.rsplit("/", 2)[0] + "/"  # jaxmpi/, above this file's _binding/
    # JAX 0.6 passes the SourceInfo, later releases its traceback.
    takes = next(iter(inspect.signature(source_info_util.user_frames).parameters))
    info = eqn.source_info.traceback if takes == "traceback" else eqn.source_info
    for frame in source_info_util.user_frames(info):
        if not frame.file_name.startswith(package):
            return f"{frame.file_name}:{frame.start_line}"
    return "an unknown line"


# --- Dispatch hooks (the policy is `dispatch.py`) ------------------------------------------
# Each install_* wraps one JAX internal: `wrapper(original, *args, **kwargs)` is called in
# its place with the original function first.


def install_lowering_hook(wrapper) -> None:
    """Around lowering a jaxpr to the HLO module of an executable (its top level)."""
    # A private function replaced on purpose: its type is what the wrapper keeps.
    _pxla._cached_lowering_to_hlo = partial(wrapper, _pxla._cached_lowering_to_hlo)  # type: ignore[assignment]


def install_compile_hook(wrapper) -> None:
    """Around compiling a lowered program (or taking it from the persistent cache):
    `wrapper(original, backend, computation, devices, *rest)`, `devices` a numpy array of
    the program's devices (the same signature from JAX 0.6.2 to 0.12)."""
    from jax._src import compiler

    compiler.compile_or_get_cached = partial(wrapper, compiler.compile_or_get_cached)


# How XLA's collective instructions show in an executable's HLO text.
_COLLECTIVE_OPCODES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)


def executable_collectives(executable) -> list[str]:
    """XLA's collective instructions (their opcodes) in a compiled program."""
    found = []
    for module in executable.hlo_modules():
        text = module.to_string()
        found += [op for op in _COLLECTIVE_OPCODES if f" {op}(" in text or f" {op}-start(" in text]
    return found


def install_subcomputation_hook(wrapper) -> None:
    """Around lowering one jaxpr (the top level and every nested body) given its tokens."""
    _mlir.jaxpr_subcomp = partial(wrapper, _mlir.jaxpr_subcomp)


def install_effects_barrier_hook(wrapper) -> None:
    """Around `jax.effects_barrier()`'s wait for the runtime tokens of ordered effects."""
    original = _dispatch.RuntimeTokenSet.block_until_ready

    def block_until_ready(self):
        return wrapper(original, self)

    _dispatch.RuntimeTokenSet.block_until_ready = block_until_ready  # type: ignore[method-assign]


def has_mpi_effect(effects) -> bool:
    return any(isinstance(e, MpiEffect) for e in effects)


def without_mpi_effect(closed_jaxpr):
    """The closed jaxpr with the MPI effect taken off its top level only."""
    kept = [e for e in closed_jaxpr.effects if not isinstance(e, MpiEffect)]
    return _core.replace_jaxpr_effects(closed_jaxpr, kept)


def calls_mpi(jaxpr) -> bool:
    """Whether an equation of `jaxpr` (not nested ones) carries the MPI effect."""
    return any(effect in eqn.effects for eqn in jaxpr.eqns)


def with_new_mpi_token(tokens):
    """`tokens` (a TokenSet) plus a fresh token for the MPI effect, made in the program."""
    if effect in tokens.effects():
        return None
    return _mlir.TokenSet({**dict(tokens.items()), effect: _mlir.create_token()})


def without_mpi_token(tokens):
    return _mlir.TokenSet({e: t for e, t in tokens.items() if e is not effect})


def lowering_still_carries_effect(result) -> bool:
    """Whether a lowering result (what `install_lowering_hook` wraps) still lists the MPI
    effect among the executable's effects."""
    return any(
        isinstance(part, (list, tuple))
        and has_mpi_effect(e for e in part if isinstance(e, _effects.Effect))
        for part in result
    )


def lowering_platforms(args, kwargs) -> tuple[str, ...] | None:
    """The platforms a program is lowered for, from the arguments of the function
    `install_lowering_hook` wraps (its last positional one from jax 0.6 to 0.12), or None
    where this JAX passes them otherwise."""
    platforms = kwargs.get("platforms", args[-1] if args else None)
    if isinstance(platforms, tuple) and platforms and all(isinstance(p, str) for p in platforms):
        return platforms
    return None


def program_tokens(closed_jaxpr) -> int:
    """How many of a program's own inputs and outputs are tokens (a program written for
    mpi4jax < 0.8 takes and returns them): `main` has exactly those."""
    avals = (*closed_jaxpr.in_avals, *closed_jaxpr.out_avals)
    return sum(isinstance(aval, _core.AbstractToken) for aval in avals)


def main_signature(result) -> str | None:
    """The type of the lowered module's `main` function, or None if it has none."""
    for op in result[0].body.operations:
        if op.operation.name == "func.func" and str(op.attributes["sym_name"]) == '"main"':
            return str(op.type)
    return None


# --- Programs over several devices (jax.distributed, shard_map) ---------------------------


def program_devices(ctx) -> tuple[int, int, tuple | None]:
    """(devices the program being lowered runs on, devices that share the block an op
    lowered at `ctx` sees, the program's devices (jax Device objects), or None where the
    lowering does not name them). Inside a shard_map manual over every
    mesh axis longer than 1 that block is one device's; at the top level of a program over
    global arrays, or in a shard_map that leaves an axis automatic, it is spread over
    several. Inside shard_map the program's devices are its mesh's."""
    context = ctx.module_context.axis_context
    if isinstance(context, _sharding_impls.SPMDAxisContext):
        shape = dict(context.mesh.shape)
        automatic = [n for axis, n in shape.items() if axis not in context.manual_axes]
        # An abstract mesh (no devices) only where no concrete one was ever set.
        mesh = context.mesh
        named = tuple(mesh.devices.flat) if isinstance(mesh, jax.sharding.Mesh) else None
        return math.prod(shape.values()), math.prod(automatic), named
    if isinstance(context, _sharding_impls.ShardingContext):
        devices = context.num_devices
        assigned = context.device_assignment
        return devices, devices, None if assigned is None else tuple(assigned)
    # pmap's replica context: JAX itself refuses ordered effects under pmap.
    return 1, 1, None


def lower_each_call(primitives, on: bool) -> None:
    """Makes JAX lower every equation of `primitives` in place (`on`), instead of once per
    distinct parameters into a function shared by all of them (JAX >= 0.10's lowering
    cache), whose lowering context has no name stack: what `call_site` reads. Costs only
    lowering time, where the same op is called from many places."""
    uncacheable = getattr(_mlir, "_uncacheable_primitives", None)
    if uncacheable is None:  # JAX without the cache: every equation is lowered in place
        return
    if on:
        uncacheable.update(primitives)
    else:
        uncacheable.difference_update(primitives)


def call_site(ctx) -> str:
    """Where the program names the equation lowered at `ctx`: its name stack, the
    transformations and `jax.named_scope`s around it ("jit(step)/halo"), as XLA's op_name
    metadata shows it; "" where the lowering context has none."""
    stack = getattr(ctx, "name_stack", None)
    return str(stack) if stack is not None else ""


def refuses_ordered_effect_over_devices(err: ValueError) -> bool:
    """Whether `err` is JAX's refusal, at lowering, of an ordered effect in a program over
    more than one device (pxla's check; the same words from JAX 0.6 to 0.12)."""
    return "ordered effects are not supported for more than 1 device" in str(err)


def mpi_ops(jaxpr):
    """The MPI ops' equations in `jaxpr` and every jaxpr nested in it, in order: (the
    primitive's name, its parameters)."""
    for eqn in jaxpr.eqns:
        if effect in eqn.effects:
            inner = list(_core.jaxprs_in_params(eqn.params))
            for nested in inner:
                yield from mpi_ops(nested)
            if not inner:
                yield str(eqn.primitive.name), eqn.params


def first_mpi_op(jaxpr) -> str | None:
    """The name of the first primitive carrying the MPI effect in `jaxpr` or any jaxpr
    nested in it (for an error message), or None."""
    return next((name for name, _ in mpi_ops(jaxpr)), None)
