# shellcheck shell=bash
# ci/steps.sh -- ci/test.sh's bookkeeping: how a step or a matrix cell is run and recorded,
# and the summary it ends with. Sourced (not executable on its own) after OUT, the log
# folder, is set; matrix_cells and suite_cells also need ci/matrix.sh. Defines:
#   step NAME LOGNAME CMD...     runs CMD, its output on the console and in OUT/LOGNAME.log
#   step_beside NAME LOGNAME CMD...  the same in the background, beside the next steps;
#                                steps_joined waits for it and shows its output
#   matrix_cells GROUP RUNNER CELL...  runs each "BUILD N [ARG...]" cell as
#                                RUNNER BUILD N LOG [ARG...] (run_cell, suite_cell, ...)
#   suite_cells GROUP            the Python suite's cells of GROUP (ci/matrix.sh's
#                                JAXMPI_SUITE_TABLE)
#   summary                      the table of every step and cell, the time table and the
#                                "N passed, N failed" line; status 1 if anything failed
#   selected WHAT                whether JAXMPI_STEPS lets WHAT run
# A step or cell is recorded under GROUP, the time table's group (set it before).
# Knobs: JAXMPI_MATRIX_BUDGET=3000: seconds for all the matrix cells together; the cells
# left when it is used up fail without running. JAXMPI_STEPS=RE: only the steps and cells
# whose "GROUP: NAME" (a step) or "GROUP BUILD n=N" (a cell) matches the extended regex RE
# run; the others are recorded as skipped (e.g. 'checks: ruff|^pytest pypi-mpich-5 n=2').

ROWS=()  # "name|version|family|ranks|result|note" (result: pass, FAIL, skip)
TIMES=() # "group|seconds|name|ranks|busy", one per row, for the time table
GROUP=setup
N_PASS=0 N_FAIL=0 N_SKIP=0
T_START=$SECONDS
MATRIX_BUDGET=${JAXMPI_MATRIX_BUDGET:-3000}
MATRIX_T0= # set by the first matrix cell

# cpu_ticks: the machine's busy and total CPU ticks so far (/proc/stat's first line: idle
# and iowait are the idle ones; guest time, after steal, is in user's already), "BUSY
# TOTAL". busy_percent T0 says how busy every core was, in percent, since cpu_ticks printed
# T0: the time table shows it, as where a step leaves cores idle (waits on a timeout, a
# download, one process) is where steps could overlap.
cpu_ticks() {
    local _cpu user nice system idle iowait irq softirq steal _guest busy
    read -r _cpu user nice system idle iowait irq softirq steal _guest </proc/stat
    busy=$((user + nice + system + irq + softirq + steal))
    echo "$busy $((busy + idle + iowait))"
}
busy_percent() { # T0 [T1]: from cpu_ticks's T0 to T1 (default: now)
    local busy0 total0 busy1 total1
    read -r busy0 total0 <<<"$1"
    read -r busy1 total1 <<<"${2:-$(cpu_ticks)}"
    ((total1 > total0)) && echo $((100 * (busy1 - busy0) / (total1 - total0))) || echo -
}
T_TICKS=$(cpu_ticks)

record() { # record NAME VERSION FAMILY RANKS RESULT NOTE SECONDS [BUSY]
    local f=("$@")
    f=("${f[@]//|//}") # "|" separates the fields of a row
    ROWS+=("${f[0]}|${f[1]}|${f[2]}|${f[3]}|${f[4]}|${f[5]}")
    TIMES+=("$GROUP|${f[6]}|${f[0]}|${f[3]}|${f[7]:--}")
    case $5 in
    pass) N_PASS=$((N_PASS + 1)) ;;
    skip) N_SKIP=$((N_SKIP + 1)) ;;
    *) N_FAIL=$((N_FAIL + 1)) ;;
    esac
}

banner() { printf '\n===== %s =====\n' "$*"; }

selected() { [[ -z ${JAXMPI_STEPS:-} || $1 =~ $JAXMPI_STEPS ]]; }

# left_out NAME: records the step NAME as skipped where JAXMPI_STEPS leaves it out (status
# 0), else does nothing (status 1).
left_out() {
    selected "$GROUP: $1" && return 1
    record "$1" - - - skip "not in JAXMPI_STEPS" 0
}

# The output goes both to the console (CI shows progress) and to the log.
step() {
    local name=$1 log="$OUT/$2.log" t0=$SECONDS rc ticks
    shift 2
    left_out "$name" && return 0
    banner "$name"
    ticks=$(cpu_ticks)
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    step_ended "$name" "$log" "$t0" "$ticks" "$rc"
}

# step_ended NAME LOG T0 TICKS RC [T1 TICKS1]: records the step, from T0 and TICKS (SECONDS
# and cpu_ticks at its start) to T1 and TICKS1 (at its end; default: now), and prints its
# last line.
step_ended() {
    local name=$1 log=$2 t0=$3 ticks=$4 rc=$5 t1=${6:-$SECONDS} ticks1=${7:-$(cpu_ticks)}
    local secs=$((t1 - t0)) busy
    busy=$(busy_percent "$ticks" "$ticks1")
    if ((rc == 0)); then
        record "$name" - - - pass "${secs}s" "$secs" "$busy"
    else
        record "$name" - - - FAIL "exit status $rc, log .ci-out/${log##*/}" "$secs" "$busy"
    fi
    printf -- '----- %s: %s (%ss)\n' "$name" "$([[ $rc == 0 ]] && echo pass || echo "FAIL (exit $rc)")" "$secs"
}

# step_beside NAME LOGNAME CMD...: a step started in the background, beside the steps that
# follow until steps_joined; its output goes to its log alone, shown when it is joined. For
# steps that leave the cores idle much of the time (waiting on a launcher, a time limit, a
# watchdog), beside others of the kind; they must share no resource. Its busy percentage
# is then the machine's, both steps' work.
BESIDE=() # "pid|name|log|t0|ticks|group" of each step still beside
step_beside() {
    local name=$1 log="$OUT/$2.log"
    shift 2
    left_out "$name" && return 0
    printf '\n===== %s: started beside the next steps (its output when it ends) =====\n' "$name"
    {
        "$@" </dev/null >"$log" 2>&1
        local rc=$?
        echo "$SECONDS $(cpu_ticks)" >"$log.end" # when it ended, not when it is joined
        exit "$rc"
    } &
    BESIDE+=("$!|$name|$log|$SECONDS|$(cpu_ticks)|$GROUP")
}

steps_joined() { # waits for every step_beside, then shows and records each
    local entry pid name log t0 ticks group rc t1 ticks1
    for entry in "${BESIDE[@]}"; do
        IFS='|' read -r pid name log t0 ticks group <<<"$entry"
        wait "$pid"
        rc=$?
        t1=$SECONDS ticks1=
        [[ -s $log.end ]] && read -r t1 ticks1 <"$log.end"
        rm -f "$log.end"
        banner "$name (ran beside others)"
        cat "$log"
        GROUP=$group step_ended "$name" "$log" "$t0" "$ticks" "$rc" "$t1" "$ticks1"
    done
    BESIDE=()
}

# Each cell is capped by its own timeout, but many hanging cells would still add up: past
# the budget the remaining cells fail unrun. The runner sets CELL_RESULT (pass, skip or
# fail), CELL_NOTE, and CELL_VERSION and CELL_FAMILY where it knows them.
matrix_cells() {
    local group=$1 runner=$2 cell build n log t0 result note ticks
    local -a args
    shift 2
    [[ -n $MATRIX_T0 ]] || MATRIX_T0=$SECONDS
    for cell in "$@"; do
        read -r build n _ <<<"$cell"
        read -r -a args <<<"$cell"
        log="$OUT/matrix/$group-$build-n$n.log"
        t0=$SECONDS ticks=$(cpu_ticks)
        if ! selected "$group $build n=$n"; then
            CELL_RESULT=skip CELL_VERSION="" CELL_FAMILY="" CELL_NOTE="not in JAXMPI_STEPS"
        elif ((SECONDS - MATRIX_T0 > MATRIX_BUDGET)); then
            CELL_RESULT=fail CELL_VERSION="" CELL_FAMILY=""
            CELL_NOTE="not run: matrix time budget (${MATRIX_BUDGET}s) used up"
            echo "$CELL_NOTE" >"$log"
        else
            "$runner" "$build" "$n" "$log" "${args[@]:2}"
        fi
        case $CELL_RESULT in
        pass) result=pass ;;
        skip) result=skip ;;
        *) result=FAIL ;;
        esac
        note="$CELL_NOTE"
        [[ $result == FAIL ]] && note="$note; log .ci-out/matrix/${log##*/}"
        [[ $result == pass ]] && note="${note:+$note, }$((SECONDS - t0))s"
        GROUP=$group record "$group $build" "${CELL_VERSION:--}" "${CELL_FAMILY:-${JAXMPI_MATRIX_FAMILY[$build]}}" "$n" "$result" "$note" "$((SECONDS - t0))" "$(busy_percent "$ticks")"
        printf '%-28s n=%s  %s  %s\n' "$group $build" "$n" "$result" "$note"
        # Enough of the log to diagnose without opening the file.
        [[ $result == FAIL ]] && sed 's/^/    | /' < <(tail -n 40 "$log")
    done
}

# suite_cell BUILD N LOG KIND [K=V...]: what a cell of KIND runs (tests/python/selection.py).
suite_cell() {
    local build=$1 n=$2 log=$3 kind=$4
    shift 4
    PYTEST_CELL=$kind run_pytest_cell "$build" "$n" "$log" "$@"
}

suite_cells() {
    local -a cells
    mapfile -t cells < <(matrix_suite_cells "$1")
    matrix_cells "$1" suite_cell "${cells[@]}"
}

# What failed, last, each with the end of its log: where only the end of a run's output
# is kept (CI's report), it still names what failed and why.
failures() {
    local row name ranks result note log
    ((N_FAIL > 0)) || return 0
    banner "failed ($N_FAIL)"
    for row in "${ROWS[@]}"; do
        IFS='|' read -r name _ _ ranks result note <<<"$row"
        [[ $result == FAIL ]] || continue
        printf '%s%s: %s\n' "$name" "$([[ $ranks != - ]] && echo " (n=$ranks)")" "$note"
        log=$(grep -o '\.ci-out/[^ ;,]*\.log' <<<"$note" | tail -n 1)
        log=$OUT/${log#.ci-out/}
        [[ -f $log ]] && sed 's/^/    | /' < <(tail -n 15 "$log")
    done
}

# Wall seconds per group (in run order), each group's items slowest first, setup's own
# parts from its log, and the total: where the time goes, to keep the run under its
# budget (45 minutes on an idle 2-core machine; CI allows 90).
time_table() {
    local -a groups=()
    local -A sum=()
    local row group secs name ranks busy
    for row in "${TIMES[@]}"; do
        IFS='|' read -r group secs _ <<<"$row"
        [[ -v sum[$group] ]] || groups+=("$group")
        sum[$group]=$((${sum[$group]:-0} + secs))
    done
    banner "time table (wall seconds; busy: how busy the cores were, in percent)"
    for group in "${groups[@]}"; do
        printf '%6ss       %s\n' "${sum[$group]}" "$group"
        for row in "${TIMES[@]}"; do
            IFS='|' read -r _ secs name ranks busy <<<"$row"
            [[ $row == "$group|"* ]] && printf '%s|%s|%s|%s\n' "$secs" "$name" "$ranks" "$busy"
        done | sort -t'|' -k1,1nr | while IFS='|' read -r secs name ranks busy; do
            printf '%6ss %4s%%      %s%s\n' "$secs" "$busy" "$name" "$([[ $ranks != - ]] && echo " (n=$ranks)")"
        done
        if [[ $group == setup && -f $OUT/setup.log ]]; then
            sed -n '/^setup: all done/d; s/^setup: \(.*\) done (\([0-9]*\)s)$/\2|\1/p' "$OUT/setup.log" |
                while IFS='|' read -r secs name; do printf '%6ss               %s\n' "$secs" "$name"; done
        fi
    done
    printf '%6ss %4s%%  total (wall, %s min)\n' "$((SECONDS - T_START))" "$(busy_percent "$T_TICKS")" \
        "$(((SECONDS - T_START + 30) / 60))"
}

summary() {
    local fmt='%-36s %-44s %-8s %-5s %-6s %s\n' row name version family ranks result note line
    banner "summary ($((SECONDS - T_START))s)"
    # shellcheck disable=SC2059  # the format is ours
    printf "$fmt" "MPI build / step" "version" "family" "ranks" "result" "notes"
    for row in "${ROWS[@]}"; do
        IFS='|' read -r name version family ranks result note <<<"$row"
        # Library version strings carry tabs/newlines and build details: keep the
        # first 44 characters with whitespace squeezed.
        version=$(tr -s '[:space:]' ' ' <<<"$version" | sed 's/ *$//')
        ((${#version} > 44)) && version="${version:0:43}~"
        # shellcheck disable=SC2059
        printf "$fmt" "$name" "$version" "$family" "$ranks" "$result" "$note"
    done
    time_table
    failures
    line="$N_PASS passed, $N_FAIL failed"
    ((N_SKIP > 0)) && line+=", $N_SKIP skipped"
    echo "$line"
    ((N_FAIL == 0))
}
