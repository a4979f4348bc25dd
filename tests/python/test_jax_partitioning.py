"""JAX's `jax_partitioning` mode (JAX 0.12.1) through jaxmpi's pass. With it, a reduction
along a sharded axis of an explicit mesh is lowered through `shard_map` collectives
instead of being left to Shardy: `psum`, `pmax`, `pmin`, `pxor`, the `pmax`/`pmin` of
booleans that `jnp.any`/`jnp.all` become, the `all_gather`s of `jnp.argmax`, and the
`pmax_scatter`/`pmin_scatter` (and `psum_scatter`) an `out_sharding` that keeps the
reduced axis asks for.
Each program is compiled through the pass (each collective a `jaxmpi_hlo_*` call naming
the JAX collective it came from) and run against numpy; where gloo can run it, the same
program is also compiled without the pass, runs over gloo, and must give the same blocks
bit for bit.

Runs in the layouts' cells (layouts.py); the tests skip where JAX has no such mode
(JAX < 0.12.1), and run on the JAX-0.12 build at 2 x 1 and 2 x 2.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from layouts import DEVICES, LOCAL, PROCESSES, N

from helpers import assert_array, within
from jaxmpi._binding import hlo_pass

pytestmark = pytest.mark.skipif(
    not hasattr(jax.config, "jax_partitioning"),
    reason=f"JAX {jax.__version__} has no jax_partitioning mode (JAX >= 0.12.1)",
)


@pytest.fixture(autouse=True)
def partitioning():
    """The mode for this file's tests only: the other files of the cell run without it."""
    before = jax.config.jax_partitioning
    jax.config.update("jax_partitioning", True)
    yield
    jax.config.update("jax_partitioning", before)


# Explicit meshes, each with the operand's sharding and the output sharding that keeps the
# reduced axes on the result (which makes the reduction a reduce-scatter): every device on
# one axis; processes x devices reduced over the processes only (a group per local device,
# across processes), and over both axes.
LAYOUTS = {
    "every_device": ((N,), ("i",), P("i"), P("i")),
    "over_processes": ((PROCESSES, LOCAL), ("p", "d"), P("p", "d"), P(("d", "p"))),
    "over_both_axes": ((PROCESSES, LOCAL), ("p", "d"), P(("p", "d")), P(("p", "d"))),
}


def explicit_mesh(shape, names) -> Mesh:
    return Mesh(
        np.array(DEVICES).reshape(shape), names, axis_types=(AxisType.Explicit,) * len(names)
    )


# name: (the program, given the scattering output sharding; the JAX collective the pass must
# be handed for it; jaxmpi's handler; numpy's reduction along axis 0). CASES: the dtypes.
REDUCTIONS = {
    "sum": (lambda a, _: jnp.sum(a, 0), "psum", "all_reduce", lambda v: v.sum(0)),
    "max": (lambda a, _: jnp.max(a, 0), "pmax", "all_reduce", lambda v: v.max(0)),
    "min": (lambda a, _: jnp.min(a, 0), "pmin", "all_reduce", lambda v: v.min(0)),
    "xor": (
        lambda a, _: jax.lax.reduce_xor(a, (0,)),
        "pxor",
        "all_reduce",
        lambda v: np.bitwise_xor.reduce(v, 0),
    ),
    "any": (lambda a, _: jnp.any(a, 0), "pmax", "all_reduce", lambda v: v.any(0)),
    "all": (lambda a, _: jnp.all(a, 0), "pmin", "all_reduce", lambda v: v.all(0)),
    "argmax": (lambda a, _: jnp.argmax(a, 0), "all_gather", "all_gather", lambda v: v.argmax(0)),
    "max_scatter": (
        lambda a, out: jnp.max(a, 0, out_sharding=out),
        "pmax_scatter",
        "reduce_scatter",
        lambda v: v.max(0),
    ),
    "min_scatter": (
        lambda a, out: jax.lax.reduce_min(a, (0,), out_sharding=out),
        "pmin_scatter",
        "reduce_scatter",
        lambda v: v.min(0),
    ),
    "sum_scatter": (
        lambda a, out: jnp.sum(a, 0, out_sharding=out),
        "reduce_scatter",
        "reduce_scatter",
        lambda v: v.sum(0),
    ),
}
CASES = [
    ("sum", "int32"),
    ("sum", "float32"),
    ("max", "float32"),
    ("max", "int32"),
    ("min", "int32"),
    ("min", "float64"),
    # bool is MPI's logical XOR, the integers its bitwise one (int64: the high word too).
    ("xor", "bool"),
    ("xor", "uint8"),
    ("xor", "int32"),
    ("xor", "int64"),
    ("any", "bool"),
    ("all", "bool"),
    ("argmax", "float32"),
    ("max_scatter", "float32"),
    ("min_scatter", "int32"),
    ("sum_scatter", "int32"),
]

# XLA:CPU's gloo collectives have no XOR all-reduce: compiling `pxor` for them fails with
# "UNIMPLEMENTED: Unsupported reduction computation". Those programs are checked against
# numpy only.
GLOO_CANNOT = {"xor"}


def operand(dtype: str) -> np.ndarray:
    """2N x 2N values of `dtype`, with negatives, repeats and ties, laid out so that the
    answer of each reduction needs every device's block: a boolean column true on one
    device only, one false on one device only; for argmax, column 0's maximum on the
    first and the last device (the first must win, as in numpy)."""
    rows = cols = 2 * N
    base = np.arange(rows * cols).reshape(rows, cols) * 7 % 23 - 11
    if dtype == "bool":
        value = base % 3 == 0
        value[:, 0] = False
        value[-1, 0] = True  # any: true, from the last device only
        value[:, 1] = True
        value[0, 1] = False  # all: false, from the first device only
        value[:, 2] = True  # all: true
        return value
    if dtype == "uint8":
        return (base % 256).astype(np.uint8)
    if dtype == "int64":
        return base * (1 << 40) + base
    value = base.astype(dtype)
    value[0, 0] = value[-1, 0] = 99
    return value


def compile_and_run(name: str, layout: str, value: np.ndarray, through_the_pass: bool):
    """The program of REDUCTIONS[name] on `layout`'s mesh: its compiled text and its result
    (from that same executable), compiled through jaxmpi's pass or, declined by it, left to
    XLA's own collectives, which the "jaxmpi" route sets to gloo."""
    shape, names, spec, scattered = LAYOUTS[layout]
    mesh = explicit_mesh(shape, names)
    body = REDUCTIONS[name][0]

    def program(a):  # a new function each time: no executable of another compile served
        return body(a, scattered)

    with jax.set_mesh(mesh):
        sharding = NamedSharding(mesh, spec)
        array = jax.make_array_from_callback(value.shape, sharding, lambda i: value[i])
        lowered = jax.jit(program).lower(array)
        with pytest.MonkeyPatch.context() as patch:
            if not through_the_pass:
                # What the pass does with a module without collectives: leave it to XLA.
                patch.setattr(hlo_pass._native, "rewrite_hlo", lambda module: None)
            compiled = lowered.compile()
        with within(f"{name} on {layout}, {'the pass' if through_the_pass else 'gloo'}"):
            result = jax.block_until_ready(compiled(array))
    return compiled.as_text(), result


def check_blocks(result: jax.Array, expected: np.ndarray, what: str) -> None:
    for shard in result.addressable_shards:
        assert_array(shard.data, expected[shard.index], f"{what}, block {shard.index}")


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name,dtype", CASES)
def test_reduction_along_a_sharded_axis(name, dtype, layout):
    value = operand(dtype)
    _, collective, handler, reference = REDUCTIONS[name]
    expected = reference(value)
    text, ours = compile_and_run(name, layout, value, through_the_pass=True)
    ours_blocks = [(s.index, np.asarray(s.data)) for s in ours.addressable_shards]
    gloo_text = gloo = None
    if name not in GLOO_CANNOT:
        gloo_text, gloo = compile_and_run(name, layout, value, through_the_pass=False)

    calls = re.findall(r'custom_call_target="(jaxmpi_hlo_\w+)".*origin = "([^"]*)"', text)
    assert any(
        target == f"jaxmpi_hlo_{handler}" and origin.endswith(f"/shard_map/{collective}")
        for target, origin in calls
    ), f"no jaxmpi_hlo_{handler} from {collective}: {calls}\n{text}"
    assert not re.search(r"\b(all-reduce|all-gather|reduce-scatter)\(", text), text
    check_blocks(ours, expected, f"{name} {dtype} on {layout}, through the pass")
    if gloo is not None:
        # The gloo program must really be XLA's own: else this compares the pass with itself.
        assert "jaxmpi_hlo_" not in gloo_text, gloo_text
        assert re.search(r"\b(all-reduce|all-gather|reduce-scatter)\(", gloo_text), gloo_text
        for index, block in ours_blocks:
            gloo_block = next(s.data for s in gloo.addressable_shards if s.index == index)
            assert_array(block, gloo_block, f"{name} {dtype} on {layout}: pass vs gloo {index}")
