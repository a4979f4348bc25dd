"""What one allreduce among devices makes a process receive, as Open MPI's monitoring
counts it (every byte its point-to-point layer delivers, collectives' included): the
worker of `benches/bench_mesh_bytes.sh`, which runs it in layouts of 4, 8 and 16 device
ranks and prints bytes per device rank and call.

    python benches/bench_mesh_bytes.py ROUTE CALLS [--elements 262144]

ROUTE: `psum` (JAX's, through jaxmpi's pass), `psum_scatter` (the same, each device
keeping its share: tiled back to the operand's size for the next call, no message),
`meshcomm` (jaxmpi.allreduce on a MeshComm of every device), `meshcomm_scan`
(jaxmpi.scan there) or `meshcomm_allgatherv` (jaxmpi.allgatherv there, counts read at run
time, each device keeping its own block for the next call); CALLS calls of `--elements`
float32 per device, each a call of one jitted program.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import shard_map
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmpi
from jaxmpi import distributed


def main() -> None:
    parser = argparse.ArgumentParser()
    routes = ["psum", "psum_scatter", "meshcomm", "meshcomm_scan", "meshcomm_allgatherv"]
    parser.add_argument("route", choices=routes)
    parser.add_argument("calls", type=int)
    parser.add_argument("--elements", type=int, default=1 << 18)
    args = parser.parse_args()
    distributed.initialize()
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(devices), ("x",))
    if args.route == "psum":
        body = lambda y: jax.lax.psum(y, "x")  # noqa: E731
    elif args.route == "psum_scatter":
        share = lambda y: jax.lax.psum_scatter(y, "x", tiled=True)  # noqa: E731
        body = lambda y: jnp.tile(share(y), len(devices))  # noqa: E731
    elif args.route == "meshcomm":
        comm = jaxmpi.MeshComm(mesh)
        body = lambda y: jaxmpi.allreduce(y, jaxmpi.SUM, comm=comm)  # noqa: E731
    elif args.route == "meshcomm_scan":
        comm = jaxmpi.MeshComm(mesh)
        body = lambda y: jaxmpi.scan(y, jaxmpi.SUM, comm=comm)  # noqa: E731
    else:
        comm = jaxmpi.MeshComm(mesh)
        n, counts = len(devices), jnp.full(len(devices), args.elements)

        def body(y):
            whole = jaxmpi.allgatherv(y, counts, recv_capacity=n * y.shape[0], comm=comm)
            return whole[: y.shape[0]] * n

    program = jax.jit(shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    x = jax.make_array_from_callback(
        (len(devices) * args.elements,),
        NamedSharding(mesh, P("x")),
        lambda index: np.ones(args.elements, np.float32),
    )
    for _ in range(args.calls):
        x = program(x) / len(devices)
    jax.block_until_ready(x)


if __name__ == "__main__":
    main()
