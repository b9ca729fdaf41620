# Helpers for the integration tests (sourced, not run: this file is not executable).
#
# A test script does:
#     source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#     new_db db notify               # db=a fresh database with relaybus installed
#     check "name" cmd args...       # one assertion: passes if cmd exits 0
#     finish                         # prints "N passed, N failed" (last line), exits
#
# The cluster comes from the environment (PGHOST, PGPORT, PGUSER as set by
# test/run_all.sh or `source DIR/env` of test/cluster.sh). Everything a test
# starts or creates (background processes, databases, ALTER SYSTEM settings,
# temporary files) is undone by an EXIT trap.
set -uo pipefail

RELAYBUS_ROOT=${RELAYBUS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)}
# The version CREATE EXTENSION installs and ALTER EXTENSION UPDATE reaches.
RELAYBUS_VERSION=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$RELAYBUS_ROOT/relaybus.control")
INTEG_DIR=$RELAYBUS_ROOT/test/integration
CLIENT=$INTEG_DIR/build/listen_client
TEST_NAME=$(basename "${0%.sh}")
# The edition a script runs against: the extension (default) or the managed
# SQL edition with relaybus-agent (RELAYBUS_EDITION=managed; see "the edition"
# below).
EDITION=${RELAYBUS_EDITION:-extension}

PG_CONFIG=${PG_CONFIG:-$(bash "$RELAYBUS_ROOT/scripts/pg-config.sh")}
PATH="$("$PG_CONFIG" --bindir):$PATH"
export PATH PG_CONFIG

# follow_server_log: SERVER_LOG is the server log of the script's cluster
# (test/cluster.sh's layout; empty without one), set again when the script
# moves to another cluster (managed_lib.sh's bare_cluster).
follow_server_log() { SERVER_LOG=${RELAYBUS_CLUSTER_DIR:+$RELAYBUS_CLUSTER_DIR/log/postgresql.log}; }
follow_server_log

PASSED=0
FAILED=0
T0=$(date +%s%N)

# log MESSAGE: progress on stdout, with the seconds since the test started.
log() {
    local ms=$((($(date +%s%N) - T0) / 1000000))
    printf '# [%s %d.%03ds] %s\n' "$TEST_NAME" $((ms / 1000)) $((ms % 1000)) "$*"
}

pass() {
    PASSED=$((PASSED + 1))
    echo "ok - $1"
}

fail() {
    FAILED=$((FAILED + 1))
    echo "FAIL - $1"
    shift
    (($# > 0)) && printf '    %s\n' "$@"
    return 0
}

# check NAME CMD...: one assertion; CMD's output is shown only when it fails.
check() {
    local name=$1 out rc
    shift
    out=$("$@" 2>&1)
    rc=$?
    if ((rc == 0)); then
        pass "$name"
    else
        fail "$name" "(exit $rc) $(head -c 3000 <<<"$out")"
    fi
}

# check_eq NAME EXPECTED ACTUAL
check_eq() {
    if [[ "$2" == "$3" ]]; then
        pass "$1"
    else
        fail "$1" "expected: $2" "actual:   $3"
    fi
}

# No server process of the script's cluster died of a fault (SIGILL, SIGABRT,
# SIGBUS, SIGFPE, SIGSEGV): a crash is a bug even after every other check
# passed, and the postmaster's restart can hide it from them. A kill -9 that a
# script means is signal 9, not one of these.
check_no_fault() {
    local faults
    [[ -n "$SERVER_LOG" && -f "$SERVER_LOG" ]] || return 0
    faults=$(grep -E 'terminated by signal (4|6|7|8|11):' "$SERVER_LOG" | head -n 5)
    check_eq "no server process died of a fault signal" "" "$faults"
}

finish() {
    check_no_fault
    cleanup
    trap - EXIT
    echo "$PASSED passed, $FAILED failed"
    ((FAILED == 0)) && exit 0
    exit 1
}

die() {
    echo "$TEST_NAME: $*" >&2
    FAILED=$((FAILED + 1))
    finish
}

# ---------------------------------------------------------------- cleanup
TMP=$(mktemp -d "/tmp/relaybus-${TEST_NAME}.XXXXXX")
BG_PIDS=()
DBS=()
CONF_SET=()

bg_track() { BG_PIDS+=("$1"); }

cleanup() {
    local p s
    for p in "${BG_PIDS[@]}"; do
        kill "$p" 2>/dev/null
    done
    for p in "${BG_PIDS[@]}"; do
        wait "$p" 2>/dev/null
    done
    BG_PIDS=()
    if ((${#CONF_SET[@]} > 0)); then
        for s in "${CONF_SET[@]}"; do
            psql_q -d postgres -c "ALTER SYSTEM RESET $s" >/dev/null 2>&1
        done
        psql_q -d postgres -c "SELECT pg_reload_conf()" >/dev/null 2>&1
        CONF_SET=()
    fi
    for p in "${DBS[@]}"; do
        psql_q -d postgres -c "DROP DATABASE IF EXISTS \"$p\" WITH (FORCE)" >/dev/null 2>&1
    done
    DBS=()
    [[ $EDITION == managed ]] && stop_bare_cluster
    [[ "${RELAYBUS_KEEP_TMP:-0}" == 1 ]] || rm -rf "$TMP"
}
trap 'cleanup; echo "$TEST_NAME: interrupted"; echo "$PASSED passed, $((FAILED + 1)) failed"; exit 1' INT TERM
trap 'cleanup' EXIT

# ---------------------------------------------------------------- SQL helpers
psql_q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@" </dev/null; }

# sql DB QUERY...: tuples only, unaligned, '|' separated.
sql() {
    local db=$1
    shift
    local args=() q
    for q in "$@"; do args+=(-c "$q"); done
    psql_q -d "$db" "${args[@]}"
}

# new_db VAR PREFIX: creates a fresh database with relaybus installed (dropped
# by the EXIT trap) and stores its name in VAR. In the managed edition
# (RELAYBUS_EDITION=managed, below) the edition's script is installed by a
# non-superuser owner and a relaybus-agent of the database's own serves it.
new_db() {
    local name="it_${2}_$$_${RANDOM}"
    if [[ $EDITION == managed ]]; then
        psql_q -d postgres -c "CREATE DATABASE \"$name\" OWNER $MANAGED_OWNER" >/dev/null || return 1
        DBS+=("$name")
        managed_install "$MANAGED_OWNER" "$name" >/dev/null || return 1
        start_db_agent "$name" || return 1
    else
        psql_q -d postgres -c "CREATE DATABASE \"$name\"" >/dev/null || return 1
        DBS+=("$name")
        psql_q -d "$name" -c "CREATE EXTENSION relaybus" >/dev/null || return 1
    fi
    printf -v "$1" '%s' "$name"
}

# set_conf NAME VALUE: ALTER SYSTEM SET + reload; reset by the EXIT trap. In
# the managed edition a relaybus setting is the agents' command-line option of
# the same meaning (AGENT_FLAG), and the agents restart with it; one without
# such an option fails.
set_conf() {
    if [[ $EDITION == managed && $1 == relaybus.* ]]; then
        [[ -n "${AGENT_FLAG[$1]:-}" ]] || { echo "$1: relaybus-agent has no such option" >&2; return 1; }
        AGENT_OPTS[${AGENT_FLAG[$1]}]=$2
        restart_agents
        return
    fi
    psql_q -d postgres -c "ALTER SYSTEM SET $1 = '$2'" -c "SELECT pg_reload_conf()" >/dev/null || return 1
    CONF_SET+=("$1")
}

reset_conf() {
    if [[ $EDITION == managed && $1 == relaybus.* ]]; then
        unset "AGENT_OPTS[${AGENT_FLAG[$1]:-none}]"
        restart_agents
        return
    fi
    psql_q -d postgres -c "ALTER SYSTEM RESET $1" -c "SELECT pg_reload_conf()" >/dev/null
}

source "$INTEG_DIR/wait_until.sh"

# dispatcher_pids DB: pids of the running relaybus dispatchers of DB (from pg_stat_activity).
# sql_is DB QUERY EXPECTED: QUERY's result is EXPECTED now (for wait_until, which
# re-runs its command: a "$(sql ...)" argument would be read once).
sql_is() { [[ "$(sql "$1" "$2")" == "$3" ]]; }

dispatcher_pids() {
    psql_q -d postgres -c "SELECT pid FROM pg_stat_activity
        WHERE backend_type = 'relaybus dispatcher' AND datname = '$1' ORDER BY pid"
}

# workers_ready DB N: relay.workers shows N dispatchers holding all 64 lanes
# (managed: N agents, which lease deliveries, not lanes, and show lanes_held NULL).
workers_ready() {
    local r
    r=$(psql_q -d "$1" -c "SELECT count(*), coalesce(sum(lanes_held), 0) FROM relay.workers") || return 1
    if [[ $EDITION == managed ]]; then
        [[ "$r" == "${2:-1}|0" ]]
    else
        [[ "$r" == "${2:-1}|64" ]]
    fi
}

# wait_workers DB [N] [TIMEOUT]
wait_workers() { wait_until "${3:-20}" workers_ready "$1" "${2:-1}"; }

# after_dispatcher_kill DB OLD_PID: after a kill -9 of a dispatcher (the
# postmaster restarts the server), checks that the server and a new dispatcher
# of DB are back; sets NEW_DISPATCHER.
after_dispatcher_kill() {
    local db=$1 old=$2
    sleep 1
    check "the server comes back" wait_until 60 pg_isready -q -d postgres -t 1
    check "a new dispatcher serves the database" wait_workers "$db" 1 30
    NEW_DISPATCHER=$(sql "$db" "SELECT pid FROM relay.workers")
    check "it is a new process ($old -> $NEW_DISPATCHER)" test -n "$NEW_DISPATCHER" -a "$NEW_DISPATCHER" != "$old"
}

# start_standby HOST PORT DIR APP_NAME: a streaming standby of the server at
# HOST:PORT (pg_basebackup -R, as application_name APP_NAME) in DIR, started
# by test/cluster.sh (with PG_CONFIG's binaries) on a free port and its own
# socket directory DIR; sets STANDBY_PORT. Returns 1 with the tool's output
# on stderr.
start_standby() {
    local host=$1 port=$2 dir=$3 app=$4
    local backup=(pg_basebackup -h "$host" -p "$port" -U postgres -D "$dir/data" -R -X stream -c fast
                  -d "application_name=$app")
    mkdir -p "$dir/log"
    touch "$dir/.relaybus-test-cluster"
    chown -R postgres:postgres "$dir" 2>/dev/null
    if ((EUID == 0)); then
        (cd "$dir" && runuser -u postgres -- "${backup[@]}") >"$dir/log/basebackup.out" 2>&1
    else
        "${backup[@]}" >"$dir/log/basebackup.out" 2>&1
    fi || { cat "$dir/log/basebackup.out" >&2; return 1; }
    STANDBY_PORT=$(python3 "$RELAYBUS_ROOT/scripts/free-port.py")
    printf "port = %s\nunix_socket_directories = '%s'\n" "$STANDBY_PORT" "$dir" >>"$dir/data/postgresql.conf"
    bash "$RELAYBUS_ROOT/test/cluster.sh" start "$dir" >"$dir/log/start.out" 2>&1 ||
        { cat "$dir/log/start.out" >&2; return 1; }
}

# ---------------------------------------------------------------- the LISTEN client
source "$INTEG_DIR/build_program.sh"
build_client() {
    build_program "$CLIENT" "$INTEG_DIR/listen_client.cpp" -I"$("$PG_CONFIG" --includedir)" \
        -L"$("$PG_CONFIG" --libdir)" -lpq
}

# start_client NAME DB CHANNEL [client options...]: runs the client in the
# background with stdout in $TMP/NAME.out and stderr in $TMP/NAME.err; waits
# until it LISTENs. Sets CLIENT_PID.
start_client() {
    local name=$1 db=$2 channel=$3
    shift 3
    rm -f "$TMP/$name.ready"
    "$CLIENT" --channel "$channel" --ready-file "$TMP/$name.ready" "$@" "dbname=$db" \
        >"$TMP/$name.out" 2>"$TMP/$name.err" &
    CLIENT_PID=$!
    bg_track "$CLIENT_PID"
    if ! wait_until 15 test -s "$TMP/$name.ready"; then
        echo "client $name did not start listening" >&2
        cat "$TMP/$name.err" >&2
        return 1
    fi
}

# wait_lines FILE N TIMEOUT: waits until FILE has at least N lines.
line_count() { if [[ -f "$1" ]]; then wc -l <"$1"; else echo 0; fi; }
has_lines() { (($(line_count "$1") >= $2)); }
wait_lines() { wait_until "$3" has_lines "$1" "$2"; }

# wait_pid PID TIMEOUT: waits for a background process to exit; its status in WAIT_RC.
wait_pid() {
    local pid=$1 limit=$2
    if ! wait_until "$limit" bash -c "! kill -0 $pid 2>/dev/null"; then
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        WAIT_RC=124
        return 1
    fi
    wait "$pid" 2>/dev/null
    WAIT_RC=$?
    return 0
}

# notify_handler DB NAME CHANNEL OPTIONS PATTERN: a notify handler routed from PATTERN.
notify_handler() {
    sql "$1" "SELECT relay_create_handler('$2', 'notify', '$3', '$4')" \
        "SELECT relay_route('$5', '$2')" >/dev/null
}

# analyze ARGS...: runs deliveries.py (see there) and fills the associative array R.
declare -A R
analyze() {
    local line
    R=()
    while IFS= read -r line; do
        R[${line%%=*}]=${line#*=}
    done < <(python3 "$INTEG_DIR/deliveries.py" "$@")
    [[ -n "${R[lines]:-}" ]]
}

# pub_log DB: the table publishers insert their committed event ids into, in the
# publishing transaction itself (so it holds exactly the committed events).
create_pub_log() {
    sql "$1" "CREATE TABLE pub_log (id bigint PRIMARY KEY, key text)" >/dev/null
}

# dump_pub_log DB FILE
dump_pub_log() { sql "$1" "SELECT id, key FROM pub_log ORDER BY id" >"$2"; }

# ---------------------------------------------------------------- the edition
# With RELAYBUS_EDITION=managed a script meets the managed SQL edition
# (docs/managed.md) where it would meet the extension: a cluster of its own
# with no relaybus file and nothing preloaded (managed_lib.sh), each new_db
# installed by the non-superuser $MANAGED_OWNER and served by a relaybus-agent
# of its own (log in $TMP/agent-DB.log) in place of the in-server workers. A
# check the edition cannot pass is named by edition_exception, never left out
# silently; docs/managed.md lists the scripts that run in both editions.
# The agents start with the extension's defaults (an empty allow-list, a poll
# every second) and report every second, for relay.workers and handler_stats.
declare -A AGENT_PIDS=() AGENT_OPTS=()
declare -A AGENT_FLAG=([relaybus.http_allowlist]=--http-allowlist [relaybus.poll_interval]=--poll-interval)
start_db_agent() {
    local flag args=()
    psql_q -U postgres -d postgres -c "DO \$\$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'agent_login') THEN
            CREATE ROLE agent_login LOGIN IN ROLE relay_agent;
        END IF; END \$\$" >/dev/null || return 1
    for flag in "${!AGENT_OPTS[@]}"; do args+=("$flag" "${AGENT_OPTS[$flag]}"); done
    "$RELAYBUS_ROOT/relaybus-agent" --database "host=$PGHOST port=$PGPORT dbname=$1 user=agent_login" \
        --report-interval 1s --log-level debug "${args[@]}" 2>>"$TMP/agent-$1.log" &
    AGENT_PIDS[$1]=$!
    bg_track $!
    wait_until 30 grep -q '"handlers loaded"' "$TMP/agent-$1.log"
}
# await_counters DB: the delivery counters of relay.handler_stats,
# handler_metrics and workers are current: at once with the extension (kept
# at commit); in the managed edition once every agent of DB has written its
# counters into relay.agent_reports since the call.
await_counters() {
    [[ $EDITION == managed ]] || return 0
    local t
    t=$(sql "$1" "SELECT clock_timestamp()")
    wait_until 10 sql_is "$1" "SELECT bool_and(reported_at > '$t') FROM relay.agent_reports" t
}
# restart_agents: each database's agent stopped (SIGTERM: it drains) and
# started again with AGENT_OPTS, as the extension's workers take a reload.
restart_agents() {
    local db
    for db in "${!AGENT_PIDS[@]}"; do
        kill -TERM "${AGENT_PIDS[$db]}" 2>/dev/null
        wait "${AGENT_PIDS[$db]}" 2>/dev/null
        mv "$TMP/agent-$db.log" "$TMP/agent-$db.log.$(date +%s%N)"
        start_db_agent "$db" || return 1
    done
}
# edition_exception WHAT: in the managed edition, says that the check WHAT is
# not made there (and why, in WHAT) and returns 0 so the caller skips it; in
# the extension returns 1. Usage: edition_exception "..." || check ...
edition_exception() {
    [[ $EDITION == managed ]] || return 1
    echo "# edition exception (managed): $1"
}

# `bash lib.sh --build-client` only builds the client: run_all.sh does, once,
# before the scripts start side by side (each would build its own copy).
if [[ "${1:-}" == --build-client ]]; then
    build_client
    exit
fi
# python3 runs the analyses (JSON parsing of the client's output).
command -v python3 >/dev/null 2>&1 || die "python3 is needed"
case $EDITION in
extension) ;;
managed)
    source "$INTEG_DIR/managed_lib.sh"
    make -s -C "$RELAYBUS_ROOT" agent managed >/dev/null || die "make agent managed failed"
    bare_cluster || die "the cluster without relaybus did not start"
    MANAGED_OWNER=relay_owner
    psql_q -U postgres -d postgres -c "CREATE ROLE $MANAGED_OWNER LOGIN CREATEROLE" >/dev/null ||
        die "could not create $MANAGED_OWNER"
    ;;
*) die "RELAYBUS_EDITION is extension or managed, not $EDITION" ;;
esac
[[ -n "${PGHOST:-}" && -n "${PGPORT:-}" ]] || die "no cluster: PGHOST/PGPORT not set (source DIR/env of test/cluster.sh)"
build_client || die "could not build $CLIENT"
