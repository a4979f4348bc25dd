#!/usr/bin/env python3
"""Writes (or checks) backends/src/xla_plugin/contract.rs: every name jaxlib's
MPItrampoline resolves in the library MPITRAMPOLINE_LIB names, with the value jaxmpi
exports for it.

The names come from jaxlib itself (the strings its libjax_common.so passes to dlsym: the
contract as shipped, 634 names for MPItrampoline 5.3.1 in jaxlib 0.6.2-0.12); the values of
the constants are the MPI-5 standard ABI's (an `mpi_abi.h`, e.g. the PyPI mpich wheel's
include/), an encoding fixed before any MPI is chosen, which jaxmpi translates at every call
(backends/src/xla_plugin/encoding.rs). Functions that calls.rs implements are left
out; every other one becomes a function that fails naming itself.

    python3 ci/xla_plugin_contract.py --jaxlib SITE/jaxlib --abi-header mpi_abi.h \\
        [--check] [--exports _native.abi3.so]

--check compares instead of writing, and fails naming each difference; --exports MODULE
(alone, or with --check) checks that a built extension module defines every name jaxlib
resolves (and those MPItrampoline reads before them). ci/test.sh runs both against every
jaxlib of the matrix.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "backends/src/xla_plugin/contract.rs"
CALLS = ROOT / "backends/src/xla_plugin/calls.rs"

# The names MPItrampoline reads by dlsym: MPIABI_* / MPIXABI_* (one per MPI constant and
# function), each NUL-terminated in libjax_common.so's read-only data.
NAME_TAIL = re.compile(rb"[A-Za-z0-9_]+\x00")


# Fortran-only sentinels MPItrampoline's C table carries but the MPI-5 C ABI does not.
NOT_IN_C_ABI = {"MPI_F_STATUS_IGNORE": ("usize", "0"), "MPI_F_STATUSES_IGNORE": ("usize", "0")}


def jaxlib_names(jaxlib: Path) -> list[str]:
    library = jaxlib / "libjax_common.so" if jaxlib.is_dir() else jaxlib
    data = library.read_bytes()  # ~350 MB: found by bytes.find, 20x faster than a regex
    names, start = set(), 0
    while (at := data.find(b"ABI_", start)) != -1:
        start = at + 4
        head = at - 4 if data[at - 4 : at] == b"MPIX" else at - 3
        before = data[head - 1 : head]
        if data[head:at] not in (b"MPI", b"MPIX") or before.isalnum() or before == b"_":
            continue
        tail = NAME_TAIL.match(data, start)
        if tail is not None:
            names.add(data[head : tail.end() - 1].decode())
    if not names:
        sys.exit(f"{library}: no MPIABI_ names: not a jaxlib with MPItrampoline")
    return sorted(names)


def abi_values(header: Path) -> dict[str, tuple[str, str]]:
    """MPI-5 ABI name -> (Rust type, value) for every constant of `mpi_abi.h`."""
    text = header.read_text()
    raw: dict[str, str] = {}
    for m in re.finditer(r"^#define\s+(MPIX?_\w+)\s+(.+?)\s*(?:/\*.*)?$", text, re.M):
        raw[m.group(1)] = m.group(2)
    for m in re.finditer(
        r"^\s+(MPIX?_\w+)\s*=\s*(-?(?:0x)?[0-9A-Fa-f]+)\s*(?:,|/\*|$)", text, re.M
    ):
        raw.setdefault(m.group(1), m.group(2))
    values: dict[str, tuple[str, str]] = {}

    def resolve(name: str, seen: tuple[str, ...] = ()) -> tuple[str, str] | None:
        definition = raw.get(name)
        if definition is None or name in seen:
            return None
        if definition in raw:  # an alias: MPI_C_COMPLEX -> MPI_C_FLOAT_COMPLEX
            return resolve(definition, (*seen, name))
        cast = re.fullmatch(r"\(\((\w+)\s*(\**)\)\s*(-?(?:0x)?[0-9A-Fa-f]+)\)", definition)
        if cast:
            kind, pointer, value = cast.groups()
            rust = "i64" if kind == "MPI_Offset" and not pointer else "usize"
            return rust, value
        if re.fullmatch(r"-?(?:0x)?[0-9A-Fa-f]+", definition):
            return "i32", definition
        return None

    for name in raw:
        value = resolve(name)
        if value is not None:
            values[name] = value
    return values


def implemented(calls: Path) -> set[str]:
    return set(re.findall(r'extern "C" fn (MPIX?ABI_\w+)\(', calls.read_text()))


def return_type(function: str) -> str:
    """What an MPI function returns when it is not an error code: MPItrampoline's table
    has these, all recognizable by name."""
    if function in ("MPI_Wtime", "MPI_Wtick"):
        return "f64"
    if function in ("MPI_Aint_add", "MPI_Aint_diff"):
        return "isize"
    if function.endswith("_f2c") and function != "MPI_Status_f2c":
        return "usize"  # a handle; MPI_Status_f2c converts into a status and returns a code
    return "i32"  # error codes, and the Fortran integers of *_c2f


def generate(names: list[str], header: Path, source: str) -> str:
    values = abi_values(header)
    done = implemented(CALLS)
    missing = done - set(names)
    if missing:
        sys.exit(f"calls.rs implements names jaxlib never resolves: {sorted(missing)}")
    constants, functions = [], []
    for abi_name in names:
        mpi_name = re.sub(r"^MPI(X?)ABI_", r"MPI\1_", abi_name)
        if mpi_name.isupper() or mpi_name in NOT_IN_C_ABI:  # a constant
            value = values.get(mpi_name) or NOT_IN_C_ABI.get(mpi_name)
            if value is None:
                sys.exit(f"{header}: no value for {mpi_name} (jaxlib resolves {abi_name})")
            rust, number = value
            if rust == "usize" and number.startswith("-"):
                sys.exit(f"{mpi_name}: negative pointer-sized value {number}")
            value = int(number, 0)
            shown = f"{value:#x}" if rust == "usize" else str(value)
            constants.append(f"    {abi_name}: {rust} = {shown};")
        elif abi_name not in done:
            functions.append(f"    {return_type(mpi_name)} {abi_name};")
    return "\n".join(
        [
            "// Generated by ci/xla_plugin_contract.py: do not edit. Every name jaxlib's",
            "// MPItrampoline resolves in the plug-in (read from jaxlib's libjax_common.so) but",
            "// those calls.rs implements: the constants with their MPI-5 standard ABI values",
            f"// ({source}), and the functions, each failing with a message that names it.",
            "",
            "exported_constants! {",
            *constants,
            "}",
            "",
            "unsupported_functions! {",
            *functions,
            "}",
            "",
        ]
    )


# What MPItrampoline reads before the table: the versions, and the call it makes once.
PREAMBLE = [
    "mpiabi_version_major", "mpiabi_version_minor", "mpiabi_version_patch",
    "mpiwrapper_version_major", "mpiwrapper_version_minor", "mpiwrapper_version_patch",
    "mpiwrapper_export_fortran_constants_",
]  # fmt: skip


def check_exports(module: Path, names: list[str]) -> int:
    listed = subprocess.run(
        ["nm", "-D", "--defined-only", str(module)], capture_output=True, text=True, check=True
    ).stdout
    defined = {line.split()[-1] for line in listed.splitlines() if line.strip()}
    missing = [name for name in PREAMBLE + names if name not in defined]
    if missing:
        print(f"{module}: {len(missing)} names jaxlib resolves are not exported: {missing[:20]}")
        return 1
    print(f"{module}: exports all {len(PREAMBLE) + len(names)} names jaxlib's MPItrampoline reads")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jaxlib", type=Path, required=True, help="jaxlib's package folder")
    parser.add_argument("--abi-header", type=Path, help="an MPI-5 mpi_abi.h (to generate)")
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--exports", type=Path, help="a built module to check instead")
    args = parser.parse_args()
    names = jaxlib_names(args.jaxlib)
    failed = check_exports(args.exports, names) if args.exports else 0
    if args.abi_header is None:
        if args.exports:
            return failed
        parser.error("--abi-header is needed to generate or --check")
    text = generate(names, args.abi_header, "MPICH 5's mpi_abi.h")
    if not args.check:
        OUTPUT.write_text(text)
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
        return 0
    committed = OUTPUT.read_text().splitlines()
    fresh = text.splitlines()
    differences = sorted(set(committed) ^ set(fresh))
    if differences:
        print(f"{args.jaxlib}: the plug-in's contract differs from {OUTPUT.relative_to(ROOT)}:")
        for line in differences:
            print(("  jaxlib needs: " if line in fresh else "  only ours:   ") + line.strip())
        return 1
    print(f"{args.jaxlib}: the contract holds every name this jaxlib resolves, as generated")
    return failed


if __name__ == "__main__":
    sys.exit(main())
