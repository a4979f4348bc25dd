"""`python -m jaxmpi info`: what a bug report needs — which MPI library jaxmpi chose and
why, its thread level, the JAX versions, CUDA-awareness, and how jitted calls are
dispatched. `python -m jaxmpi profile DIR`: a profile's files merged and summarized
(`_profile_report.py`)."""

from __future__ import annotations

import sys


def info_lines() -> list[str]:
    import jax
    import jaxlib

    from jaxmpi._binding import jax_collectives
    from jaxmpi._binding.dispatch import dispatch_mode
    from jaxmpi._runtime import support
    from jaxmpi._runtime.gpu import cuda
    from jaxmpi._runtime.library import info

    mpi4py = sys.modules.get("mpi4py")
    major, minor = info["standard_version"]
    return [
        f"jaxmpi          {_version()}",
        f"MPI library     {info['path']}",
        f"  family        {info['family']}",
        f"  version       {' '.join(info['version_string'].split())}",
        f"  standard      MPI {major}.{minor}",
        f"  chosen        {info['chosen_by']}",
        f"  calls go to   {_interposed_line(info['interposed'])}",
        f"  thread level  {info['thread_level']}",
        f"  initialized   {'by jaxmpi' if info['initialized_here'] else 'before jaxmpi (e.g. by mpi4py)'}",
        f"  CUDA-aware    {'yes' if info['cuda_aware'] else 'no'}: {info['cuda_aware_reason']}",
        f"CUDA            {_cuda_line(cuda)}",
        "dispatch        {}: {}".format(*dispatch_mode()),
        f"progress        {info['progress']}: {info['progress_reason']}",
        f"checked mode    {_checked_line()}",
        "JAX collectives {}: {}".format(*jax_collectives.explain()),
        f"mpi4jax name    {_mpi4jax_line()}",
        f"mpi4py          {mpi4py.__version__ if mpi4py else 'not installed'}",
        f"jax             {jax.__version__} (jaxmpi supports {support.SUPPORTED})",
        f"jaxlib          {jaxlib.__version__}",
        f"python          {sys.version.split()[0]} ({sys.executable})",
    ]


def _interposed_line(interposed: list[tuple[str, str]] | None) -> str:
    """Where jaxmpi's MPI calls go: to the library, or to a profiling tool loaded ahead of it
    for the functions it defines (docs/guides/profiling.md)."""
    if interposed is None:
        return "the functions the linker bound (a preloaded profiling tool sees them)"
    if not interposed:
        return "the library's own functions (no profiling tool loaded ahead of it defines any)"
    by_file: dict[str, list[str]] = {}
    for name, file in interposed:
        by_file.setdefault(file, []).append(name)
    shown = 6
    tools = "; ".join(
        f"{file} for {len(names)} function{'s' if len(names) != 1 else ''} "
        f"({', '.join(names[:shown])}{', ...' if len(names) > shown else ''})"
        for file, names in by_file.items()
    )
    return f"{tools}; the library's own for the rest"


def _mpi4jax_line() -> str:
    from jaxmpi import _mpi4jax

    presented = _mpi4jax.presented()
    if presented is not None:
        return presented
    return (
        "`import jaxmpi as mpi4jax`; JAXMPI_AS_MPI4JAX=<version> makes `import mpi4jax` find jaxmpi"
    )


def _checked_line() -> str:
    from jaxmpi import _native

    if _native.checked_mode():
        return "on (JAXMPI_CHECK=1): ranks compare every call before making it"
    return "off (JAXMPI_CHECK=1 makes ranks compare every call before making it)"


def _cuda_line(cuda: dict) -> str:
    if cuda["unused"]:
        return f"not used ({cuda['unused']})"
    if not cuda["driver"]:
        return (
            "not used (jaxlib has CUDA, but the NVIDIA driver does not load, so JAX runs on "
            f"the CPU): {cuda['driver_error']}"
        )
    if cuda["devices"] == 0:
        return f"not used (the NVIDIA driver {cuda['libcuda']} sees no GPU, so JAX runs on the CPU)"
    gpu = "chosen by JAX" if cuda["rank_gpu"] is None else f"GPU {cuda['rank_gpu']}"
    gpu += f" ({cuda['chosen']}; {cuda['when']})"
    version = cuda["driver_version"] or 0
    driver = f"driver {cuda['libcuda']} (CUDA {version // 1000}.{version % 1000 // 10})"
    return f"{driver}, {cuda['devices']} GPU(s), this rank: {gpu}, mode: {cuda['mode']}"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxmpi")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str]) -> int:
    if argv[1:2] == ["profile"]:
        from jaxmpi import _profile_report

        return _profile_report.main(argv[2:])
    if argv[1:] != ["info"]:
        print(
            "usage: python -m jaxmpi info | python -m jaxmpi profile DIR [--help]", file=sys.stderr
        )
        return 2
    print("\n".join(info_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
