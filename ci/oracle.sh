#!/usr/bin/env bash
# ci/oracle.sh -- the linked backend (cargo feature `linked`, bindings from each MPI's own
# mpi.h through mpi-sys) as an oracle for jaxmpi's hand-written ABI tables, on Debian's
# Open MPI and Debian's MPICH:
#   1. builds jaxmpi-probe with --features linked against each (MPICC=mpicc.openmpi /
#      mpicc.mpich, each in its own CARGO_TARGET_DIR under target/: mpi-sys does not
#      rebuild when MPICC changes);
#   2. runs `jaxmpi-probe --oracle` at 2 ranks under that MPI's own mpirun: the linked and
#      the dlopened backend of the same library must agree on every predefined datatype
#      (MPI_Type_size, MPI_Type_get_name), the constants and status layout, the
#      communicators (MPI_Comm_compare = MPI_IDENT), every predefined op on every dtype
#      (identical reduction results), and each must pass the whole probe;
#   3. starts each linked probe under the OTHER MPI's mpirun and expects the error that
#      names the build-time MPI and the launcher.
# Exit status: 0 when everything agreed, else 1. Prints the ORACLE/PROBE lines (counts).
# Needs: ci/setup.sh (the Debian MPIs and libclang-dev for bindgen).
set -u -o pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
[[ -d $HOME/.cargo/bin ]] && PATH="$HOME/.cargo/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
t0=$SECONDS

declare -A mpicc=([openmpi]=mpicc.openmpi [mpich]=mpicc.mpich)
declare -A launcher=([openmpi]="mpirun.openmpi --oversubscribe" [mpich]="mpirun.mpich")
declare -A other=([openmpi]=mpich [mpich]=openmpi)
declare -A other_error=([openmpi]="started by an MPICH-family launcher" [mpich]="started by Open MPI's launcher")

probe_of() { printf '%s' "$root/target/linked-$1/release/jaxmpi-probe"; }

for mpi in openmpi mpich; do
    echo "== build: jaxmpi-probe --features linked with MPICC=${mpicc[$mpi]}"
    if ! MPICC=${mpicc[$mpi]} CARGO_TARGET_DIR="$root/target/linked-$mpi" \
        cargo build --quiet --release -p jaxmpi-backends --features linked --bin jaxmpi-probe; then
        echo "FAIL build against ${mpicc[$mpi]}"
        failed=$((failed + 1))
    fi
done

for mpi in openmpi mpich; do
    probe=$(probe_of "$mpi")
    [[ -x $probe ]] || continue
    echo "== oracle on Debian $mpi: ${launcher[$mpi]} -n 2 jaxmpi-probe --oracle"
    # shellcheck disable=SC2086  # the launcher is words
    out=$(timeout -k 5 300 ${launcher[$mpi]} -n 2 "$probe" --oracle 2>&1)
    rc=$?
    grep -a -E '^(ORACLE|PROBE)|FAIL' <<<"$out" | cut -c1-400
    if ((rc != 0)) || ! grep -q '^PROBE OK' <<<"$out"; then
        echo "FAIL oracle on $mpi (exit $rc)"
        failed=$((failed + 1))
    fi

    wrong=${other[$mpi]}
    echo "== linked $mpi build under ${launcher[$wrong]}: must refuse, naming both MPIs"
    # shellcheck disable=SC2086
    out=$(timeout -k 5 120 ${launcher[$wrong]} -n 2 env JAXMPI_MPI=linked "$probe" \
        --expect-error "through ${mpicc[$mpi]} at build time), but the job was ${other_error[$mpi]}" 2>&1)
    rc=$?
    if ((rc == 0)) && (($(grep -c '^PROBE OK expected-error' <<<"$out") == 2)); then
        grep -m 1 -a '^PROBE OK' <<<"$out" | cut -c1-400
    else
        echo "FAIL wrong launcher for the $mpi build (exit $rc):"
        tail -n 8 <<<"$out" | sed 's/^/      | /'
        failed=$((failed + 1))
    fi
done
echo "oracle: $failed failed ($((SECONDS - t0))s)"
((failed == 0))
