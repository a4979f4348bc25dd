"""One route's run of generated programs in one layout, a process of the MPI job each
(run.py launches it): `python job.py ROUTE LAYOUT OUT SEED...`.

ROUTE is what carries JAX's collectives: "jaxmpi" (jaxmpi's pass, and a MeshComm's own
ops), "gloo" (JAX's, and the MeshComm ops' JAX twins), or "local" (one process holding
every device of the layout, XLA's own collectives among them: the reference run.py asks
where the other two differ). For each seed, each process writes into OUT:

    SEED.pP.start   before the program runs
    SEED.pP.npz     the blocks it holds of each output, once it ran
    SEED.pP.error   what it raised instead
    SEED.pP.calls   how many of XLA's collectives jaxmpi's pass took over in it (jaxmpi)
    SEED.pP.hung    written when the program outran --timeout, just before the process
                    ends (exit 3), since a call stuck in MPI cannot be interrupted

After each program the processes compare notes (one MPI allreduce): where any failed, they
all end (exit 0), and run.py starts a new job at the next seed, so that nothing a failed
program left half done (a gloo collective, a message) meets the next one.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

import numpy as np

route, layout, out = sys.argv[1], sys.argv[2], sys.argv[3]
seeds = [int(s) for s in sys.argv[4:]]
ILL_FORMED = os.environ.get("DIFFERENTIAL_ILL_FORMED") == "1"
TIMEOUT = float(os.environ.get("DIFFERENTIAL_TIMEOUT", "60"))

import jax  # noqa: E402

import jaxmpi  # noqa: E402
import jaxmpi.distributed  # noqa: E402
from jaxmpi._binding import hlo_pass  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build import Program, devices_in_order, outputs_of  # noqa: E402
from generate import generate, layout_of  # noqa: E402

PROCESSES, LOCAL = layout_of(layout)
if route != "local":
    jaxmpi.distributed.initialize(collectives=route)
me = jax.process_index()
DEVICES = devices_in_order()


def path(seed: int, what: str) -> str:
    return os.path.join(out, f"{seed}.p{me}.{what}")


def write(file: str, text: str = "") -> None:
    with open(file, "w") as f:
        f.write(text)


def hung(seed: int) -> None:
    write(path(seed, "hung"), f"over {TIMEOUT} s")
    os._exit(3)


def agree(failed: bool) -> bool:
    """Whether any process failed (every process gets the same answer)."""
    if route == "local":
        return failed
    flag = jaxmpi.allreduce(np.array([int(failed)], np.int32), jaxmpi.MAX)
    return bool(np.asarray(flag)[0])


for seed in seeds:
    spec = generate(seed, PROCESSES, LOCAL, ILL_FORMED)
    write(path(seed, "start"))
    timer = threading.Timer(TIMEOUT, hung, (seed,))
    timer.daemon = True
    timer.start()
    failed = False
    before = hlo_pass.rewritten["collectives"]
    try:
        program = Program(spec, DEVICES, meshcomms=route == "jaxmpi")
        results = jax.block_until_ready(program.function()(program.place(program.input())))
        np.savez(path(seed, "npz"), **outputs_of(results))
        write(path(seed, "calls"), str(hlo_pass.rewritten["collectives"] - before))
    except Exception as err:  # whatever JAX, XLA or jaxmpi raises: recorded, not fatal
        failed = True
        write(path(seed, "error"), f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
    anyone_failed = agree(failed)
    timer.cancel()
    if anyone_failed:
        sys.exit(0)
