"""A data-parallel training step of an MLP, three ways, in one run: the gradients reduced
after the backward pass with one `jaxmpi.allreduce` of the whole pytree (blocking: one
MPI call per dtype); reduced layer by layer during the backward pass, each layer's
allreduce started (`jaxmpi.iallreduce`) as soon as its gradients exist, the next layer's
backward computed meanwhile, all waited for before the update (started); and, for
reference, each layer's gradients reduced with a blocking `allreduce` where the started
one would start (per layer), and the started step's backward with the blocking step's one
allreduce after it (by hand: what the backward written layer by layer costs alone).

    mpiexec -n 2 python benches/bench_training.py [--rounds 7] [--steps 10]
        [--width 512] [--depth 4] [--batch 64] [--json OUT]

The backward pass is written layer by layer with `jax.vjp` (what `jax.grad` computes,
in an order a program can start each layer's reduction in): the started step is
`after(request, cotangent)` into the next layer's backward, `waitall` before the update. Each case is a jitted `fori_loop` of `--steps` SGD steps on this rank's batch;
time per step is the slowest rank's, the median of `--rounds`, the cases alternating
within each round. Prints a Markdown table on rank 0 (each case against the blocking
step, measured in the same run), and with `--json` writes the numbers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxmpi
from jaxmpi._runtime.library import info

RANK, SIZE = jaxmpi.COMM_WORLD.Get_rank(), jaxmpi.COMM_WORLD.Get_size()
SUM = jaxmpi.SUM


def init(widths: list[int]) -> list[dict]:
    rng = np.random.default_rng(0)  # the same parameters on every rank
    return [
        {
            "w": jnp.asarray(rng.standard_normal((a, b)) / np.sqrt(a), jnp.float32),
            "b": jnp.zeros(b, jnp.float32),
        }
        for a, b in itertools.pairwise(widths)
    ]


def layer(params: dict, x: jax.Array, last: bool) -> jax.Array:
    y = x @ params["w"] + params["b"]
    return y if last else jnp.tanh(y)


def loss_of(out: jax.Array, target: jax.Array) -> jax.Array:
    return jnp.mean((out - target) ** 2)


def forward(params: list[dict], x: jax.Array) -> tuple[jax.Array, list]:
    """The output and each layer's VJP, first layer first."""
    vjps = []
    for k, p in enumerate(params):
        x, vjp = jax.vjp(lambda p, x, k=k: layer(p, x, k == len(params) - 1), p, x)
        vjps.append(vjp)
    return x, vjps


def update(params: list[dict], grads: list[dict], lr: float = 0.01) -> list[dict]:
    scale = lr / SIZE
    return jax.tree.map(lambda p, g: p - scale * g, params, grads)


def blocking_step(params, x, target):
    """jax.grad's gradients, then one allreduce of the whole pytree."""
    grads = jax.grad(lambda p: loss_of(forward(p, x)[0], target))(params)
    return update(params, jaxmpi.allreduce(grads, SUM))


def _backward(params, x, target, reduce_layer):
    out, vjps = forward(params, x)
    cotangent = jax.grad(loss_of)(out, target)
    grads: list = [None] * len(params)
    for k in reversed(range(len(params))):
        grads[k], cotangent = vjps[k](cotangent)
        grads[k], cotangent = reduce_layer(grads[k], cotangent)
    return grads, cotangent


def started_step(params, x, target):
    """Each layer's allreduce started as soon as its gradients exist; the earlier layers'
    backward computes meanwhile; all waited for before the update."""
    requests = []

    def start(grads, cotangent):
        requests.append(jaxmpi.iallreduce(grads, SUM))
        return grads, jaxmpi.after(requests[-1], cotangent)

    _backward(params, x, target, start)
    # The waits follow every start (program order), hence the whole backward pass; an
    # `after=` the input's cotangent would make XLA compute it (a matmul jax.grad skips).
    return update(params, jaxmpi.waitall(requests[::-1]))


def per_layer_step(params, x, target):
    """Each layer's gradients reduced with a blocking allreduce where they appear."""
    grads, _ = _backward(params, x, target, lambda g, c: (jaxmpi.allreduce(g, SUM), c))
    return update(params, grads)


def by_hand_step(params, x, target):
    """The layer-by-layer backward of the other two, then one allreduce of the pytree."""
    grads, _ = _backward(params, x, target, lambda g, c: (g, c))
    return update(params, jaxmpi.allreduce(grads, SUM))


CASES = {
    "blocking": blocking_step,
    "started": started_step,
    "per layer": per_layer_step,
    "by hand": by_hand_step,
}


def program(step, steps: int):
    loop = lambda p, x, t: jax.lax.fori_loop(0, steps, lambda _, q: step(q, x, t), p)  # noqa: E731
    return jax.jit(loop)


def _time(run, *args) -> float:
    jaxmpi.barrier()
    start = time.perf_counter()
    jax.block_until_ready(run(*args))
    return float(jaxmpi.allreduce(np.float64(time.perf_counter() - start), jaxmpi.MAX))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    widths = [args.width] * args.depth + [16]
    params = init(widths)
    rng = np.random.default_rng(RANK + 1)  # each rank its own batch
    x = jnp.asarray(rng.standard_normal((args.batch, args.width)), jnp.float32)
    target = jnp.asarray(rng.standard_normal((args.batch, 16)), jnp.float32)
    programs = {name: program(step, args.steps) for name, step in CASES.items()}
    results = {
        name: jax.block_until_ready(run(params, x, target)) for name, run in programs.items()
    }
    # The three compute the same step: the same parameters after it, to rounding.
    for name, got in results.items():
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(results["blocking"])):
            np.testing.assert_allclose(
                np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-6, err_msg=name
            )
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, run in programs.items():
            times[name].append(_time(run, params, x, target) / args.steps)
    us = {name: 1e6 * statistics.median(t) for name, t in times.items()}
    if RANK == 0:
        kib = sum(p.size * 4 for p in jax.tree.leaves(params)) / 1024
        print(
            f"{SIZE} ranks, jax {jax.__version__}, MLP {args.depth} x {args.width} "
            f"(+16 outputs), {kib:.0f} KiB of gradients, batch {args.batch} a rank, "
            f"{args.steps} steps a loop, median of {args.rounds}; progress: "
            f"{info['progress']}"
        )
        print("| step | µs | vs blocking |")
        print("|---|---:|---:|")
        for name, micros in us.items():
            print(f"| {name} | {micros:.0f} | {micros / us['blocking']:.3f}x |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"us": us, "args": vars(args), "size": SIZE, "progress": info["progress"]}, f
                )


if __name__ == "__main__":
    main()
