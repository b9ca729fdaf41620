#!/usr/bin/env bash
# relaybus-agent delivering kafka handlers (docs/managed.md, docs/kafka.md):
# the managed SQL edition installed by an owner that is not a superuser on a
# cluster without any relaybus library, the agent logged in as a role whose
# one grant is relay_agent, a real KRaft broker and kcat as the consumer.
#
#  (a) 200 keys of 5 events and one hot key of 1,000: every one in the topic
#      once, each key in seq order in one partition, that partition the Java
#      client's (murmur2) and the extension's for the same key (a database of
#      run_all.sh's cluster, its workers producing the same keys); /metrics
#      counts the sends
#  (b) a message too large for its topic inside a window: dead-lettered with
#      the broker's error, the key's later ones after the gap, named in a log
#      line and counted (relaybus_agent_delivered_after_gap_total)
#  (c) kill -9 of the agent with full windows (the broker frozen), a new
#      agent: nothing lost, order kept, repeats only of whole runs, at most
#      the window per key
#  (d) the broker stopped for 20 s and started again, publishers committing
#      all along: nothing lost, nothing dead, order kept
export PGHOST=${PGHOST:-/nonexistent} PGPORT=${PGPORT:-1}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/managed_lib.sh"

DB=agentkafka
WINDOW=16
OWNER=relay_owner
OUTAGE_S=20

eval "$(declare -f cleanup | sed '1s/^cleanup/kafka_cleanup/')"
cleanup() {
    [[ -n "${extdb:-}" ]] && ext_psql -d postgres -c "DROP DATABASE IF EXISTS \"$extdb\" WITH (FORCE)" >/dev/null 2>&1
    stop_bare_cluster
    kafka_cleanup
}
trap 'cleanup' EXIT
trap 'cleanup; echo "$TEST_NAME: interrupted"; echo "$PASSED passed, $((FAILED + 1)) failed"; exit 1' INT TERM

log "building relaybus-agent and the managed script"
make -s -C "$RELAYBUS_ROOT" agent >/dev/null || die "make agent failed"
make -s -C "$RELAYBUS_ROOT" managed >/dev/null || die "make managed failed"
kafka_pick_port
kafka_start >"$TMP/broker-start.log" 2>&1 &
broker_starting=$!

# A database with the extension on run_all.sh's cluster: its workers place
# the same keys, for (a) to compare with.
extdb=
EXT_HOST=$PGHOST EXT_PORT=$PGPORT EXT_USER=${PGUSER:-$(id -un)}
ext_psql() { PGHOST=$EXT_HOST PGPORT=$EXT_PORT PGUSER=$EXT_USER psql_q "$@"; }
if ext_psql -d postgres -c 'SELECT 1' >/dev/null 2>&1; then
    extdb="it_agentkafka_ext_$$"
    ext_psql -d postgres -c "CREATE DATABASE \"$extdb\"" >/dev/null &&
        ext_psql -d "$extdb" -c "CREATE EXTENSION relaybus" >/dev/null || die "could not create $extdb"
fi

bare_cluster || die "the cluster without relaybus did not start"
check_eq "no relaybus file in the cluster's lib and share directories" "" "$(find "$TREE" -name 'relaybus*' | head -3)"
managed_owner "$OWNER" "$DB" || die "could not create the owner"
out=$(managed_install "$OWNER" "$DB" 2>&1) || die "install failed: $out"
pass "the edition installs as $OWNER (not a superuser)"
psql_q -U postgres -d postgres -c "CREATE ROLE agent_login LOGIN IN ROLE relay_agent" >/dev/null ||
    die "could not create the agent's role"
export PGUSER=$OWNER # sql, psql_q and kafka_lib.sh's helpers: the owner, in $DB
create_pub_log "$DB"
wait "$broker_starting" || die "the broker did not start: $(tail -5 "$TMP/broker-start.log")"

# start_agent NAME [options]: an agent in the background, log in $TMP/NAME.log; AGENT_PID.
start_agent() {
    local name=$1
    shift
    "$RELAYBUS_ROOT/relaybus-agent" --database "host=$PGHOST port=$PGPORT dbname=$DB user=agent_login" --metrics-addr 127.0.0.1:0 \
        --log-level info "$@" 2>"$TMP/$name.log" &
    AGENT_PID=$!
    bg_track "$AGENT_PID"
}
# metric_of AGENT METRIC: the value /metrics shows for METRIC (with its labels).
metric_of() {
    local port
    port=$(grep -o '"port":[0-9]*' "$TMP/$1.log" | head -1 | cut -d: -f2)
    curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$2" '$1 == m { print $2 }'
}
metric_is() { [[ "$(metric_of "$1" "$2")" == "$3" ]]; }
loaded() { grep -q '"msg":"handlers loaded"' "$TMP/$1.log"; }
# all_in_order LABEL HANDLER TOPIC KEYS_WHERE COMMITTED: every delivery of
# HANDLER completed and none dead, the topic holding COMMITTED messages, and
# against pub_log's rows KEYS_WHERE selects (kafka_order_facts, into R):
# nothing missing or uncommitted, each key in one partition, in seq order
# but for repeats of contiguous runs.
all_in_order() {
    local label=$1 handler=$2 topic=$3 where=$4 committed=$5
    check "$label every delivery is completed in the end" wait_until 180 none_pending "$DB" "$handler"
    check_eq "$label nothing is dead" 0 "$(dead_of "$DB" "$handler")"
    check_topic_has "$label every committed event is in the topic" "$DB" "$handler" "$topic" "$committed" 30
    kafka_consume "$topic" "$TMP/$handler.json"
    sql "$DB" "SELECT id, key FROM pub_log WHERE $where ORDER BY id" >"$TMP/pub-$handler.txt"
    kafka_order_facts "$TMP/$handler.json" "$TMP/pub-$handler.txt"
    log "$label committed=$committed messages=${R[messages]} missing=${R[missing]} duplicates=${R[duplicates]} rewinds=${R[rewinds]} max_rewind=${R[max_rewind]} max_dups_per_key=${R[max_dups_per_key]}"
    check_eq "$label nothing committed is missing" 0 "${R[missing]}"
    check_eq "$label nothing uncommitted arrived" 0 "${R[extra]}"
    check_eq "$label each key in one partition" True "${R[keys_in_one_partition]}"
    check_eq "$label per key in seq order, repeats only of contiguous runs" 0 "${R[out_of_order_runs]}"
}

start_agent a1
check "the agent connects and loads its handlers" wait_until 30 loaded a1

# ====================================================== (a) many keys, one hot
log "(a) 200 keys and a hot key"
kafka_create_topic relay-a 4 || die "could not create topic relay-a"
kafka_handler "$DB" ka relay-a \
    "{\"key_window\": $WINDOW, \"concurrency\": 16, \"backoff_base\": \"100ms\", \"backoff_max\": \"1s\"}" 'ka.#' ||
    die "could not create the handler"
t0=$(date +%s%N)
for part in 0 1 2 3; do
    sql "$DB" "INSERT INTO pub_log SELECT relay_publish('ka.ev', jsonb_build_object('i', i), k), k
                 FROM generate_series($part * 500 + 1, $part * 500 + 500) i,
                      LATERAL (SELECT CASE WHEN i % 2 = 0 THEN 'hot' ELSE 'k-' || (i % 400) END AS k) kk" >/dev/null
done
check "(a) the 2,000 deliveries are completed" wait_until 180 none_pending "$DB" ka
log "(a) 2,000 events (1,000 on one key, 1,000 on 200 keys) delivered in $((($(date +%s%N) - t0) / 1000000)) ms"
check_eq "(a) nothing is dead" 0 "$(dead_of "$DB" ka)"
check_topic_has "(a) the topic holds 2,000 messages" "$DB" ka relay-a 2000 30
kafka_consume relay-a "$TMP/a.json"
sql "$DB" "SELECT id, key FROM pub_log WHERE key = 'hot' OR key LIKE 'k-%' ORDER BY id" >"$TMP/pub-a.txt"
kafka_order_facts "$TMP/a.json" "$TMP/pub-a.txt"
log "(a) messages=${R[messages]} missing=${R[missing]} duplicates=${R[duplicates]} out_of_order=${R[out_of_order]}"
check_eq "(a) 2,000 messages" 2000 "${R[messages]}"
check_eq "(a) nothing is missing" 0 "${R[missing]}"
check_eq "(a) no duplicates without a failure" 0 "${R[duplicates]}"
check_eq "(a) each key in seq order" 0 "${R[out_of_order]}"
check_eq "(a) each key in one partition" True "${R[keys_in_one_partition]}"
check_eq "(a) /metrics: 2,000 sends, 2,000 delivered, none after a gap" "2000 2000 0" \
    "$(metric_of a1 'relaybus_agent_sends_total{handler="ka"}') $(metric_of a1 'relaybus_agent_delivered_total{handler="ka"}') $(metric_of a1 'relaybus_agent_delivered_after_gap_total{handler="ka"}')"

# The same keys through the extension's workers, one event each.
if [[ -n "$extdb" ]]; then
    kafka_create_topic relay-ext 4 || die "could not create topic relay-ext"
    ext_psql -d "$extdb" -c "SELECT relay_create_handler('kx', 'kafka', 'kafka://$KAFKA_BOOTSTRAP/relay-ext')" \
        -c "SELECT relay_route('kx.#', 'kx')" \
        -c "SELECT count(relay_publish('kx.ev', '{}', k)) FROM (SELECT DISTINCT key AS k FROM (VALUES $(
            cut -d'|' -f2 "$TMP/pub-a.txt" | sort -u | sed "s/.*/('&')/" | paste -sd,)) v(key)) keys" >/dev/null ||
        die "could not publish through the extension"
    check_topic_has "(a) the extension's workers produced the 201 keys" "$DB" ka relay-ext 201 90
    kafka_consume relay-ext "$TMP/ext.json"
else
    fail "(a) the extension's placement" "run_all.sh's cluster (PGHOST/PGPORT) is not reachable"
    : >"$TMP/ext.json"
fi
placement=$(PYTHONPATH=$INTEG_DIR python3 - "$TMP/a.json" "$TMP/ext.json" <<'EOF'
import json, sys
from kafka_murmur2 import java_partition
def parts(f):
    return {m["key"]: m["partition"] for m in map(json.loads, filter(str.strip, open(f)))}
agent, ext = parts(sys.argv[1]), parts(sys.argv[2])
print(len(agent), sum(java_partition(k, 4) == p for k, p in agent.items()),
      sum(ext.get(k) == p for k, p in agent.items()), len(set(agent.values())))
EOF
)
log "(a) keys, agreeing with the Java client, agreeing with the extension, partitions used: $placement"
check_eq "(a) all 201 keys where the Java client (murmur2) and the extension put them, over all 4 partitions" \
    "201 201 201 4" "$placement"

# ============================================== (b) a permanent failure in a window
log "(b) a message too large inside a window"
kafka_gap_case "$DB" "$WINDOW" "(b) "
gap_line() { grep -m1 'kafka handler gap, key \\"g\\": delivery [0-9]* (seq 5) failed' "$TMP/a1.log"; }
check "(b) a log line names the failure and counts the later ones acknowledged after it" wait_until 20 gap_line
log "(b) $(gap_line | python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["msg"])')"
check "(b) ... five of them (6 to 10, all in flight with it)" grep -q '5 later message(s) of the key' <<<"$(gap_line)"
check "(b) /metrics: 5 delivered after the gap, 1 dead, 10 sends" wait_until 10 eval \
    "metric_is a1 'relaybus_agent_delivered_after_gap_total{handler=\"gap\"}' 5 &&
     metric_is a1 'relaybus_agent_dead_total{handler=\"gap\"}' 1 && metric_is a1 'relaybus_agent_sends_total{handler=\"gap\"}' 10"

# ================================================ (c) kill -9 with full windows
log "(c) kill -9 of the agent with full windows"
kafka_create_topic relay-wcrash 3 || die "could not create topic relay-wcrash"
kafka_handler "$DB" wc relay-wcrash \
    "{\"key_window\": $WINDOW, \"timeout\": \"5s\", \"lease\": \"5s\", \"backoff_base\": \"100ms\", \"backoff_max\": \"1s\", \"max_attempts\": 100, \"concurrency\": 64}" \
    'kw.#' || die "could not create the handler"
rm -f "$TMP/stop-publishing"
kafka_publish_loop "$DB" "INSERT INTO pub_log SELECT relay_publish('kw.ev', jsonb_build_object('b', %B%, 'i', i), k), k
                            FROM generate_series(1, 60) i, LATERAL (SELECT CASE WHEN i % 6 = 0 THEN 'w-' || (i % 4)
                                                                                ELSE 'wh' END AS k) kk" 0.1 &
publisher=$!
bg_track "$publisher"
wc_count() { sql "$DB" "SELECT count(*) FROM pub_log WHERE key = 'wh' OR key LIKE 'w-%'"; }
wc_has() { (($(wc_count) >= $1)); }
check "(c) publishing is under way" wait_until 60 wc_has 1200
check_topic_has "(c) messages flow into the topic" "$DB" wc relay-wcrash 300 90
kafka_freeze_mid_window "$DB" wc wh "$WINDOW" "(c) " metric_of a1 'relaybus_agent_handler_in_flight{handler="wc"}'
in_flight_at_kill=$KAFKA_IN_FLIGHT
at_kill=$(wc_count)
kill -9 "$AGENT_PID"
kill -CONT "$BROKER_PID"
log "(c) kill -9 of the agent with $in_flight_at_kill messages in flight and $at_kill events committed"
check "(c) the killed agent had a full window in flight" test "${in_flight_at_kill:-0}" -ge "$WINDOW"
start_agent a2
check "(c) publishing goes on after the kill" wait_until 60 wc_has $((at_kill + 600))
touch "$TMP/stop-publishing"
wait "$publisher"
all_in_order "(c)" wc relay-wcrash "key = 'wh' OR key LIKE 'w-%'" "$(wc_count)"
check "(c) a key repeats at most a window ($WINDOW)" test "${R[max_dups_per_key]}" -le "$WINDOW"

# ==================================================== (d) the broker away for 20 s
log "(d) the broker stopped for ${OUTAGE_S} s"
kafka_create_topic relay-outage 3 || die "could not create topic relay-outage"
kafka_handler "$DB" ko relay-outage \
    '{"backoff_base": "200ms", "backoff_max": "2s", "max_attempts": 1000, "concurrency": 64}' 'ko.#' ||
    die "could not create the handler"
rm -f "$TMP/stop-publishing"
kafka_publish_loop "$DB" "INSERT INTO pub_log SELECT relay_publish('ko.ev', jsonb_build_object('b', %B%, 'i', i),
                            'o-' || (i % 10)), 'o-' || (i % 10) FROM generate_series(1, 20) i" 0.2 &
publisher=$!
bg_track "$publisher"
ko_count() { sql "$DB" "SELECT count(*) FROM pub_log WHERE key LIKE 'o-%'"; }
check_topic_has "(d) messages flow into the topic" "$DB" ko relay-outage 200 90
before=$(ko_count)
kafka_stop >/dev/null
sleep "$OUTAGE_S"
during=$(ko_count)
log "(d) $before events committed when the broker stopped, $during when it restarts"
check "(d) publishing went on during the outage" test "$during" -gt $((before + 200))
check "(d) deliveries wait (some pending)" test "$(pending_of "$DB" ko)" -gt 0
kafka_restart >/dev/null || die "the broker did not restart"
sleep 2
touch "$TMP/stop-publishing"
wait "$publisher"
all_in_order "(d)" ko relay-outage "key LIKE 'o-%'" "$(ko_count)"
check "(d) a repeated run is at most a window (the default, $DEFAULT_KEY_WINDOW)" \
    test "${R[max_rewind]}" -le "$DEFAULT_KEY_WINDOW"
check "(d) the agent is still up" kill -0 "$AGENT_PID"
finish
