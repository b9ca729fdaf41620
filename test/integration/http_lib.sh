# Helpers for the webhook (http handler) integration tests, sourced after
# lib.sh (not run: this file is not executable).
#
#     source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#     source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
#     start_receiver r                  # http_receiver.py on a free port: RECV_PORT, log $TMP/r.log
#     allow_loopback                    # relaybus.http_allowlist = '127.0.0.1' (reset at exit)
#     http_handler DB NAME URL OPTIONS PATTERN
#     recv_plan "$RECV_PORT" /path '[{"status": 500}]'
#     recv_count "$TMP/r.log" /path     # requests of /path so far
#     py_facts NAME ARGS... <<'EOF'     # a python script (http_log.py importable)
#     ...                               # printing name=value lines into R
#     EOF

RECEIVER=$INTEG_DIR/http_receiver.py

# start_receiver NAME: starts the receiver in the background (stopped by the
# EXIT trap) with its JSON-lines log in $TMP/NAME.log; sets RECV_PORT, RECV_PID.
start_receiver() {
    local name=$1
    rm -f "$TMP/$name.port"
    : >"$TMP/$name.log"
    python3 "$RECEIVER" --port-file "$TMP/$name.port" --log "$TMP/$name.log" 2>"$TMP/$name.err" &
    RECV_PID=$!
    bg_track "$RECV_PID"
    if ! wait_until 15 test -s "$TMP/$name.port"; then
        echo "receiver $name did not start" >&2
        cat "$TMP/$name.err" >&2
        return 1
    fi
    RECV_PORT=$(cat "$TMP/$name.port")
}

# recv_plan PORT PATH JSON: the behaviours of the next requests of PATH.
recv_plan() {
    python3 - "$@" <<'EOF'
import sys, urllib.request
port, path, plan = sys.argv[1], sys.argv[2].lstrip("/"), sys.argv[3].encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/_control/{path}", data=plan, method="POST")
with urllib.request.urlopen(req, timeout=5) as r:
    sys.exit(0 if r.status == 204 else 1)
EOF
}

# recv_count LOG PATH: how many requests of PATH the receiver recorded.
recv_count() {
    local n
    n=$(grep -cF "\"path\": \"$2\"," "$1" 2>/dev/null) || true
    echo "${n:-0}"
}
recv_has() { (($(recv_count "$1" "$2") >= $3)); }
# wait_requests LOG PATH N TIMEOUT
wait_requests() { wait_until "$4" recv_has "$1" "$2" "$3"; }

# setting_is NAME VALUE: a new session sees the setting (the postmaster reloaded).
setting_is() { [[ "$(psql_q -d postgres -c "SHOW $1")" == "$2" ]]; }

# set_allowlist VALUE: relaybus.http_allowlist (reset by the EXIT trap); waits
# until new sessions see it, then a moment for the dispatchers (they reload
# on SIGHUP and switch as soon as nothing is in flight).
set_allowlist() {
    set_conf relaybus.http_allowlist "$1" || return 1
    [[ $EDITION == managed ]] && return 0 # the agents have restarted with it
    wait_until 10 setting_is relaybus.http_allowlist "$1" || return 1
    sleep 1
}
allow_loopback() { set_allowlist 127.0.0.1; }

# http_handler DB NAME URL OPTIONS PATTERN: an http handler routed from PATTERN.
http_handler() {
    sql "$1" "SELECT relay_create_handler('$2', 'http', '$3', '$4')" \
        "SELECT relay_route('$5', '$2')" >/dev/null
}

# handler_stat DB HANDLER COLUMNS: a row of relay.handler_stats, once current.
handler_stat() {
    await_counters "$1"
    sql "$1" "SELECT $3 FROM relay.handler_stats WHERE handler = '$2'"
}
# pending DB HANDLER: its rows in relay.deliveries.
pending_of() {
    sql "$1" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
              WHERE h.name = '$2'"
}
dead_of() {
    sql "$1" "SELECT count(*) FROM relay.dead_letters WHERE handler = '$2'"
}
none_pending() { [[ $(pending_of "$1" "$2") == 0 ]]; }
dead_is() { [[ $(dead_of "$1" "$2") == "$3" ]]; }

# py_facts NAME ARGS... <<'EOF' ... EOF: runs the python script from stdin
# (with http_log.py importable) and fills the associative array R (lib.sh)
# from its "name=value" output lines; its stderr goes to $TMP/NAME.pyerr.
py_facts() {
    local name=$1 line
    shift
    cat >"$TMP/$name.py"
    R=()
    while IFS= read -r line; do
        [[ "$line" == *=* ]] && R[${line%%=*}]=${line#*=}
    done < <(PYTHONPATH="$INTEG_DIR" python3 "$TMP/$name.py" "$@" 2>"$TMP/$name.pyerr")
    if ((${#R[@]} == 0)); then
        echo "py_facts $name printed nothing:" >&2
        cat "$TMP/$name.pyerr" >&2
        return 1
    fi
}

# r KEY: a fact from R, or "?" when the analysis did not produce it.
r() { echo "${R[$1]:-?}"; }

# new_secret: a fresh Standard Webhooks secret (whsec_ + base64 of 32 bytes).
new_secret() { python3 -c 'import base64, os; print("whsec_" + base64.b64encode(os.urandom(32)).decode())'; }

# receiver_at NAME: start_receiver NAME, with URL its address and LOG its
# log; the test stops if it does not start.
receiver_at() {
    start_receiver "$1" || die "the receiver did not start"
    URL=http://127.0.0.1:$RECV_PORT
    LOG=$TMP/$1.log
}

# http_test_db NAME: the usual start of a webhook test: a receiver (URL, LOG),
# loopback allowed, a fresh database `db` served by a dispatcher.
http_test_db() {
    receiver_at r
    allow_loopback || die "could not set relaybus.http_allowlist"
    new_db db "$1" || die "could not create a database"
    check "a dispatcher serves the new database" wait_workers "$db" 1 20
}
