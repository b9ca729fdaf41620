#!/usr/bin/env bash
# The broker stops for 30 s while publishers keep committing, with runs of
# keys in flight (the default key_window): the deliveries fail once they
# outlive the handler's timeout (the sink purges and replaces the producer),
# are retried with backoff behind the breaker, and once the broker is back
# they resume by themselves; in the end nothing is lost, each key is in one
# partition in seq order (a run the broker had may come again whole after
# itself), nothing is dead.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
KEYS=10
OUTAGE_S=${KAFKA_OUTAGE_S:-30}

kafka_start || die "the broker did not start"
new_db db kafka_outage || die "could not create a database"
create_pub_log "$db"
check "a dispatcher serves the new database" wait_workers "$db" 1 20
# The topic exists before the first produce (auto-creation is kafka_delivery's
# and kafka_crash's subject; this test's is the outage).
kafka_create_topic relay-outage 3 || die "could not create topic relay-outage"
kafka_handler "$db" k "relay-outage" \
    '{"timeout": "3s", "backoff_base": "200ms", "backoff_max": "2s", "max_attempts": 1000, "concurrency": 64}' 'ko.#' ||
    die "could not create the handler"

# Publishers: a transaction of 20 events every 0.2 s, before, during and after the outage.
publish() {
    local b=0
    while [[ ! -f "$TMP/stop" ]]; do
        b=$((b + 1))
        psql_q -d "$db" -c "INSERT INTO pub_log SELECT relay_publish('ko.ev', jsonb_build_object('b', $b, 'i', i),
                                'k-' || (i % $KEYS)), 'k-' || (i % $KEYS) FROM generate_series(1, 20) i" >/dev/null
        sleep 0.2
    done
}
publish &
bg_track $!
flow_t=$(date +%s%N)
check_topic_has "messages flow into the topic" "$db" k relay-outage 200 90
log "200 messages in the topic $((($(date +%s%N) - flow_t) / 1000000)) ms after publishing began"
before=$(sql "$db" "SELECT count(*) FROM pub_log")
log "broker stopped for ${OUTAGE_S}s with $before events committed"
kafka_stop
sleep "$OUTAGE_S"
during=$(sql "$db" "SELECT count(*) FROM pub_log")
check "publishing went on during the outage ($before -> $during)" test "$during" -gt $((before + 200))
check "deliveries wait (some pending)" test "$(pending_of "$db" k)" -gt 0
kafka_restart || die "the broker did not restart"
restart_t=$(date +%s)
touch "$TMP/stop"
sleep 0.5
committed=$(sql "$db" "SELECT count(*) FROM pub_log")
check "every delivery is completed once the broker is back" wait_until 120 none_pending "$db" k
log "caught up $(($(date +%s) - restart_t)) s after the restart"
check_eq "nothing is dead" 0 "$(dead_of "$db" k)"
check_topic_has "every committed event is in the topic" "$db" k relay-outage "$committed" 30
kafka_consume relay-outage "$TMP/topic.json"
dump_pub_log "$db" "$TMP/pub.txt"
kafka_order_facts "$TMP/topic.json" "$TMP/pub.txt"
log "committed=$committed messages=${R[messages]} duplicates=${R[duplicates]} rewinds=${R[rewinds]} max_rewind=${R[max_rewind]}"
check_eq "nothing committed is missing" 0 "${R[missing]}"
check_eq "nothing uncommitted arrived" 0 "${R[extra]}"
check_eq "each key in one partition" True "${R[keys_in_one_partition]}"
check_eq "per key in seq order, repeats only of contiguous runs" 0 "${R[out_of_order_runs]}"
check "a repeated run is at most a window (the default, $DEFAULT_KEY_WINDOW)" test "${R[max_rewind]}" -le "$DEFAULT_KEY_WINDOW"
purged() { grep -q "purged and replaced" "$SERVER_LOG"; }
if [[ -n "$SERVER_LOG" && -f "$SERVER_LOG" ]]; then
    check "the timeout purged and replaced the producer (the server log says so)" purged
fi
finish
