#!/usr/bin/env bash
# relaybus-agent (docs/managed.md, "relaybus-agent") delivering a database of
# the managed SQL edition on a cluster that has no relaybus library at all:
# the edition installed by an owner that is not a superuser, the agent logged
# in as a role whose one grant is relay_agent; a real HTTP receiver on
# loopback and a real LISTEN client.
#
#  (1) refusals: a database with the extension (run_all.sh's cluster), one
#      without the edition, a role without relay_agent: exit 2, one log line;
#      an unreachable server, a wrong password: a log line per attempt,
#      retried with backoff
#  (2) one agent, polling only every 30 s, so that what arrives was woken by
#      the publishers' NOTIFY: http (signed, per key in order) and notify
#      deliveries of committed publishes, never a rolled-back one; a handler
#      created meanwhile is served at once; its backend terminated: it
#      reconnects and goes on; SIGTERM: exit 0
#  (3) a receiver answering 500: retried with backoff, a dead letter after
#      max_attempts; an address the SSRF guard refuses: a dead letter at once
#  (4) kill -9 of an agent with requests in flight, a new agent: nothing
#      lost, key order kept, duplicates only of what was in flight
#  (5) two agents on one database: nothing delivered twice, key order kept
#  (6) the receipts: a result with a wrong token, or after the lease ran out,
#      changes nothing; a release gives a delivery back uncharged
#  (7) ack-mode notify (the lease in the message, completed by relay_ack) and
#      notify by reference (a payload above --notify-payload-limit)
#  (8) a server restart with requests in flight: the agent reconnects,
#      settles what was in flight, nothing is lost, key order kept
#  (9) a standby: refused as in recovery and tried again; an agent given both
#      hosts with target_session_attrs=read-write follows a failover to the
#      promoted standby: nothing committed (and replicated) is lost, key order
#      kept
export PGHOST=${PGHOST:-/nonexistent} PGPORT=${PGPORT:-1}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/managed_lib.sh"

ROOT=$RELAYBUS_ROOT
AGENT=$ROOT/relaybus-agent
DB=agentdb
OWNER=relay_owner

STANDBY=
stop_standby() {
    [[ -n "$STANDBY" && -d "$STANDBY" ]] &&
        PG_CONFIG=$TREE_PG_CONFIG bash "$ROOT/test/cluster.sh" destroy "$STANDBY" >/dev/null 2>&1
}
trap 'stop_standby; stop_bare_cluster; cleanup' EXIT
trap 'stop_standby; stop_bare_cluster; cleanup; echo "$TEST_NAME: interrupted"; echo "$PASSED passed, $((FAILED + 1)) failed"; exit 1' INT TERM

python3 -c 'import standardwebhooks' 2>/dev/null ||
    die "the PyPI package standardwebhooks is needed (scripts/install-deps.sh installs it)"
log "building relaybus-agent and the managed script"
make -s -C "$ROOT" agent >/dev/null || die "make agent failed"
make -s -C "$ROOT" managed >/dev/null || die "make managed failed"
build_client || die "could not build listen_client"

# A database with the extension, on run_all.sh's cluster (relaybus preloaded).
EXT_CONNINFO=
if psql_q -d postgres -c 'SELECT 1' >/dev/null 2>&1 && new_db extdb agent; then
    EXT_CONNINFO="host=$PGHOST port=$PGPORT dbname=$extdb user=postgres"
fi

bare_cluster || die "the cluster without relaybus did not start"
check_eq "no relaybus file in the cluster's lib and share directories" "" "$(find "$TREE" -name 'relaybus*' | head -3)"
check_eq "nothing preloaded" "" "$(psql_q -U postgres -d postgres -c 'SHOW shared_preload_libraries')"
managed_owner "$OWNER" "$DB" || die "could not create the owner"
out=$(managed_install "$OWNER" "$DB" 2>&1) || die "install failed: $out"
pass "the edition installs as $OWNER (not a superuser)"
psql_q -U postgres -d postgres -c "CREATE ROLE agent_login LOGIN IN ROLE relay_agent" \
    -c "CREATE ROLE no_grant LOGIN" -c "CREATE DATABASE plain" >/dev/null || die "could not create the roles"
check_eq "the agent's role: not a superuser, its one role relay_agent" "f|relay_agent" \
    "$(psql_q -U postgres -d postgres -c "SELECT r.rolsuper, string_agg(g.rolname, ',') FROM pg_roles r
        JOIN pg_auth_members m ON m.member = r.oid JOIN pg_roles g ON g.oid = m.roleid
        WHERE r.rolname = 'agent_login' GROUP BY r.rolsuper")"
check_eq "relay_agent may not read relay.deliveries or relay.handlers" "f|f" \
    "$(psql_q -U postgres -d "$DB" -c "SELECT has_table_privilege('relay_agent', 'relay.deliveries', 'SELECT'),
                                             has_table_privilege('relay_agent', 'relay.handlers', 'SELECT')")"
check_eq "relay_claim still refuses an http handler to a consumer (42809)" "42809" \
    "$(psql_q -U "$OWNER" -d "$DB" -c "SELECT relay_create_handler('probe', 'http', 'https://example.com/')" \
        -c "DO \$\$ BEGIN PERFORM relay_claim('probe'); EXCEPTION WHEN OTHERS THEN RAISE NOTICE '%', SQLSTATE; END \$\$" \
        -c "SELECT relay_drop_handler('probe')" 2>&1 | sed -n 's/^NOTICE: *//p')"

own() { psql_q -U "$OWNER" -d "$DB" "$@"; }
conninfo() { echo "host=$PGHOST port=$PGPORT dbname=${2:-$DB} user=${1:-agent_login}"; }
# start_agent NAME [options]: an agent in the background, log in $TMP/NAME.log; AGENT_PID.
start_agent() {
    local name=$1
    shift
    "$AGENT" --database "$(conninfo)" --http-allowlist 127.0.0.1 --log-level debug "$@" 2>"$TMP/$name.log" &
    AGENT_PID=$!
    bg_track "$AGENT_PID"
}
log_has() { grep -qF -- "$2" "$TMP/$1.log"; }
# metric_is AGENT_LOG METRIC VALUE: the agent's /metrics (--metrics-addr
# 127.0.0.1:0: the port is in its log) shows METRIC (with its labels) at VALUE.
metric_is() {
    local port
    port=$(grep -o '"port":[0-9]*' "$TMP/$1.log" | head -1 | cut -d: -f2)
    [[ -n "$port" && "$(curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$2" '$1 == m { print $2 }')" == "$3" ]]
}
# run_agent_once NAME CONNINFO: an agent expected to exit by itself; its code in WAIT_RC.
# latency_ok AGENT_LOG HANDLER N: the agent's relaybus_agent_delivery_latency_seconds
# for HANDLER: 16 bounds and +Inf in increasing order, cumulative counts, +Inf
# equal to _count equal to N, a _sum above 0.
latency_ok() {
    local port
    port=$(grep -o '"port":[0-9]*' "$TMP/$1.log" | head -1 | cut -d: -f2)
    curl -s "http://127.0.0.1:$port/metrics" | python3 -c '
import re, sys
h, n = sys.argv[1], int(sys.argv[2])
name = "relaybus_agent_delivery_latency_seconds"
buckets, total, count = [], None, None
for line in sys.stdin:
    m = re.fullmatch(name + r"_bucket\{handler=\"(.*)\",le=\"(.*)\"\} (\d+)\n", line)
    if m and m[1] == h:
        buckets.append((float(m[2]), int(m[3])))
    m = re.fullmatch(name + r"_(sum|count)\{handler=\"(.*)\"\} (\S+)\n", line)
    if m and m[2] == h:
        if m[1] == "sum": total = float(m[3])
        else: count = int(m[3])
les, counts = [b[0] for b in buckets], [b[1] for b in buckets]
ok = (len(buckets) == 17 and les == sorted(les) and les[-1] == float("inf")
      and counts == sorted(counts) and counts[-1] == count == n and total is not None and total > 0)
sys.exit(0 if ok else print(buckets, total, count) or 1)' "$2" "$3"
}
run_agent_once() {
    "$AGENT" --database "$2" --log-level debug 2>"$TMP/$1.log" &
    wait_pid $! 30
}
# publish_keyed PREFIX KEYS TXNS PER_TXN TOPIC: committed transactions of
# PER_TXN events each, keys PREFIX0..PREFIX(KEYS-1) in turn; every event id and
# key also goes into pub_log in the same transaction.
publish_keyed() {
    local prefix=$1 keys=$2 txns=$3 per=$4 topic=$5 t
    for ((t = 0; t < txns; t++)); do
        echo "DO \$\$ DECLARE e bigint; k text; BEGIN FOR i IN 1..$per LOOP
                k := '$prefix' || (($t * $per + i) % $keys);
                e := relay_publish('$topic', jsonb_build_object('t', $t, 'i', i), k);
                INSERT INTO pub_log VALUES (e, k); END LOOP; END \$\$;"
    done | psql -X -q -v ON_ERROR_STOP=1 -U "$OWNER" -d "$DB" >/dev/null
}
published_of() { own -c "SELECT id, key FROM pub_log WHERE key LIKE '$1%' ORDER BY id" >"$TMP/$1.pub"; }
pending_is() { [[ "$(own -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                              WHERE h.name = '$1'")" == "$2" ]]; }

# ================================================================ (1) refusals
log "(1) refusals"
if [[ -n "$EXT_CONNINFO" ]]; then
    run_agent_once ext "$EXT_CONNINFO"
    check_eq "(1) a database with the extension: exit 2" 2 "$WAIT_RC"
    check "(1) ... saying why" log_has ext "refusing a database where the relaybus extension is installed"
else
    fail "(1) a database with the extension" "run_all.sh's cluster (PGHOST/PGPORT) is not reachable"
fi
run_agent_once plain "$(conninfo agent_login plain)"
check_eq "(1) a database without the edition: exit 2" 2 "$WAIT_RC"
check "(1) ... saying so" log_has plain "the managed SQL edition with relaybus-agent's functions is not installed"
run_agent_once nogrant "$(conninfo no_grant)"
check_eq "(1) a role without relay_agent: exit 2" 2 "$WAIT_RC"
check "(1) ... with the grant it needs" log_has nogrant "GRANT relay_agent TO no_grant"
"$AGENT" --database "host=127.0.0.1 port=1 dbname=x connect_timeout=2" 2>"$TMP/unreach.log" &
pid=$!
bg_track "$pid"
unreach_attempts() { (($(grep -c '"msg":"cannot connect to the database"' "$TMP/unreach.log") >= 3)); }
check "(1) an unreachable server: a log line per attempt, tried again" wait_until 30 unreach_attempts
check "(1) ... still running, with a growing delay (500, 1000, 2000 ms)" \
    bash -c "kill -0 $pid && grep -o '\"in_ms\":[0-9]*' '$TMP/unreach.log' | head -3 | tr '\n' ' ' | grep -qx '\"in_ms\":500 \"in_ms\":1000 \"in_ms\":2000 '"
kill -TERM "$pid"
wait_pid "$pid" 20
check_eq "(1) ... and SIGTERM stops it (exit 0)" 0 "$WAIT_RC"
# A wrong password: the server refuses it; tried again like any connection failure.
psql_q -U postgres -d postgres -c "CREATE ROLE agent_pw LOGIN PASSWORD 'right-pw' IN ROLE relay_agent" >/dev/null
sed -i '1i local all agent_pw scram-sha-256' "$CLUSTER/data/pg_hba.conf"
psql_q -U postgres -d postgres -c "SELECT pg_reload_conf()" >/dev/null
"$AGENT" --database "$(conninfo agent_pw) password=wrong-pw" 2>"$TMP/badpw.log" &
pid=$!
bg_track "$pid"
badpw_attempts() { (($(grep -c 'password authentication failed for user' "$TMP/badpw.log") >= 2)); }
check "(1) a wrong password: libpq's message in a log line per attempt, tried again" wait_until 30 badpw_attempts
check "(1) ... still running" kill -0 "$pid"
kill -TERM "$pid"
wait_pid "$pid" 20
"$AGENT" --database "$(conninfo agent_pw) password=right-pw" 2>"$TMP/goodpw.log" &
pid=$!
bg_track "$pid"
check "(1) the right password: connected" wait_until 30 log_has goodpw '"msg":"handlers loaded"'
kill -TERM "$pid"
wait_pid "$pid" 20
own -c "CREATE TABLE pub_log (id bigint PRIMARY KEY, key text)" >/dev/null

# ================================================================ (2) one agent, woken by NOTIFY
log "(2) one agent: http and notify, woken by the publishers"
start_receiver r || die "the receiver did not start"
URL=http://127.0.0.1:$RECV_PORT
LOG=$TMP/r.log
SECRET=$(new_secret)
own -c "SELECT relay_create_handler('hs', 'http', '$URL/hs', '{\"secret\": \"$SECRET\", \"concurrency\": 4}')" \
    -c "SELECT relay_route('two.#', 'hs')" \
    -c "SELECT relay_create_handler('nf', 'notify', 'agent_chan')" -c "SELECT relay_route('two.#', 'nf')" >/dev/null ||
    die "handlers"
start_client c2 "$DB" agent_chan || die "listen_client did not start"
start_agent a2 --poll-interval 30s --metrics-addr 127.0.0.1:0
A2=$AGENT_PID
check "(2) the agent connects" wait_until 30 log_has a2 '"msg":"handlers loaded"'
sleep 1
publish_keyed two 10 20 10 two.x
# Rolled back: the event id is drawn, its transaction never commits.
for i in 1 2 3; do
    psql -X -q -At -U "$OWNER" -d "$DB" -c "BEGIN" -c "SELECT relay_publish('two.x', '{\"rb\": true}', 'two1')" \
        -c "ROLLBACK" </dev/null
done | grep -E '^[0-9]+$' >"$TMP/two.rb"
check_eq "(2) three rolled-back publishes" 3 "$(line_count "$TMP/two.rb")"
published_of two
check "(2) the 200 committed events reach the receiver (the poll is 30 s: NOTIFY woke the agent)" \
    wait_requests "$LOG" /hs 200 25
check "(2) ... and the LISTEN client" wait_lines "$TMP/c2.out" 200 25
check "(2) nothing is left to deliver" wait_until 20 pending_is hs 0
check "(2) /metrics: 200 delivered (hs), 200 NOTIFYs sent (nf), connected" wait_until 10 bash -c \
    "$(declare -f metric_is); TMP='$TMP'; metric_is a2 'relaybus_agent_delivered_total{handler=\"hs\"}' 200 &&
     metric_is a2 'relaybus_agent_notified_total{handler=\"nf\"}' 200 && metric_is a2 relaybus_agent_up 1"
check "(2) /metrics: hs's latency histogram: cumulative buckets, +Inf = count = 200 delivered, sum > 0" \
    latency_ok a2 hs 200
check_eq "(2) /metrics: no latency series for a notify handler" 0 \
    "$(curl -s "http://127.0.0.1:$(grep -o '"port":[0-9]*' "$TMP/a2.log" | head -1 | cut -d: -f2)/metrics" |
        grep -c 'relaybus_agent_delivery_latency_seconds_count{handler="nf"}')"
if command -v promtool >/dev/null; then
    check "(2) /metrics passes promtool check metrics" bash -c \
        "curl -s http://127.0.0.1:\$(grep -o '\"port\":[0-9]*' '$TMP/a2.log' | head -1 | cut -d: -f2)/metrics |
         promtool check metrics"
fi
py_facts two "$LOG" /hs "$TMP/two.pub" --rolled-back "$TMP/two.rb" --secret "$SECRET" <"$INTEG_DIR/agent_http.py"
check_eq "(2) http: 200 requests, 200 events, none missing, none extra" "200 200 0 0" \
    "$(r requests) $(r distinct) $(r missing) $(r extra)"
check_eq "(2) http: per key in order, gapless" 0 "$(r order)"
check_eq "(2) http: every signature verifies with standardwebhooks" 200 "$(r signed_ok)"
check_eq "(2) http: no rolled-back event" 0 "$(r rolled_back)"
sleep 1
analyze --published "$TMP/two.pub" --rolled-back "$TMP/two.rb" "$TMP/c2.out" || die "deliveries.py failed"
check_eq "(2) notify: 200 notifications of 200 events, none missing, no duplicate" "200 200 0 0" \
    "$(r lines) $(r distinct) $(r missing) $(r dups)"
check_eq "(2) notify: per key in order, gapless, no rolled-back event" "0 0 0" \
    "$(r order_violations) $(r seq_gap_keys) $(r rolled_back_seen)"
check "(2) notify: the extension's payload (jsonb text: id, key, seq, topic, attempt, headers, payload, event_id)" \
    grep -qE $'\t''\{"id": [0-9]+, "key": "two[0-9]", "seq": [0-9]+, "topic": "two.x", "attempt": 1, "headers": null, "payload": \{"i": [0-9]+, "t": [0-9]+\}, "event_id": [0-9]+\}$' "$TMP/c2.out"

own -c "SELECT relay_create_handler('hs_new', 'http', '$URL/hs_new', '{\"cloudevents\": \"structured\"}')" \
    -c "SELECT relay_route('twoc.#', 'hs_new')" \
    -c "SELECT relay_publish('twoc.x', jsonb_build_object('n', n)) FROM generate_series(1, 3) n" >/dev/null
check "(2) a handler created meanwhile: its events arrive (the 'catalog' NOTIFY reloaded the agent)" \
    wait_requests "$LOG" /hs_new 3 15
py_facts ce "$LOG" <<'PY'
import json, sys
from http_log import records, facts
rs = records(sys.argv[1], "/hs_new")
facts({"sources": ",".join(sorted({r["env"]["source"] for r in rs})),
       "types": ",".join(sorted({r["headers"]["content-type"] for r in rs}))})
PY
check_eq "(2) ... as CloudEvents (structured) with the extension's default source /relaybus/<database>" \
    "/relaybus/$DB application/cloudevents+json" "$(r sources) $(r types)"

psql_q -U postgres -d postgres -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE application_name = 'relaybus-agent' AND usename = 'agent_login'" >/dev/null
check "(2) its backend terminated: the agent says so" wait_until 20 log_has a2 '"msg":"connection lost"'
two_connects() { (($(grep -c '"msg":"connected"' "$TMP/a2.log") >= 2)); }
check "(2) ... and reconnects" wait_until 30 two_connects
publish_keyed twob 2 2 5 two.x
check "(2) ... and delivers what is published next" wait_requests "$LOG" /hs 210 25
kill -TERM "$A2"
wait_pid "$A2" 30
check_eq "(2) SIGTERM: exit 0" 0 "$WAIT_RC"

# ================================================================ (3) retries, dead letters, the SSRF guard
log "(3) retries and dead letters"
own -c "SELECT relay_create_handler('hfail', 'http', '$URL/hfail', '{\"max_attempts\": 3, \"backoff_base\": \"100ms\", \"backoff_max\": \"200ms\"}')" \
    -c "SELECT relay_route('three.fail', 'hfail')" \
    -c "SELECT relay_create_handler('hssrf', 'http', 'http://127.0.0.2:$RECV_PORT/hssrf', '{\"max_attempts\": 5}')" \
    -c "SELECT relay_route('three.ssrf', 'hssrf')" >/dev/null || die "handlers"
recv_plan "$RECV_PORT" /hfail '[{"status": 500, "repeat": true}]' || die "receiver plan"
# Polling every 30 s: a retry is claimed when its backoff ends, not at a poll.
start_agent a3 --poll-interval 30s --metrics-addr 127.0.0.1:0
A3=$AGENT_PID
own -c "SELECT relay_publish('three.fail', '{\"n\": 1}', 'three')" -c "SELECT relay_publish('three.ssrf', '{\"n\": 2}')" >/dev/null
dead_rows() { [[ "$(own -c "SELECT count(*) FROM relay.dead_letters WHERE handler IN ('hfail', 'hssrf')")" == 2 ]]; }
check "(3) both end as dead letters" wait_until 60 dead_rows
check_eq "(3) 500: 3 attempts (max_attempts), then a dead letter with the status and error" "3|500|HTTP 500" \
    "$(own -c "SELECT attempts, last_status, last_error FROM relay.dead_letters WHERE handler = 'hfail'")"
check_eq "(3) ... the receiver got exactly 3 requests" 3 "$(recv_count "$LOG" /hfail)"
hfail_span=$(python3 -c "import json, sys
t = [json.loads(l)['t'] for l in open(sys.argv[1]) if json.loads(l)['path'] == '/hfail']
print(int((t[-1] - t[0]) * 1000))" "$LOG")
check "(3) ... each retry sent when its backoff (<= 200 ms) ended, not at the next poll (30 s): 3 requests in $hfail_span ms" \
    test "$hfail_span" -lt 5000
check "(3) ... retried with backoff (a retry line before the dead letter)" log_has a3 '"msg":"retry"'
check_eq "(3) an address the SSRF guard refuses (127.0.0.2, not allow-listed): a dead letter at the first attempt" \
    "1|t" "$(own -c "SELECT attempts, last_error LIKE '%not allowed%' FROM relay.dead_letters WHERE handler = 'hssrf'")"
check_eq "(3) ... and nothing reached the receiver" 0 "$(recv_count "$LOG" /hssrf)"
check "(3) /metrics: hfail retried 2 and dead 1, hssrf dead 1" wait_until 10 bash -c \
    "$(declare -f metric_is); TMP='$TMP'; metric_is a3 'relaybus_agent_retried_total{handler=\"hfail\"}' 2 &&
     metric_is a3 'relaybus_agent_dead_total{handler=\"hfail\"}' 1 && metric_is a3 'relaybus_agent_dead_total{handler=\"hssrf\"}' 1"
check "(3) /metrics: hfail's 3 attempts were 5xx, hssrf's one (never sent) an error" bash -c \
    "$(declare -f metric_is); TMP='$TMP'; metric_is a3 'relaybus_agent_http_responses_total{handler=\"hfail\",class=\"5xx\"}' 3 &&
     metric_is a3 'relaybus_agent_http_responses_total{handler=\"hfail\",class=\"2xx\"}' 0 &&
     metric_is a3 'relaybus_agent_http_responses_total{handler=\"hssrf\",class=\"error\"}' 1"

# ================================================================ (4) kill -9
log "(4) kill -9 of an agent with requests in flight"
own -c "SELECT relay_create_handler('hk', 'http', '$URL/hk', '{\"concurrency\": 4, \"timeout\": \"1s\", \"lease\": \"2s\", \"backoff_base\": \"100ms\", \"max_attempts\": 100}')" \
    -c "SELECT relay_route('four.#', 'hk')" \
    -c "SELECT relay_create_handler('nk', 'notify', 'agent_kill')" -c "SELECT relay_route('four.#', 'nk')" >/dev/null ||
    die "handlers"
recv_plan "$RECV_PORT" /hk '[{"delay": 0.05, "repeat": true}]' || die "receiver plan"
start_client c4 "$DB" agent_kill || die "listen_client did not start"
publish_keyed four 5 30 10 four.x
published_of four
check "(4) deliveries under way" wait_requests "$LOG" /hk 60 60
kill -9 "$A3"
wait "$A3" 2>/dev/null
at_kill=$(recv_count "$LOG" /hk)
# What the killed agent held: sent and not settled, or claimed and not sent.
own -c "SELECT l.delivery_id FROM relay.leases l JOIN relay.handlers h ON h.id = l.handler_id
        WHERE h.name = 'hk'" >"$TMP/four.leased"
start_agent a4 --poll-interval 200ms
A4=$AGENT_PID
check "(4) a new agent delivers the rest (the killed one's leases run out)" wait_until 120 pending_is hk 0
check "(4) ... and the notify handler's" wait_until 60 pending_is nk 0
py_facts four "$LOG" /hk "$TMP/four.pub" --leased "$TMP/four.leased" <"$INTEG_DIR/agent_http.py"
log "(4) committed 300, requests $(r requests), distinct $(r distinct), duplicated $(r dups), out of order $(r order) (killed at $at_kill requests, $(line_count "$TMP/four.leased") leased)"
check_eq "(4) http: every committed event delivered, none extra" "300 0 0" "$(r distinct) $(r missing) $(r extra)"
check_eq "(4) http: per key in order, gapless (first arrivals)" 0 "$(r order)"
check_eq "(4) http: duplicates ($(r dups)) only of deliveries the killed agent held" 0 "$(r dups_unleased)"
sleep 1
analyze --published "$TMP/four.pub" "$TMP/c4.out" || die "deliveries.py failed"
check_eq "(4) notify: every event once, in key order" "300 0 0 0" \
    "$(r distinct) $(r missing) $(r dups) $(r order_violations)"
kill -TERM "$A4"
wait_pid "$A4" 30

# ================================================================ (5) two agents
log "(5) two agents on one database"
own -c "SELECT relay_create_handler('h2', 'http', '$URL/h2', '{\"concurrency\": 4}')" -c "SELECT relay_route('five.#', 'h2')" \
    -c "SELECT relay_create_handler('n2', 'notify', 'agent_two')" -c "SELECT relay_route('five.#', 'n2')" >/dev/null ||
    die "handlers"
recv_plan "$RECV_PORT" /h2 '[{"delay": 0.01, "repeat": true}]' || die "receiver plan"
start_client c5 "$DB" agent_two || die "listen_client did not start"
start_agent a5 --poll-interval 200ms
A5=$AGENT_PID
start_agent b5 --poll-interval 200ms
B5=$AGENT_PID
both_loaded() { log_has a5 '"msg":"handlers loaded"' && log_has b5 '"msg":"handlers loaded"'; }
check "(5) both agents connect" wait_until 30 both_loaded
publish_keyed five 20 40 10 five.x
published_of five
check "(5) everything is delivered" wait_until 120 pending_is h2 0
check "(5) ... by both" wait_until 60 pending_is n2 0
py_facts five "$LOG" /h2 "$TMP/five.pub" <"$INTEG_DIR/agent_http.py"
claims_a=$(grep -c '"msg":"claimed"' "$TMP/a5.log")
claims_b=$(grep -c '"msg":"claimed"' "$TMP/b5.log")
log "(5) committed 400, requests $(r requests), duplicated $(r dups), out of order $(r order); http claims: $claims_a and $claims_b"
check_eq "(5) http: every event exactly once, none extra" "400 400 0 0" "$(r requests) $(r distinct) $(r missing) $(r extra)"
check_eq "(5) http: per key in order, gapless" 0 "$(r order)"
check "(5) both agents claimed http deliveries" test "$claims_a" -gt 0 -a "$claims_b" -gt 0
sleep 1
analyze --published "$TMP/five.pub" "$TMP/c5.out" || die "deliveries.py failed"
check_eq "(5) notify: every event exactly once, in key order, gapless" "400 400 0 0 0 0" \
    "$(r lines) $(r distinct) $(r missing) $(r dups) $(r order_violations) $(r seq_gap_keys)"
check "(5) no result was refused for a lost lease" bash -c "! grep -q 'lease is no longer held' '$TMP/a5.log' '$TMP/b5.log'"
kill -TERM "$A5" "$B5"
wait_pid "$A5" 30
wait_pid "$B5" 30


# ================================================================ (6) receipts
log "(6) every result is fenced by its lease token"
own -c "SELECT relay_create_handler('hf', 'http', '$URL/hf', '{\"backoff_base\": \"1h\", \"backoff_max\": \"1h\"}')" \
    -c "SELECT relay_route('six.#', 'hf')" -c "SELECT relay_publish('six.x', jsonb_build_object('n', n)) FROM generate_series(1, 4) n" \
    >/dev/null || die "handler"
HF=$(own -c "SELECT id FROM relay.handlers WHERE name = 'hf'")
as_agent() { psql_q -U agent_login -d "$DB" "$@"; }
# Three with a lease that outlasts a loaded machine's slowest psql, one with
# a 1 s lease to run out.
as_agent -c "SELECT id || ' ' || lease FROM relay._agent_claim($HF, 3, 120000, 1) ORDER BY id" >"$TMP/six.claimed"
as_agent -c "SELECT id || ' ' || lease FROM relay._agent_claim($HF, 1, 1000, 1)" >>"$TMP/six.claimed"
check_eq "(6) the agent's role claims the four (three with a 120 s lease, one with 1 s)" 4 \
    "$(line_count "$TMP/six.claimed")"
read -r d1 t1 < <(sed -n 1p "$TMP/six.claimed")
read -r d2 t2 < <(sed -n 2p "$TMP/six.claimed")
read -r d4 t4 < <(sed -n 3p "$TMP/six.claimed")
read -r d3 t3 < <(sed -n 4p "$TMP/six.claimed")
settle() { as_agent -c "SELECT result FROM relay._agent_settle(ARRAY[$1]::bigint[], ARRAY['$2']::uuid[], ARRAY['$3'], ARRAY[0]::bigint[], ARRAY['e']::text[], ARRAY[0])"; }
check_eq "(6) a forged token: stale" stale "$(settle "$d1" "$(python3 -c 'import uuid; print(uuid.uuid4())')" delivered)"
check_eq "(6) ... and the delivery is still there, unchanged" "1|0" \
    "$(own -c "SELECT count(*), max(attempt) FROM relay.deliveries WHERE id = $d1")"
check_eq "(6) its own token: delivered (deleted)" "delivered|0" \
    "$(settle "$d1" "$t1" delivered)|$(own -c "SELECT count(*) FROM relay.deliveries WHERE id = $d1")"
check_eq "(6) ... and not twice" stale "$(settle "$d1" "$t1" delivered)"
check_eq "(6) a retry: attempt 1, ready later" "retry|1|t" \
    "$(settle "$d2" "$t2" retry)|$(own -c "SELECT attempt, last_error IS NOT NULL FROM relay.deliveries WHERE id = $d2")"
check_eq "(6) a release: 1, the delivery ready again, no attempt charged" "1|0" \
    "$(as_agent -c "SELECT relay._agent_release(ARRAY[$d4]::bigint[], ARRAY['$t4']::uuid[])")|$(own -c "SELECT attempt FROM relay.deliveries WHERE id = $d4")"
sleep 1.5
check_eq "(6) its own token after the lease ran out: stale, nothing changed" "stale|0" \
    "$(settle "$d3" "$t3" dead)|$(own -c "SELECT count(*) FROM relay.dead_letters WHERE id = $d3")"
check_eq "(6) a bad outcome: 22023" 22023 \
    "$(as_agent -c "DO \$\$ BEGIN PERFORM relay._agent_settle(ARRAY[$d3]::bigint[], ARRAY['$t3']::uuid[], ARRAY['gone'], ARRAY[0]::bigint[], ARRAY[NULL]::text[], ARRAY[0]); EXCEPTION WHEN OTHERS THEN RAISE NOTICE '%', SQLSTATE; END \$\$" 2>&1 | sed -n 's/^NOTICE: *//p')"

# ================================================================ (7) ack mode, by reference
log "(7) notify in ack mode and by reference"
own -c "SELECT relay_create_handler('na', 'notify', 'agent_ack', '{\"ack\": true}')" -c "SELECT relay_route('seven.a', 'na')" \
    -c "SELECT relay_create_handler('nr', 'notify', 'agent_ref')" -c "SELECT relay_route('seven.r', 'nr')" >/dev/null ||
    die "handlers"
start_client c7a "$DB" agent_ack --ack || die "listen_client did not start"
start_client c7r "$DB" agent_ref --fetch-ref --ack-ref || die "listen_client did not start"
start_agent a7 --poll-interval 200ms --notify-payload-limit 200
A7=$AGENT_PID
publish_keyed seven 2 4 5 seven.a
published_of seven
own -c "SELECT relay_publish('seven.r', jsonb_build_object('big', repeat('x', 300), 'n', n)) FROM generate_series(1, 5) n" >/dev/null
check "(7) ack mode: all 20 acked by the client" wait_until 60 pending_is na 0
check "(7) by reference: all 5 fetched and acked" wait_until 60 pending_is nr 0
analyze --published "$TMP/seven.pub" "$TMP/c7a.out" || die "deliveries.py failed"
check_eq "(7) ack mode: every event once, in key order, one at a time per key" "20 20 0 0 0" \
    "$(r lines) $(r distinct) $(r missing) $(r dups) $(r order_violations)"
check_eq "(7) ack mode: every message carries its lease" 20 "$(grep -c '"lease": "[0-9a-f-]*"}' "$TMP/c7a.out")"
check_eq "(7) by reference: 5 messages with \"ref\": true and the lease, each payload fetched" "5 5" \
    "$(grep -c '"ref": true' "$TMP/c7r.out") $(grep -c 'fetched=.*xxxxxxxxxx' "$TMP/c7r.out")"
kill -TERM "$A7"
wait_pid "$A7" 30


# ================================================================ (8) a server restart
log "(8) a server restart with requests in flight"
own -c "SELECT relay_create_handler('hr', 'http', '$URL/hr', '{\"concurrency\": 4}')" -c "SELECT relay_route('eight.#', 'hr')" \
    >/dev/null || die "handler"
recv_plan "$RECV_PORT" /hr '[{"delay": 0.05, "repeat": true}]' || die "receiver plan"
start_agent a8 --poll-interval 200ms
A8=$AGENT_PID
publish_keyed eight 5 30 10 eight.x
published_of eight
check "(8) deliveries under way" wait_requests "$LOG" /hr 40 60
PG_CONFIG=$TREE_PG_CONFIG bash "$ROOT/test/cluster.sh" restart "$CLUSTER" >/dev/null || die "restart failed"
check "(8) the agent saw the connection go" wait_until 30 log_has a8 '"msg":"connection lost"'
eight_connects() { (($(grep -c '"msg":"connected"' "$TMP/a8.log") >= 2)); }
check "(8) ... and reconnected" wait_until 60 eight_connects
check "(8) everything is delivered" wait_until 120 pending_is hr 0
py_facts eight "$LOG" /hr "$TMP/eight.pub" <"$INTEG_DIR/agent_http.py"
log "(8) committed 300, requests $(r requests), duplicated $(r dups), out of order $(r order)"
check_eq "(8) every committed event delivered, none extra" "300 0 0" "$(r distinct) $(r missing) $(r extra)"
check_eq "(8) per key in order, gapless (first arrivals)" 0 "$(r order)"
kill -TERM "$A8"
wait_pid "$A8" 30


# ================================================================ (9) a standby, a failover
log "(9) a standby and a failover"
STANDBY=$TMP/standby
PG_CONFIG=$TREE_PG_CONFIG start_standby "$PGHOST" "$PGPORT" "$STANDBY" agent_standby 2>"$TMP/standby.out" ||
    die "standby: $(cat "$TMP/standby.out")"
SPORT=$STANDBY_PORT
on_standby() { psql -X -q -At -h "$STANDBY" -p "$SPORT" -U postgres -d "$DB" "$@" </dev/null; }
check_eq "(9) the standby is in recovery" t "$(on_standby -c "SELECT pg_is_in_recovery()")"
"$AGENT" --database "host=$STANDBY port=$SPORT dbname=$DB user=agent_login" 2>"$TMP/standby_agent.log" &
pid=$!
bg_track "$pid"
in_recovery_twice() { (($(grep -c '"msg":"the server is in recovery (a standby): trying again"' "$TMP/standby_agent.log") >= 2)); }
check "(9) an agent pointed at the standby: a log line per attempt, tried again" wait_until 30 in_recovery_twice
check "(9) ... with the hint" log_has standby_agent "target_session_attrs=read-write"
kill -TERM "$pid"
wait_pid "$pid" 20

# Synchronous: a publish commits once the standby has it, so a failover loses
# nothing committed.
psql_q -U postgres -d postgres -c "ALTER SYSTEM SET synchronous_standby_names = 'agent_standby'" \
    -c "SELECT pg_reload_conf()" >/dev/null
own -c "SELECT relay_create_handler('hfo', 'http', '$URL/hfo', '{\"concurrency\": 4, \"timeout\": \"2s\", \"lease\": \"2s\"}')" \
    -c "SELECT relay_route('nine.#', 'hfo')" >/dev/null || die "handler"
recv_plan "$RECV_PORT" /hfo '[{"delay": 0.05, "repeat": true}]' || die "receiver plan"
"$AGENT" --database "host=$PGHOST,$STANDBY port=$PGPORT,$SPORT dbname=$DB user=agent_login target_session_attrs=read-write connect_timeout=2" \
    --http-allowlist 127.0.0.1 --poll-interval 200ms --log-level debug 2>"$TMP/a9.log" &
A9=$!
bg_track "$A9"
check "(9) the agent given both hosts connects to the primary" wait_until 30 log_has a9 "\"host\":\"$PGHOST\""
publish_keyed nine 5 30 10 nine.x
published_of nine
check "(9) deliveries under way" wait_requests "$LOG" /hfo 40 60
PG_CONFIG=$TREE_PG_CONFIG bash "$ROOT/test/cluster.sh" stop-immediate "$CLUSTER" >/dev/null
on_standby -c "SELECT pg_promote()" >/dev/null
check "(9) the standby is promoted" wait_until 30 bash -c "[[ \"\$(psql -X -At -h '$STANDBY' -p $SPORT -U postgres -d postgres -c 'SELECT pg_is_in_recovery()' </dev/null)\" == f ]]"
check "(9) the agent follows it" wait_until 60 log_has a9 "\"host\":\"$STANDBY\""
fo_pending_zero() { [[ "$(on_standby -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'hfo'")" == 0 ]]; }
check "(9) everything is delivered from the new primary" wait_until 120 fo_pending_zero
py_facts nine "$LOG" /hfo "$TMP/nine.pub" <"$INTEG_DIR/agent_http.py"
log "(9) committed 300, requests $(r requests), duplicated $(r dups), out of order $(r order)"
check_eq "(9) every committed event delivered, none extra" "300 0 0" "$(r distinct) $(r missing) $(r extra)"
check_eq "(9) per key in order, gapless (first arrivals)" 0 "$(r order)"
kill -TERM "$A9"
wait_pid "$A9" 30

# finish() clears the EXIT trap: the clusters go first.
stop_standby
stop_bare_cluster
finish
