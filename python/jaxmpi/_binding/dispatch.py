"""How jitted calls holding MPI ops are dispatched: `fast` (default on the CPU with one
device per process) or `ordered` (JAX's ordered effect, a runtime token between calls).

Any effect in a program's top-level jaxpr turns JAX's C++ dispatch path off, and an
ordered one also makes JAX pass a runtime token from each call to the next: ~40x the cost
of a plain call. Inside one program the token is indispensable (XLA would reorder or
overlap custom calls without it); between programs it is redundant on the CPU, where the
PJRT client starts an execution only after the previous one launched from the same thread
on the same device has finished. So the MPI effect stays on every equation (DCE, partial
eval, AD, remat and control flow keep treating MPI calls as today) and is taken off only
the top-level jaxpr handed to lowering; the token that chains the program's calls is then
created inside `main` instead of passed in.

What the runtime token gave for free is paid here: `effects_barrier` (and exit, through
`_runtime/library.py`) drains the thread's stream with a small program of its own, and a
failure of an op whose result nobody reads is kept by the core and raised later.

Used only on the CPU with one local device per process: on CUDA order between programs is
not yet shown on a GPU, and several local devices each have their own queue. For the same
reason, programs with MPI ops on two platforms (a CPU program and a GPU program in one
process) are refused under fast dispatch: each platform runs its own queue, and nothing
orders one's MPI calls after the other's. The devices of
other processes do not matter: under jax.distributed a program over a global mesh runs, in
this process, on its one local device, and jaxmpi ops inside `shard_map` act on that
device's block (`placement.py` refuses every other placement). That is also what makes
such programs possible at all: JAX refuses an ordered effect at the top level of a program
over more than one device, and fast dispatch has taken it off. Every program lowered
this way is checked (the first one thoroughly); if this JAX lowers differently, dispatch
falls back to ordered, with one warning. The JAX internals touched are `jax_shim`'s.

Importing the module installs the policy JAXMPI_DISPATCH asks for.
"""

from __future__ import annotations

import os
import threading
import warnings

import jax
import numpy as np

from .. import _native
from .._runtime import library
from .._runtime.errors import raise_kept_failure
from . import jax_shim, placement
from .placement import ONE_PROCESS_PER_DEVICE


def self_check(result, created: int, thorough: bool, own_tokens: int = 0) -> str:
    """What differs from what fast dispatch assumes of a lowering, or ''. `own_tokens`: the
    tokens the program itself takes and returns (not the MPI effect's)."""
    if created != 1:
        return f"the program's MPI token was created {created} times, expected once"
    if not thorough:
        return ""
    if jax_shim.lowering_still_carries_effect(result):
        return "the executable still carries the MPI effect"
    signature = jax_shim.main_signature(result)
    if signature is None:
        return "no main function in the lowered module"
    if signature.count("!stablehlo.token") != own_tokens:
        return "main still takes or returns a token"
    return ""


class FastDispatch:
    """The process's dispatch policy: the mode decided once, the lowering state of the
    thread lowering a program, and the callbacks `configure` registers. `check` is the
    self-check each fast lowering passes (a test replaces it to simulate another JAX)."""

    def __init__(self) -> None:
        self.requested = ""  # JAXMPI_DISPATCH: "", "fast" or "ordered"
        self.decision: tuple[str, str] | None = None  # (mode, why), once known
        self.checked = False
        self.used = False  # a program was lowered the fast way in this process
        self.draining = True
        self.lowering = threading.local()
        self.on_fast: list = []  # called once, when the first program is lowered fast
        self.on_barrier: list = []  # called after every effects_barrier
        # The lowerings that passed the self-check, by identity: JAX caches lowerings, and
        # lowers a program again for new argument shardings, handing back the cached one
        # without lowering anything (so without creating the token again).
        self.passed: set[int] = set()
        self.program_checks: list = []  # check(jaxpr) on every program lowered with MPI
        self.check = self_check
        self.platform: str | None = None  # of the programs lowered fast (one only)

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
        devices = jax.local_device_count()
        if devices != 1:
            return "ordered", (
                f"{devices} local {platform} devices: each runs its own queue of programs, "
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


policy = FastDispatch()


def _refusal(closed_jaxpr) -> ValueError:
    """JAX's refusal of the MPI effect in a program over several devices, said for jaxmpi:
    which op, and why this process is not in fast dispatch."""
    op = jax_shim.first_mpi_op(closed_jaxpr.jaxpr) or "jaxmpi_op"
    local = jax.local_device_count()
    if local != 1:
        why = (
            f"this process has {local} local devices, each of which would call MPI on "
            f"the same communicator from its own thread. {ONE_PROCESS_PER_DEVICE}"
        )
    else:
        why = (
            "such programs need fast dispatch, and this process uses ordered dispatch "
            f"({policy.mode()[1]})"
        )
    name = op.removeprefix("jaxmpi_")
    return ValueError(f"jaxmpi.{name} in a program over several devices: {why}.")


def _only_mesh_comms(closed_jaxpr) -> bool:
    """Whether every MPI op of the program runs on a MeshComm (a negative comm id), whose
    ranks are devices: each device keeps its own calls in order, program after program,
    so the program lowers as in fast dispatch whatever the devices per process."""
    ops = list(jax_shim.mpi_ops(closed_jaxpr.jaxpr))
    return bool(ops) and all(placement.is_mesh_comm(params.get("comm", 0)) for _, params in ops)


def _lowering_without_effect(lower, closed_jaxpr, *args, **kwargs):
    if not jax_shim.has_mpi_effect(closed_jaxpr.effects):
        return lower(closed_jaxpr, *args, **kwargs)
    for check in policy.program_checks:
        check(closed_jaxpr.jaxpr)
    if policy.mode()[0] != "fast" and not _only_mesh_comms(closed_jaxpr):
        try:
            return lower(closed_jaxpr, *args, **kwargs)
        except ValueError as err:
            if jax_shim.refuses_ordered_effect_over_devices(err):
                raise _refusal(closed_jaxpr) from err
            raise
    _claim_platform(jax_shim.lowering_platforms(args, kwargs), closed_jaxpr)
    state = policy.lowering
    state.active, state.created = True, 0
    try:
        result = lower(jax_shim.without_mpi_effect(closed_jaxpr), *args, **kwargs)
    finally:
        state.active = False
    if state.created == 0 and id(result) in policy.passed:
        return result
    own_tokens = jax_shim.program_tokens(closed_jaxpr)
    why = policy.check(result, state.created, thorough=not policy.checked, own_tokens=own_tokens)
    policy.checked = True
    if why:
        policy.fallback(why)
        return lower(closed_jaxpr, *args, **kwargs)
    policy.lowered_fast()
    policy.passed.add(id(result))
    return result


def _claim_platform(platforms: tuple[str, ...] | None, closed_jaxpr) -> None:
    """The platform of the programs lowered fast: the first one's. A program for another
    would run its MPI calls in another queue, in no order with these: refused. A platform
    this process has no backend for claims nothing: its programs (lowered to be exported,
    e.g. for CUDA on a machine without a GPU) never run here."""
    if platforms is not None:
        platforms = tuple(p for p in platforms if _runs_here(p))
    if not platforms:
        return
    if len(platforms) == 1 and policy.platform in (None, platforms[0]):
        policy.platform = platforms[0]
        return
    op = (jax_shim.first_mpi_op(closed_jaxpr.jaxpr) or "jaxmpi_op").removeprefix("jaxmpi_")
    raise ValueError(
        f"jaxmpi.{op} in a program for {', '.join(platforms)}, in a process whose programs "
        f"with MPI ops run on {policy.platform or 'one platform'} under fast dispatch "
        f"({policy.mode()[1]}): programs on two platforms run in two queues, and their MPI "
        "calls would not keep program order. Keep MPI ops on one platform (jax.device_put "
        "the arrays), or set JAXMPI_DISPATCH=ordered, whose runtime token orders them."
    )


def _subcomputation_creating_token(subcomp, ctx, jaxpr, name_stack, tokens, *args, **kwargs):
    with_token = None
    if getattr(policy.lowering, "active", False) and jax_shim.calls_mpi(jaxpr):
        with_token = jax_shim.with_new_mpi_token(tokens)
    if with_token is None:
        return subcomp(ctx, jaxpr, name_stack, tokens, *args, **kwargs)
    # The top level of a program lowered without the effect: its first MPI call starts
    # the chain; no token leaves the program.
    policy.lowering.created += 1
    outs, tokens_out = subcomp(ctx, jaxpr, name_stack, with_token, *args, **kwargs)
    return outs, jax_shim.without_mpi_token(tokens_out)


def _runs_here(platform: str) -> bool:
    try:
        jax.local_devices(backend=platform)
    except RuntimeError:  # "Unknown backend": no such platform in this process
        return False
    return True


def _effects_barrier(block_until_ready, tokens) -> None:
    block_until_ready(tokens)
    if policy.used and policy.draining:
        # Executions launched from one thread on one device run one after the other: once
        # a new one has finished, every MPI call this thread dispatched before it has too.
        # On this process's device of the fast programs' platform, which need not be the
        # default one (under jax.distributed, jax.devices()[0] is process 0's).
        device = jax.local_devices(backend=policy.platform)[0] if policy.platform else None
        _drain(jax.device_put(np.zeros((), np.int32), device)).block_until_ready()
    for callback in policy.on_barrier:
        callback()


_drain = jax.jit(lambda x: x + 1)


def configure(requested: str, on_fast, on_barrier) -> None:
    """Installs fast dispatch unless `requested` is "ordered". `on_fast()` runs when the
    first program is lowered the fast way, `on_barrier()` after every effects_barrier."""
    policy.requested = requested
    policy.on_fast.append(on_fast)
    policy.on_barrier.append(on_barrier)
    jax_shim.install_effects_barrier_hook(_effects_barrier)
    # In ordered mode too: there it only explains a refused program over several devices.
    jax_shim.install_lowering_hook(_lowering_without_effect)
    if requested != "ordered":
        jax_shim.install_subcomputation_hook(_subcomputation_creating_token)


def dispatch_mode() -> tuple[str, str]:
    """("fast" or "ordered", why). Decides now if no program was lowered yet."""
    return policy.mode()


def stop_draining() -> None:
    """At exit, before MPI_Finalize (`library.before_finalize`): the last effects_barrier
    has drained; later ones have nothing left to wait for."""
    policy.draining = False


configure(
    os.environ.get("JAXMPI_DISPATCH", "").strip(),  # checked by _runtime/library.py
    # Without a runtime token, a failure of an op without results has no result to
    # surface through: the core keeps it for the next effects_barrier or jaxmpi call.
    on_fast=lambda: _native.keep_failures(True),
    on_barrier=raise_kept_failure,
)
library.before_finalize.append(stop_draining)
