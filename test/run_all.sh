#!/usr/bin/env bash
# Runs every relaybus test suite and prints, as its very last line,
#     N passed, N failed
# (the sum over all suites). Exits non-zero if anything failed or a suite could
# not run: a suite that cannot run counts as one failure, never as skipped.
#
# Steps: install deps, make + make install (top-level PGXS Makefile), core unit
# tests (make -C test/core check, GoogleTest; again as suite core-asan under
# AddressSanitizer + UBSan: make -C test/core check-asan; the Kafka producer
# against a real broker as suite core-kafka: test/core/kafka/run.sh), a throwaway cluster
# (test/cluster.sh), pg_regress + isolation (make installcheck), pgTAP
# (pg_prove in database relay_tap), and every executable test/integration/*.sh.
#
# Two lanes (test/README.md, "How a full run is organised"): the main lane
# runs the above in that order, core-asan last; the FerretDB lane runs the
# relaybus-mongo suites (scripts that source mongo_lib.sh, which never use the
# cluster) beside it from the start, and its logs are shown whole after the
# main lane's. core-asan's compile runs in the background at nice 19. Every
# step and suite line, and the summary, give its wall time.
#
# Environment: JOBS (parallel make, default nproc), RELAYBUS_SUITE_TIMEOUT
# (seconds per suite, default 1800), RELAYBUS_INTEGRATION_TIMEOUT (seconds per
# integration script, default 1200), RELAYBUS_KEEP_CLUSTER=1 (do not destroy the
# cluster at the end), plus test/cluster.sh's variables.
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
CLUSTER_OK=no
BUILD_OK=no

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

# RELAYBUS_SUITES (space-separated shell patterns, e.g. "core integration/notify*"):
# run only the suites it names, for development; unset (CI, make test) runs all.
wanted() {
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

# run_suite NAME PARSER TIMEOUT CMD...: runs CMD with output shown and logged,
# parses the log, records the counts. A non-zero exit with no failure counted,
# or a run that counted nothing, is one failure.
run_suite() {
    local name=$1 parser=$2 limit=$3 log
    shift 3
    LAST_FAILED=0
    wanted "$name" || return 0
    log="$LOGDIR/$(tr '/ ' '__' <<<"$name").log"
    banner "suite $name: $*"
    run_logged "$limit" "$log" "$@"
    record_suite "$name" "$parser" "$limit" "$log" "$RC" "$RUN_SECS"
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

# ---------------------------------------------------------------- the FerretDB lane
# The relaybus-mongo suites (integration scripts that source mongo_lib.sh) run
# FerretDB, the HTTP receiver and the sidecar, never the cluster, and take
# minutes mostly waiting: they run as a second lane in the background, from
# the start of the run, beside everything else (the "main lane"). First step
# mongo-build (FerretDB's go build and relaybus-mongo's make, at normal CPU
# priority: this lane is the longer one), then each suite in turn, each
# into its own log; nothing is shown while they run. At the end the main lane
# waits for the lane and shows each of its logs whole, in order, and records its
# counts like any other suite's.
LANE_PID=
LANE_SUITES=()

# lane_run LIMIT LOG CMD...: run_logged without showing the output.
lane_run() { RUN_QUIET=1 run_logged "$@"; }

# ferretdb_lane: the lane itself (in a background subshell). Writes one line
# per step/suite to $LOGDIR/lane.results: "step NAME RC SECS LOG CMD" or
# "suite NAME RC SECS LOG CMD".
ferretdb_lane() {
    trap '[[ -n "$CHILD" ]] && kill -TERM "$CHILD" 2>/dev/null; exit 130' TERM INT HUP
    local t name log
    log=$LOGDIR/lane-step-mongo-build.log
    lane_run "$SUITE_TIMEOUT" "$log" bash -c \
        'bash test/ferretdb/build.sh && make -s -C src/mongo -j"$1"' mongo-build "$JOBS"
    echo "step mongo-build $RC $RUN_SECS $log bash test/ferretdb/build.sh && make -C src/mongo" >>"$LOGDIR/lane.results"
    for t in "${LANE_SUITES[@]}"; do
        name="integration/$(basename "$t" .sh)"
        log="$LOGDIR/$(tr '/ ' '__' <<<"$name").log"
        lane_run "$INTEGRATION_TIMEOUT" "$log" "$ROOT/$t"
        echo "suite $name $RC $RUN_SECS $log $ROOT/$t" >>"$LOGDIR/lane.results"
    done
}

start_ferretdb_lane() {
    local t
    shopt -s nullglob
    for t in test/integration/*.sh; do
        [[ -x "$t" ]] && grep -q 'mongo_lib\.sh' "$t" && wanted "integration/$(basename "$t" .sh)" &&
            LANE_SUITES+=("$t")
    done
    shopt -u nullglob
    ((${#LANE_SUITES[@]} > 0)) || return 0
    : >"$LOGDIR/lane.results"
    ferretdb_lane &
    LANE_PID=$!
}

# core-asan's build is minutes of compiling and seconds of testing: it goes on
# in the background from the start at the lowest CPU priority, on the CPU the
# waiting suites leave idle; the suite core-asan runs at the end of the main
# lane, after waiting for it (its make then only runs the tests; a failed
# prebuild leaves the suite's own make to build and report).
ASAN_PREBUILD_PID=
start_asan_prebuild() {
    [[ -f test/core/Makefile ]] && wanted core-asan || return 0
    timeout -k 30 "$SUITE_TIMEOUT" nice -n 19 make -C test/core -j"$JOBS" "$ROOT/test/core/core_tests_asan" \
        </dev/null >"$LOGDIR/asan-prebuild.log" 2>&1 &
    ASAN_PREBUILD_PID=$!
}
wait_asan_prebuild() {
    [[ -n "$ASAN_PREBUILD_PID" ]] || return 0
    local t0=$SECONDS
    wait "$ASAN_PREBUILD_PID"
    ASAN_PREBUILD_PID=
    echo "(waited $((SECONDS - t0)) s for core-asan's background build)"
}

in_lane() {
    local t
    for t in "${LANE_SUITES[@]}"; do [[ "$t" == "$1" ]] && return 0; done
    return 1
}

# finish_ferretdb_lane: waits for the lane, then shows and records its results.
finish_ferretdb_lane() {
    local kind name rc secs log cmd
    [[ -n "$LANE_PID" ]] || return 0
    local t0=$SECONDS
    banner "waiting for the FerretDB lane"
    wait "$LANE_PID"
    LANE_PID=
    echo "(waited $((SECONDS - t0)) s for the FerretDB lane)"
    while read -r kind name rc secs log cmd; do
        banner "$kind $name: $cmd (FerretDB lane)"
        cat "$log"
        if [[ $kind == step ]]; then
            if ((rc == 0)); then
                SUMMARY+=("step $name: ok ($secs s)")
                echo "step $name: ok ($secs s)"
            else
                SUMMARY+=("step $name: FAILED ($secs s)")
                echo "step $name: FAILED ($secs s)"
                TOTAL_FAILED=$((TOTAL_FAILED + 1))
            fi
        else
            record_suite "$name" plain "$INTEGRATION_TIMEOUT" "$log" "$rc" "$secs"
        fi
    done <"$LOGDIR/lane.results"
    # A suite the lane did not get to (it was stopped) counts as failed.
    for t in "${LANE_SUITES[@]}"; do
        name="integration/$(basename "$t" .sh)"
        grep -q "^suite $name " "$LOGDIR/lane.results" || record "$name" 0 1 "the FerretDB lane did not run it"
    done
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

stop_background() {
    [[ -n "$ASAN_PREBUILD_PID" ]] && kill -TERM "$ASAN_PREBUILD_PID" 2>/dev/null
    [[ -n "$LANE_PID" ]] && kill -TERM "$LANE_PID" 2>/dev/null
    [[ -n "$ASAN_PREBUILD_PID$LANE_PID" ]] && wait $ASAN_PREBUILD_PID $LANE_PID 2>/dev/null
    ASAN_PREBUILD_PID=
    LANE_PID=
}
cleanup() {
    stop_background
    if [[ -n "$CLUSTER_DIR" && "${RELAYBUS_KEEP_CLUSTER:-0}" != 1 ]]; then
        bash "$ROOT/test/cluster.sh" destroy "$CLUSTER_DIR" >/dev/null 2>&1
    fi
    CLUSTER_DIR=
    rm -rf "$LOGDIR"
}
trap cleanup EXIT
on_signal() {
    echo "run_all.sh: interrupted" >&2
    [[ -n "$CHILD" ]] && kill -TERM "$CHILD" 2>/dev/null
    [[ -n "$LANE_PID" ]] && kill -TERM "$LANE_PID" 2>/dev/null
    [[ -n "$ASAN_PREBUILD_PID" ]] && kill -TERM "$ASAN_PREBUILD_PID" 2>/dev/null
    wait 2>/dev/null
    LANE_PID=
    ASAN_PREBUILD_PID=
    exit 130
}
trap on_signal INT TERM HUP

# ---------------------------------------------------------------- (a) deps
RUN_START=$(date +%s)
step deps bash "$ROOT/scripts/install-deps.sh"

PG_CONFIG=${PG_CONFIG:-$(bash "$ROOT/scripts/pg-config.sh")} || exit 2
export PG_CONFIG
if BINDIR=$("$PG_CONFIG" --bindir 2>/dev/null); then
    export PATH="$BINDIR:$PATH"
fi
export RELAYBUS_ROOT=$ROOT
start_ferretdb_lane
start_asan_prebuild

# ---------------------------------------------------------------- (b) build
if step build make -j"$JOBS" PG_CONFIG="$PG_CONFIG" \
        && step install make install PG_CONFIG="$PG_CONFIG"; then
    BUILD_OK=yes
fi

# ---------------------------------------------------------------- (c) core
if [[ -f test/core/Makefile ]]; then
    run_suite core gtest "$SUITE_TIMEOUT" make -C test/core -j"$JOBS" check
    # (core-asan runs at the end of the main lane: see start_asan_prebuild.)
    # KafkaSink against a real single-node broker that the suite starts.
    run_suite core-kafka gtest "$SUITE_TIMEOUT" bash test/core/kafka/run.sh
else
    record core 0 1 "test/core/Makefile missing"
    record core-kafka 0 1 "test/core/Makefile missing"
fi

# ---------------------------------------------------------------- (d) cluster
CLUSTER_DIR=$(mktemp -d /tmp/relaybus-test.XXXXXX)
if step cluster bash "$ROOT/test/cluster.sh" start "$CLUSTER_DIR"; then
    CLUSTER_OK=yes
    # shellcheck disable=SC1091
    source "$CLUSTER_DIR/env"
    export PGHOST PGPORT PGUSER PGDATABASE RELAYBUS_CLUSTER_DIR
else
    [[ "$BUILD_OK" == yes ]] || echo "(the cluster preloads relaybus, which did not build)"
fi
export RELAYBUS_ROOT=$ROOT

ensure_cluster() {
    [[ "$CLUSTER_OK" == yes ]] || return 1
    bash "$ROOT/test/cluster.sh" status "$CLUSTER_DIR" >/dev/null 2>&1 && return 0
    echo "(cluster is down; restarting it)"
    bash "$ROOT/test/cluster.sh" start "$CLUSTER_DIR"
}

# ---------------------------------------------------------------- (e) regress + isolation
# Two make runs, so that a failing pg_regress does not keep the isolation tests
# from running (PGXS's installcheck stops at the first failing command).
if ensure_cluster; then
    run_suite regress regress "$SUITE_TIMEOUT" make installcheck ISOLATION= PG_CONFIG="$PG_CONFIG"
    ((LAST_FAILED > 0)) && show_diffs "$LAST_LOG" \
        "$ROOT/results_regress/regression.diffs" "$ROOT/regression.diffs"
else
    record regress 0 1 "no cluster"
fi
if ensure_cluster; then
    run_suite isolation regress "$SUITE_TIMEOUT" make installcheck REGRESS= PG_CONFIG="$PG_CONFIG"
    ((LAST_FAILED > 0)) && show_diffs "$LAST_LOG" \
        "$ROOT/results_isolation/regression.diffs" "$ROOT/output_iso/regression.diffs"
else
    record isolation 0 1 "no cluster"
fi

# ---------------------------------------------------------------- (f) pgTAP
shopt -s nullglob
tap_files=(test/pgtap/*.sql)
if ((${#tap_files[@]} == 0)); then
    record pgtap 0 1 "no test/pgtap/*.sql"
elif ! ensure_cluster; then
    record pgtap 0 1 "no cluster"
elif ! psql -X -q -v ON_ERROR_STOP=1 -d postgres \
        -c 'SET client_min_messages = warning' \
        -c 'DROP DATABASE IF EXISTS relay_tap' -c 'CREATE DATABASE relay_tap' </dev/null \
     || ! psql -X -q -v ON_ERROR_STOP=1 -d relay_tap \
        -c 'CREATE EXTENSION pgtap' -c 'CREATE EXTENSION relaybus' </dev/null; then
    record pgtap 0 1 "could not set up database relay_tap"
else
    run_suite pgtap tap "$SUITE_TIMEOUT" \
        pg_prove -h "$PGHOST" -p "$PGPORT" -U postgres -d relay_tap "${tap_files[@]}"
fi

# ---------------------------------------------------------------- (g) integration
for t in test/integration/*.sh; do
    [[ -x "$t" ]] || continue
    in_lane "$t" && continue
    name="integration/$(basename "$t" .sh)"
    if ensure_cluster; then
        run_suite "$name" plain "$INTEGRATION_TIMEOUT" "$ROOT/$t"
    else
        record "$name" 0 1 "no cluster"
    fi
done
shopt -u nullglob

# ---------------------------------------------------------------- (h) core-asan
if [[ -f test/core/Makefile ]]; then
    # The core tests built with AddressSanitizer + UndefinedBehaviorSanitizer
    # (leak detection on): a memory error or UB aborts the binary, which fails
    # the suite.
    wanted core-asan && wait_asan_prebuild
    run_suite core-asan gtest "$SUITE_TIMEOUT" make -C test/core -j"$JOBS" check-asan
else
    record core-asan 0 1 "test/core/Makefile missing"
fi

# ---------------------------------------------------------------- (i) the FerretDB lane's results
finish_ferretdb_lane

# ---------------------------------------------------------------- summary
if ((TOTAL_FAILED > 0)) && [[ -n "$CLUSTER_DIR" && -f "$CLUSTER_DIR/log/postgresql.log" ]]; then
    banner "server log (last 100 lines)"
    tail -n 100 "$CLUSTER_DIR/log/postgresql.log"
fi
if [[ "${RELAYBUS_KEEP_CLUSTER:-0}" == 1 && -n "$CLUSTER_DIR" ]]; then
    echo "cluster kept: source $CLUSTER_DIR/env; test/cluster.sh destroy $CLUSTER_DIR"
    CLUSTER_DIR=
fi
cleanup
banner summary
printf '%s\n' "${SUMMARY[@]}"
echo "wall time: $(($(date +%s) - RUN_START)) s"
echo "$TOTAL_PASSED passed, $TOTAL_FAILED failed"
((TOTAL_FAILED == 0))
