#!/usr/bin/env bash
# Runs every relaybus test suite and prints, as its very last line,
#     N passed, N failed
# (the sum over all suites). Exits non-zero if anything failed or a suite could
# not run: a suite that cannot run counts as one failure, never as skipped.
#
# Steps: install deps, make + make install (top-level PGXS Makefile), core unit
# tests (make -C test/core check, GoogleTest; again as suite core-asan under
# AddressSanitizer + UBSan: make -C test/core check-asan; the Kafka producer
# against a real broker as suite core-kafka: test/core/kafka/run.sh), a template
# cluster (test/cluster.sh init) that every suite's cluster is a copy of,
# pg_regress + isolation (make installcheck), pgTAP (pg_prove in database
# relay_tap), and every executable test/integration/*.sh.
#
# After the deps, all of it runs as jobs in one pool (test/README.md, "How a
# full run is organised"): setup first, then the suites side by side, each
# integration script on a cluster of its own (the relaybus-mongo scripts,
# which source mongo_lib.sh, on FerretDB instead). Each job's logs are shown
# whole when it ends. core-asan's compile runs in the background at nice 19.
# Every step and suite line, and the summary, give its wall time.
#
# Environment: JOBS (parallel make, default nproc), RELAYBUS_TEST_JOBS (jobs at
# a time, default 3 x JOBS), RELAYBUS_SUITE_TIMEOUT (seconds per suite, default
# 1800), RELAYBUS_INTEGRATION_TIMEOUT (seconds per integration script, default
# 1200), RELAYBUS_KEEP_CLUSTER=1 (do not destroy the cluster of regress,
# isolation and pgtap, nor that of a failed integration script), RELAYBUS_CACHE
# (where job-times is kept), RELAYBUS_EDITION=managed (only the integration
# scripts of both editions, against the managed SQL edition and relaybus-agent),
# plus test/cluster.sh's variables.
#
# Parser self-test:  test/run_all.sh --parse {gtest|regress|tap|plain} LOGFILE [RC]
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)

# ---------------------------------------------------------------- parsers
# Each reads a captured log and prints "PASSED FAILED".

# GoogleTest: "[  PASSED  ] N test(s)." and "[  FAILED  ] N test(s), listed below:",
# summed over binaries. A binary that died before its summary: count its
# "[       OK ]" lines as passed and its unfinished "[ RUN      ]" as failed.
parse_gtest() {
    awk '
        /^\[  PASSED  \] [0-9]+ tests?\./                { p += $4; s = 1 }
        /^\[  FAILED  \] [0-9]+ tests?, listed below/     { f += $4; s = 1 }
        /^\[ RUN      \] /                                { run++ }
        /^\[       OK \] /                                { ok++ }
        END {
            if (s) print p + 0, f + 0
            else   print ok + 0, (run - ok > 0 ? run - ok : 0)
        }' "$1"
}

# pg_regress / pg_isolation_regress summaries. PostgreSQL 15:
#   " All N tests passed. "
#   " P of N tests passed, I failed test(s) ignored. "
#   " F of N tests failed. "
#   " F of N tests failed, I of these failures ignored. "
# PostgreSQL 16 and later print TAP: "# All N tests passed.", "# F of N tests failed."
# ("# F of N tests failed, I of these failures ignored.") after "ok N - name" /
# "not ok N - name" lines.
# Without a summary (pg_regress aborted), count the per-test lines.
parse_regress() {
    awk '
        { sub(/^# /, " ") }
        /^ All [0-9]+ tests passed\./                                      { p += $2; s = 1 }
        /^ [0-9]+ of [0-9]+ tests passed, [0-9]+ failed test\(s\) ignored/ { p += $1; s = 1 }
        /^ [0-9]+ of [0-9]+ tests failed\./                                { f += $1; p += $3 - $1; s = 1 }
        /^ [0-9]+ of [0-9]+ tests failed, [0-9]+ of these failures ignored/ { f += $1 - $6; p += $3 - $1; s = 1 }
        / \.\.\. ok( |$)/ || /^ok [0-9]+ /                                  { tok++ }
        / \.\.\. FAILED/ || /^not ok [0-9]+ /                               { tfail++ }
        END {
            if (s) print p + 0, f + 0
            else   print tok + 0, tfail + 0
        }' "$1"
}

# pg_prove (TAP::Harness): "Files=F, Tests=T" counts the assertions that ran;
# the summary report's "(... Tests: T Failed: F)" the ones that failed. Per file,
# "Failed X/Y subtests" counts failed plus planned-but-not-run assertions;
# "No subtests run" (died before its plan) and "Dubious" + "All N subtests
# passed" (non-zero exit) count as one failure each.
parse_tap() {
    awk '
        /^Files=[0-9]+, Tests=[0-9]+/ {
            t = $2; sub(/^Tests=/, "", t); sub(/,$/, "", t); total += t; s = 1
        }
        /\(Wstat: .* Failed: [0-9]+\)/ {
            x = $0; sub(/.*Failed: /, "", x); sub(/\).*/, "", x); fa += x
        }
        /^Dubious, test returned/                  { dub = 1 }
        /^Failed [0-9]+\/[0-9]+ subtests/          { split($2, a, "/"); f += a[1]; dub = 0 }
        /^No subtests run/                         { f += 1; dub = 0 }
        /^All [0-9]+ subtests passed/              { if (dub) f += 1; dub = 0 }
        /^Result: FAIL/                            { rfail = 1 }
        END {
            if (!s) { print 0, 0; exit }
            if (rfail && f == 0) f = 1
            print total - fa, f + 0
        }' "$1"
}

# An integration script's own last "N passed, N failed" line (one word and a
# colon may stand before it; ", N skipped" may follow).
parse_plain() {
    local line
    line=$(grep -E '^([^ ]+: )?[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?[[:space:]]*$' "$1" | tail -n 1)
    if [[ -z "$line" ]]; then
        echo "0 0"
        return
    fi
    line=${line#*: }
    awk '{ print $1 + 0, $3 + 0 }' <<<"$line"
}

# The wall time of each job in earlier runs, for the order of the next.
TIMES_FILE=${RELAYBUS_CACHE:-$HOME/.cache/relaybus}/job-times
declare -A JOB_SECS=()
# save_job_times: this run's wall time per job, for the next run's order. A
# shorter time replaces the one recorded; a longer one raises it by half the
# difference, so that one run on a loaded machine (a suite three times its
# usual length) does not reorder the next ones.
save_job_times() {
    local name tmp
    mkdir -p "$(dirname "$TIMES_FILE")" 2>/dev/null || return 0
    tmp=$(mktemp "$TIMES_FILE.XXXXXX") || return 0
    {
        for name in "${!JOB_SECS[@]}"; do echo "new $name ${JOB_SECS[$name]}"; done
        if [[ -f "$TIMES_FILE" ]]; then sed 's/^/old /' "$TIMES_FILE"; fi
    } | awk '$1 == "new" { t[$2] = $3; next }
             !($2 in t) { t[$2] = $3; next }
             $3 < t[$2] { t[$2] = int((t[$2] + $3 + 1) / 2) }
             END { for (n in t) print n, t[n] }' | sort >"$tmp" && mv -f "$tmp" "$TIMES_FILE"
}

# test/run_all.sh --save-job-times NAME SECS...: what a run records at its end
# (test/integration/run_all_times.sh).
if [[ "${1:-}" == --save-job-times ]]; then
    shift
    while (($# >= 2)); do JOB_SECS[$1]=$2; shift 2; done
    save_job_times
    exit 0
fi

if [[ "${1:-}" == --parse ]]; then
    (($# >= 3)) || { echo "usage: $0 --parse {gtest|regress|tap|plain} LOGFILE [RC]" >&2; exit 2; }
    read -r p f < <("parse_$2" "$3")
    rc=${4:-0}
    if ((rc != 0 && f == 0)); then f=1; fi
    if ((p + f == 0)); then f=1; fi
    echo "$p passed, $f failed"
    exit 0
fi

# ---------------------------------------------------------------- bookkeeping
cd "$ROOT" || exit 1
LOGDIR=$(mktemp -d /tmp/relaybus-run.XXXXXX)
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
SUITE_TIMEOUT=${RELAYBUS_SUITE_TIMEOUT:-1800}
INTEGRATION_TIMEOUT=${RELAYBUS_INTEGRATION_TIMEOUT:-1200}
TOTAL_PASSED=0
TOTAL_FAILED=0
SUMMARY=()
CLUSTER_DIR=
TEMPLATE_DIR=

CHILD=
RC=0

# run_logged LIMIT LOG CMD...: runs CMD under a time limit with its output in LOG,
# shown live; sets RC. In the background, so that a signal reaches our trap at
# once (which then stops CMD's whole process group through timeout).
run_logged() {
    local limit=$1 log=$2 tailpid=
    shift 2
    : >"$log"
    RUN_T0=$(date +%s)
    timeout -k 30 "$limit" "$@" </dev/null >"$log" 2>&1 &
    CHILD=$!
    if [[ -z "${RUN_QUIET:-}" ]]; then
        tail -n +1 -s 0.2 -f --pid="$CHILD" "$log" &
        tailpid=$!
    fi
    wait "$CHILD"
    RC=$?
    CHILD=
    RUN_SECS=$(($(date +%s) - RUN_T0))
    [[ -n "$tailpid" ]] && wait "$tailpid" 2>/dev/null
    return 0
}

banner() { printf '\n======== %s ========\n' "$*"; }

# record NAME PASSED FAILED [NOTE]: a suite's result; nothing for a suite that
# RELAYBUS_SUITES leaves out (one that could not run is still one failure).
record() {
    wanted "$1" || return 0
    local line="suite $1: $2 passed, $3 failed${4:+ ($4)}"
    TOTAL_PASSED=$((TOTAL_PASSED + $2))
    TOTAL_FAILED=$((TOTAL_FAILED + $3))
    SUMMARY+=("$line")
    echo "$line"
}

# RELAYBUS_EDITION=managed: the integration scripts that run in both editions
# (a "# editions: extension managed" line), against the managed SQL edition and
# relaybus-agent instead of the extension (test/integration/lib.sh); nothing else.
EDITION=${RELAYBUS_EDITION:-extension}
EDITION_SUITES=()
if [[ $EDITION == managed ]]; then
    for t in test/integration/*.sh; do
        grep -q '^# editions: extension managed$' "$t" && EDITION_SUITES+=("integration/$(basename "$t" .sh)")
    done
fi

# RELAYBUS_SUITES (space-separated shell patterns, e.g. "core integration/notify*"):
# run only the suites it names, for development; unset (CI, make test) runs all.
wanted() {
    if [[ $EDITION == managed ]]; then
        [[ " ${EDITION_SUITES[*]} " == *" $1 "* ]] || return 1
    fi
    [[ -z "${RELAYBUS_SUITES:-}" ]] && return 0
    local pat pats
    # Split on spaces without expanding the patterns as file names (with
    # nullglob on, "integration/notify*" used to select nothing).
    read -r -a pats <<<"$RELAYBUS_SUITES"
    for pat in "${pats[@]}"; do
        # shellcheck disable=SC2053
        [[ "$1" == $pat ]] && return 0
    done
    return 1
}

# A setup step: ok, or one failure.
step() {
    local name=$1
    shift
    banner "step $name: $*"
    run_logged "$SUITE_TIMEOUT" "$LOGDIR/step-$name.log" "$@"
    if ((RC == 0)); then
        SUMMARY+=("step $name: ok ($RUN_SECS s)")
        echo "step $name: ok ($RUN_SECS s)"
        return 0
    fi
    SUMMARY+=("step $name: FAILED ($RUN_SECS s)")
    echo "step $name: FAILED ($RUN_SECS s)"
    TOTAL_FAILED=$((TOTAL_FAILED + 1))
    return 1
}

# record_suite NAME PARSER LIMIT LOG RC SECS: parses a finished suite's log and
# records its counts (sets LAST_LOG, LAST_FAILED).
record_suite() {
    local name=$1 parser=$2 limit=$3 log=$4 rc=$5 p f note="$6 s"
    read -r p f < <("parse_$parser" "$log")
    if ((rc == 124 || rc == 137)); then
        note="$note, timed out after ${limit}s"
    elif ((rc != 0)); then
        note="$note, exit code $rc"
    fi
    if ((rc != 0 && f == 0)); then f=1; fi
    if ((p + f == 0)); then
        f=1
        note="${note:+$note, }no test ran"
    fi
    record "$name" "$p" "$f" "$note"
    LAST_LOG=$log
    LAST_FAILED=$f
}

# ---------------------------------------------------------------- the pool
# After the deps, everything is a job in one pool of RELAYBUS_TEST_JOBS slots
# (default 3 per CPU: most suites spend their time waiting on leases, brokers,
# receivers and servers, not computing). A job runs in a background subshell;
# each of its steps and suites writes its own log and one line to the job's
# results file. When a job ends, the main shell shows its logs whole and
# records them like any other, so the output comes in the order jobs end
# (nothing is shown while a job runs). A job starts once the jobs it needs have
# ended, the longest first by its wall time in earlier runs
# ($RELAYBUS_CACHE/job-times), so that a long suite does not start last.
POOL_SIZE=${RELAYBUS_TEST_JOBS:-$((3 * JOBS))}
declare -A JOB_CMD=() JOB_NEEDS=() JOB_PRIO=() JOB_PID=() JOB_RC=() JOB_T0=() STEP_OK=()
PENDING=()
RUNNING=()
TIMELINE=()
POOL_T0=
mkdir -p "$LOGDIR/jobs"

job_file() { printf '%s/jobs/%s' "$LOGDIR" "$(tr '/ ' '__' <<<"$1")"; }

# add_job NAME NEEDS PRIORITY CMD...: NEEDS, the jobs that must have ended
# first (a job not queued counts as ended; asan-prebuild is the background
# build below); PRIORITY, empty for the job's wall time in earlier runs.
add_job() {
    local name=$1 needs=$2 prio=$3
    shift 3
    if [[ -z "$prio" ]]; then
        prio=$(awk -v n="$name" '$1 == n { t = $2 } END { print t + 0 }' "$TIMES_FILE" 2>/dev/null)
        ((prio > 0)) || prio=60
    fi
    JOB_CMD[$name]=$(printf '%q ' "$@")
    JOB_NEEDS[$name]=$needs
    JOB_PRIO[$name]=$prio
    PENDING+=("$name")
}

job_ready() {
    local n
    for n in ${JOB_NEEDS[$1]}; do
        if [[ $n == asan-prebuild ]]; then
            [[ -z "$ASAN_PREBUILD_PID" ]] || return 1
        elif [[ -n "${JOB_CMD[$n]:-}" && -z "${JOB_RC[$n]:-}" ]]; then
            return 1
        fi
    done
    return 0
}

# Inside a job (the subshell): JOB_RESULTS is its results file, JOB_CLUSTER a
# cluster to destroy if it is stopped.
job_abort() {
    [[ -n "$CHILD" ]] && kill -TERM "$CHILD" 2>/dev/null && wait "$CHILD" 2>/dev/null
    [[ -n "$JOB_CLUSTER" ]] && bash "$ROOT/test/cluster.sh" destroy "$JOB_CLUSTER" >/dev/null 2>&1
    exit 130
}

start_job() {
    local name=$1 f
    f=$(job_file "$name")
    : >"$f.results"
    (
        JOB_RESULTS=$f.results
        JOB_CLUSTER=
        CHILD=
        trap - EXIT
        trap job_abort TERM INT HUP
        eval "${JOB_CMD[$name]}"
    ) </dev/null &
    JOB_PID[$name]=$!
    JOB_T0[$name]=$SECONDS
    RUNNING+=("$name")
}

# job_step NAME CMD...: a setup step, in a job; returns non-zero if it failed.
job_step() {
    local name=$1 log=$LOGDIR/step-$1.log
    shift
    RUN_QUIET=1 run_logged "$SUITE_TIMEOUT" "$log" "$@"
    echo "step $name $RC $RUN_SECS $log $*" >>"$JOB_RESULTS"
    ((RC == 0))
}

# job_suite NAME PARSER LIMIT CMD...: a suite, in a job. Its banner shows
# JOB_SHOW if set, else CMD.
job_suite() {
    local name=$1 parser=$2 limit=$3 log
    shift 3
    log="$LOGDIR/$(tr '/ ' '__' <<<"$name").log"
    RUN_QUIET=1 run_logged "$limit" "$log" "$@"
    echo "suite $name $parser $limit $RC $RUN_SECS $log ${JOB_SHOW:-$*}" >>"$JOB_RESULTS"
}

# job_fail NAME NOTE: a suite that could not run (one failure).
job_fail() { echo "fail $1 $2" >>"$JOB_RESULTS"; }

# collect_job NAME: the job has ended; show and record what it ran.
collect_job() {
    local name=$1 kind n rest parser limit rc secs log cmd any=no
    wait "${JOB_PID[$name]}"
    JOB_RC[$name]=$?
    JOB_SECS[$name]=$((SECONDS - JOB_T0[$name]))
    TIMELINE+=("$(printf '%5d %5d  %s' $((JOB_T0[$name] - POOL_T0)) $((SECONDS - POOL_T0)) "$name")")
    while read -r kind n rest; do
        any=yes
        case $kind in
            step)
                read -r rc secs log cmd <<<"$rest"
                banner "step $n: $cmd"
                cat "$log"
                if ((rc == 0)); then
                    STEP_OK[$n]=yes
                    SUMMARY+=("step $n: ok ($secs s)")
                    echo "step $n: ok ($secs s)"
                else
                    STEP_OK[$n]=no
                    SUMMARY+=("step $n: FAILED ($secs s)")
                    echo "step $n: FAILED ($secs s)"
                    TOTAL_FAILED=$((TOTAL_FAILED + 1))
                fi
                ;;
            suite)
                read -r parser limit rc secs log cmd <<<"$rest"
                banner "suite $n: $cmd"
                cat "$log"
                record_suite "$n" "$parser" "$limit" "$log" "$rc" "$secs"
                if ((LAST_FAILED > 0)); then
                    [[ $n == regress ]] && show_diffs "$log" \
                        "$ROOT/results_regress/regression.diffs" "$ROOT/regression.diffs"
                    [[ $n == isolation ]] && show_diffs "$log" \
                        "$ROOT/results_isolation/regression.diffs" "$ROOT/output_iso/regression.diffs"
                    if [[ -s "$log.server" ]]; then
                        banner "server log of $n (last 100 lines)"
                        cat "$log.server"
                    fi
                fi
                ;;
            fail)
                banner "suite $n"
                record "$n" 0 1 "$rest"
                ;;
        esac
    done <"$(job_file "$name").results"
    if [[ $any == no ]]; then
        SUMMARY+=("job $name: ended without a result (exit ${JOB_RC[$name]})")
        echo "job $name: ended without a result (exit ${JOB_RC[$name]})"
        TOTAL_FAILED=$((TOTAL_FAILED + 1))
    fi
}

run_pool() {
    local name best alive still
    while ((${#PENDING[@]} + ${#RUNNING[@]} > 0)); do
        alive=" $(jobs -rp | tr '\n' ' ') "
        still=()
        for name in "${RUNNING[@]}"; do
            if [[ "$alive" == *" ${JOB_PID[$name]} "* ]]; then
                still+=("$name")
            else
                collect_job "$name"
            fi
        done
        RUNNING=("${still[@]}")
        if [[ -n "$ASAN_PREBUILD_PID" && "$alive" != *" $ASAN_PREBUILD_PID "* ]]; then
            wait "$ASAN_PREBUILD_PID"
            ASAN_PREBUILD_PID=
        fi
        while ((${#RUNNING[@]} < POOL_SIZE)); do
            best=
            for name in "${PENDING[@]}"; do
                job_ready "$name" || continue
                if [[ -z "$best" ]] || ((JOB_PRIO[$name] > JOB_PRIO[$best])); then best=$name; fi
            done
            [[ -n "$best" ]] || break
            still=()
            for name in "${PENDING[@]}"; do [[ "$name" == "$best" ]] || still+=("$name"); done
            PENDING=("${still[@]}")
            start_job "$best"
        done
        ((${#PENDING[@]} + ${#RUNNING[@]} > 0)) && sleep 0.5
    done
}

# ---------------------------------------------------------------- the jobs
job_build() {
    job_step build make -j"$JOBS" PG_CONFIG="$PG_CONFIG" && job_step install make install PG_CONFIG="$PG_CONFIG"
    job_step listen-client bash test/integration/lib.sh --build-client
}

job_core() {
    wanted core && job_suite core gtest "$SUITE_TIMEOUT" make -C test/core -j"$JOBS" check
    # KafkaSink against a real single-node broker that the suite starts.
    wanted core-kafka && job_suite core-kafka gtest "$SUITE_TIMEOUT" bash test/core/kafka/run.sh
}

# The core tests built with AddressSanitizer + UndefinedBehaviorSanitizer (leak
# detection on): a memory error or UB aborts the binary, which fails the suite.
job_core_asan() {
    job_suite core-asan gtest "$SUITE_TIMEOUT" make -C test/core -j"$JOBS" check-asan
}

cluster_is_up() { bash "$ROOT/test/cluster.sh" status "$CLUSTER_DIR" >/dev/null 2>&1; }

# regress, isolation and pgtap, one after another on the first cluster. Two
# make runs, so that a failing pg_regress does not keep the isolation tests
# from running (PGXS's installcheck stops at the first failing command).
job_main_suites() {
    local s tap_files
    if [[ "${STEP_OK[cluster]:-}" != yes ]] \
        || ! job_step main-cluster bash "$ROOT/test/cluster.sh" clone "$TEMPLATE_DIR" "$CLUSTER_DIR"; then
        for s in regress isolation pgtap; do wanted $s && job_fail $s "no cluster"; done
        return
    fi
    # shellcheck disable=SC1091
    source "$CLUSTER_DIR/env"
    export PGHOST PGPORT PGUSER PGDATABASE RELAYBUS_CLUSTER_DIR
    wanted regress && job_suite regress regress "$SUITE_TIMEOUT" make installcheck ISOLATION= PG_CONFIG="$PG_CONFIG"
    cluster_is_up || bash "$ROOT/test/cluster.sh" start "$CLUSTER_DIR" >/dev/null 2>&1
    wanted isolation && job_suite isolation regress "$SUITE_TIMEOUT" make installcheck REGRESS= PG_CONFIG="$PG_CONFIG"
    cluster_is_up || bash "$ROOT/test/cluster.sh" start "$CLUSTER_DIR" >/dev/null 2>&1
    wanted pgtap || return 0
    shopt -s nullglob
    tap_files=(test/pgtap/*.sql)
    shopt -u nullglob
    if ((${#tap_files[@]} == 0)); then
        job_fail pgtap "no test/pgtap/*.sql"
    elif ! psql -X -q -v ON_ERROR_STOP=1 -d postgres \
            -c 'SET client_min_messages = warning' \
            -c 'DROP DATABASE IF EXISTS relay_tap' -c 'CREATE DATABASE relay_tap' </dev/null \
         || ! psql -X -q -v ON_ERROR_STOP=1 -d relay_tap \
            -c 'CREATE EXTENSION pgtap' -c 'CREATE EXTENSION relaybus' </dev/null; then
        job_fail pgtap "could not set up database relay_tap"
    else
        job_suite pgtap tap "$SUITE_TIMEOUT" \
            pg_prove -h "$PGHOST" -p "$PGPORT" -U postgres -d relay_tap "${tap_files[@]}"
    fi
}

# One integration script. A relaybus-mongo script (it sources mongo_lib.sh)
# uses FerretDB, the receiver and the sidecar, never a cluster; any other gets
# a cluster of its own, a copy of the template, so that what it does to its
# server (settings, restarts, crashes, SIGSTOP, reading the log) reaches no
# other suite. Its last 100 lines of server log are shown if it fails.
job_integration() {
    local t=$1 name log
    name="integration/$(basename "$t" .sh)"
    if grep -q 'mongo_lib\.sh' "$t"; then
        job_suite "$name" plain "$INTEGRATION_TIMEOUT" "$ROOT/$t"
        return
    fi
    if [[ "${STEP_OK[cluster]:-}" != yes ]]; then
        job_fail "$name" "no cluster"
        return
    fi
    JOB_CLUSTER=$(mktemp -d /tmp/relaybus-it.XXXXXX)
    log="$LOGDIR/$(tr '/ ' '__' <<<"$name").log"
    JOB_SHOW="$ROOT/$t (its cluster: $JOB_CLUSTER)"
    job_suite "$name" plain "$INTEGRATION_TIMEOUT" bash -c \
        'bash "$1" clone "$2" "$3" || exit 1; source "$3/env"; exec "$4"' "$name" \
        "$ROOT/test/cluster.sh" "$TEMPLATE_DIR" "$JOB_CLUSTER" "$ROOT/$t"
    if ((RC != 0)); then
        tail -n 100 "$JOB_CLUSTER/log/postgresql.log" >"$log.server" 2>/dev/null
        if [[ "${RELAYBUS_KEEP_CLUSTER:-0}" == 1 ]]; then
            echo "(cluster kept: source $JOB_CLUSTER/env; test/cluster.sh destroy $JOB_CLUSTER)" >>"$log.server"
            return
        fi
    fi
    bash "$ROOT/test/cluster.sh" destroy "$JOB_CLUSTER" >/dev/null 2>&1
    JOB_CLUSTER=
}

# core-asan's build is minutes of compiling and seconds of testing: it goes on
# in the background from the start at the lowest CPU priority, on the CPU the
# waiting suites leave idle, outside the pool; the job core-asan starts when
# it has ended (its make then only runs the tests; a failed prebuild leaves
# the suite's own make to build and report).
ASAN_PREBUILD_PID=
start_asan_prebuild() {
    [[ -f test/core/Makefile ]] && wanted core-asan || return 0
    timeout -k 30 "$SUITE_TIMEOUT" nice -n 19 make -C test/core -j"$JOBS" "$ROOT/test/core/core_tests_asan" \
        </dev/null >"$LOGDIR/asan-prebuild.log" 2>&1 &
    ASAN_PREBUILD_PID=$!
}

# Print the diffs named by pg_regress ("... can be viewed in the file "X"."),
# else the first existing of the candidates given.
show_diffs() {
    local log=$1 files f
    shift
    files=$(grep -o 'file "[^"]*regression\.diffs"' "$log" | sed 's/^file "//; s/"$//')
    if [[ -z "$files" ]]; then
        for f in "$@"; do
            if [[ -f "$f" ]]; then files=$f; break; fi
        done
    fi
    for f in $files; do
        [[ -f "$f" ]] || continue
        echo "---- head -200 $f ----"
        head -n 200 "$f"
        echo "----"
    done
}


stop_jobs() {
    local name pids=()
    [[ -n "$ASAN_PREBUILD_PID" ]] && pids+=("$ASAN_PREBUILD_PID")
    for name in "${RUNNING[@]}"; do pids+=("${JOB_PID[$name]}"); done
    ((${#pids[@]} > 0)) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null
    wait "${pids[@]}" 2>/dev/null
    ASAN_PREBUILD_PID=
    RUNNING=()
}
cleanup() {
    stop_jobs
    if [[ -n "$CLUSTER_DIR" && "${RELAYBUS_KEEP_CLUSTER:-0}" != 1 ]]; then
        bash "$ROOT/test/cluster.sh" destroy "$CLUSTER_DIR" >/dev/null 2>&1
    fi
    [[ -n "$TEMPLATE_DIR" ]] && bash "$ROOT/test/cluster.sh" destroy "$TEMPLATE_DIR" >/dev/null 2>&1
    CLUSTER_DIR=
    TEMPLATE_DIR=
    rm -rf "$LOGDIR"
}
trap cleanup EXIT
on_signal() {
    echo "run_all.sh: interrupted" >&2
    [[ -n "$CHILD" ]] && kill -TERM "$CHILD" 2>/dev/null
    stop_jobs
    wait 2>/dev/null
    exit 130
}
trap on_signal INT TERM HUP

# ---------------------------------------------------------------- deps
# The suites' python3, and the one scripts/install-deps.sh installs their
# modules into, is the system's. A version manager's shim first on PATH
# (pyenv's is a bash script that runs pyenv) costs 0.1 s of CPU per start, six
# times the interpreter's own, and the suites start python3 thousands of times.
if [[ -x /usr/bin/python3 && "$(command -v python3)" != /usr/bin/python3 ]]; then
    chmod 711 "$LOGDIR" && mkdir -p "$LOGDIR/bin" && ln -sf /usr/bin/python3 "$LOGDIR/bin/python3" && export PATH="$LOGDIR/bin:$PATH"
fi
RUN_START=$(date +%s)
step deps bash "$ROOT/scripts/install-deps.sh"

# Every compile through ccache (/usr/lib/ccache's g++, gcc and cc first on
# PATH): a run compiles only what changed since an earlier one in a clone at
# the same path (src/core's objects are compiled by absolute path). Not
# CCACHE_BASEDIR: it makes the compiler write relative paths into the
# dependency files, which the other builds that read build/core's (src/mongo,
# src/agent, test/core) then cannot find. The first run costs more CPU than
# without ccache (1264 against 1143 CPU-s in the one pair measured, noise
# included: test/README.md).
if [[ -x /usr/lib/ccache/g++ && "${RELAYBUS_CCACHE:-1}" == 1 ]]; then
    export PATH="/usr/lib/ccache:$PATH"
fi
PG_CONFIG=${PG_CONFIG:-$(bash "$ROOT/scripts/pg-config.sh")} || exit 2
export PG_CONFIG
if BINDIR=$("$PG_CONFIG" --bindir 2>/dev/null); then
    export PATH="$BINDIR:$PATH"
fi
export RELAYBUS_ROOT=$ROOT
TEMPLATE_DIR=$(mktemp -d /tmp/relaybus-template.XXXXXX)
CLUSTER_DIR=$(mktemp -d /tmp/relaybus-test.XXXXXX)

# ---------------------------------------------------------------- the jobs, queued
# Setup first (their priorities put them ahead of every suite), then the
# suites. src/core is compiled once, by the extension's build: the core
# tests and relaybus-mongo link the same objects (src/core/core.mk), so they
# wait for it.
add_job build "" 1000004 job_build
# The template every suite's cluster is a copy of (test/cluster.sh clone).
add_job cluster "" 1000003 job_step cluster bash "$ROOT/test/cluster.sh" init "$TEMPLATE_DIR"
shopt -s nullglob
MONGO_WANTED=no
for t in test/integration/*.sh; do
    [[ -x "$t" ]] && grep -q 'mongo_lib\.sh' "$t" && wanted "integration/$(basename "$t" .sh)" && MONGO_WANTED=yes
done
if [[ $MONGO_WANTED == yes ]]; then
    add_job ferretdb-build "" 1000002 job_step ferretdb-build bash test/ferretdb/build.sh
    # relaybus-mongo's own objects from the start, beside the extension's
    # build; the link (and any src/core object still missing) after it.
    add_job mongo-objects "" 1000002 job_step mongo-objects make -s -C src/mongo -j"$JOBS" objects
    add_job mongo-build "build mongo-objects" 1000001 job_step mongo-build make -s -C src/mongo -j"$JOBS"
fi
AGENT_WANTED=no
for t in test/integration/agent_*.sh; do
    [[ -x "$t" ]] && wanted "integration/$(basename "$t" .sh)" && AGENT_WANTED=yes
done
[[ $EDITION == managed ]] && AGENT_WANTED=yes
# relaybus-agent (src/agent) links the objects the extension's build made.
[[ $AGENT_WANTED == yes ]] && add_job agent-build "build" 1000001 job_step agent-build make -s -C src/agent -j"$JOBS"
if [[ -f test/core/Makefile ]]; then
    # After mongo-build: the core tests' compile would share the two cores
    # with it, and relaybus-mongo's build leads to the longest suites.
    { wanted core || wanted core-kafka; } && add_job core "build mongo-build" "" job_core
    wanted core-asan && add_job core-asan "asan-prebuild" "" job_core_asan
else
    for s in core core-kafka core-asan; do record "$s" 0 1 "test/core/Makefile missing"; done
fi
{ wanted regress || wanted isolation || wanted pgtap; } && add_job main-suites "build cluster" "" job_main_suites
# The relaybus-mongo scripts first: without earlier runs' times (a fresh
# clone) all suites count as equally long and go in this order, and these
# are the longest and start last (after mongo-build).
for t in test/integration/*.sh; do
    [[ -x "$t" ]] && grep -q 'mongo_lib\.sh' "$t" || continue
    name="integration/$(basename "$t" .sh)"
    wanted "$name" && add_job "$name" "ferretdb-build mongo-build" "" job_integration "$t"
done
for t in test/integration/*.sh; do
    [[ -x "$t" ]] && ! grep -q 'mongo_lib\.sh' "$t" || continue
    name="integration/$(basename "$t" .sh)"
    needs="build cluster"
    [[ $name == integration/agent_* || $EDITION == managed ]] && needs+=" agent-build"
    wanted "$name" && add_job "$name" "$needs" "" job_integration "$t"
done
shopt -u nullglob

start_asan_prebuild
echo "(${#PENDING[@]} jobs, $POOL_SIZE at a time)"
POOL_T0=$SECONDS
run_pool
save_job_times

# ---------------------------------------------------------------- summary
if [[ "${RELAYBUS_KEEP_CLUSTER:-0}" == 1 && -n "$CLUSTER_DIR" ]]; then
    echo "cluster kept: source $CLUSTER_DIR/env; test/cluster.sh destroy $CLUSTER_DIR"
    CLUSTER_DIR=
fi
cleanup
# When each job started and ended (seconds into the pool), for finding what
# the run's wall time waits on.
banner "timeline: start end job"
printf '%s\n' "${TIMELINE[@]}" | sort -n
banner summary
printf '%s\n' "${SUMMARY[@]}" | LC_ALL=C sort -s -k1,1 -k2,2
echo "wall time: $(($(date +%s) - RUN_START)) s"
echo "$TOTAL_PASSED passed, $TOTAL_FAILED failed"
((TOTAL_FAILED == 0))
