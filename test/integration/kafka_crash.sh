#!/usr/bin/env bash
# kill -9 of the dispatcher while it produces into Kafka (publishers keep
# committing): the postmaster crash-restarts, a new dispatcher takes over, and
# in the end every committed event is in the topic, each key in one partition
# in seq order; the only duplicates are re-sends of messages that were in
# flight at the crash (at most one per key: with "key_window": 1 a key's next
# delivery waits for the previous one's acknowledgement; kafka_window.sh
# kills one with a window of a key in flight).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

[[ -n "${RELAYBUS_CLUSTER_DIR:-}" && -d "${RELAYBUS_CLUSTER_DIR}" ]] ||
    die "RELAYBUS_CLUSTER_DIR is not set: this test crashes the cluster"
KEYS=20

kafka_start || die "the broker did not start"
new_db db kafka_crash || die "could not create a database"
create_pub_log "$db"
check "a dispatcher serves the new database" wait_workers "$db" 1 20
old_dispatcher=$(sql "$db" "SELECT pid FROM relay.workers")
kafka_handler "$db" k "relay-crash" \
    '{"timeout": "10s", "backoff_base": "100ms", "backoff_max": "1s", "max_attempts": 100, "concurrency": 64,
      "key_window": 1}' 'kc.#' ||
    die "could not create the handler"

# Publishers: transactions of 50 events, one after the other, until told to
# stop (however slow the machine, publishing spans the kill); one that the
# crash aborts is simply not in pub_log (it is written in the same transaction).
kafka_publish_loop "$db" "INSERT INTO pub_log SELECT relay_publish('kc.ev', jsonb_build_object('b', %B%, 'i', i),
                             'k-' || (i % $KEYS)), 'k-' || (i % $KEYS) FROM generate_series(1, 50) i" 0.2 &
publisher=$!
bg_track "$publisher"
check "publishing is under way" wait_until 60 pub_log_has "$db" 800
check_topic_has "messages flow into the topic" "$db" k relay-crash 200 90
# Mid-stream: a backlog of 2,000 being produced.
kafka_backlog_flowing "$db" k 2000
some_pending() { (($(pending_of "$db" k) > 0)); }
check "deliveries are pending (the kill comes mid-stream)" some_pending
kafka_kill_mid_stream "$db" "$old_dispatcher" "$publisher" 500
committed=$(sql "$db" "SELECT count(*) FROM pub_log")
log "$committed events committed"
check "every delivery is completed in the end" wait_until 120 none_pending "$db" k
check_eq "nothing is dead" 0 "$(dead_of "$db" k)"
check_topic_has "every committed event is in the topic" "$db" k relay-crash "$committed" 30
kafka_consume relay-crash "$TMP/topic.json"
dump_pub_log "$db" "$TMP/pub.txt"
kafka_order_facts "$TMP/topic.json" "$TMP/pub.txt"
log "messages=${R[messages]} duplicates=${R[duplicates]} (${R[dup_ids]})"
check_eq "nothing committed is missing" 0 "${R[missing]}"
check_eq "nothing uncommitted arrived" 0 "${R[extra]}"
check_eq "each key in one partition" True "${R[keys_in_one_partition]}"
check_eq "per key in seq order (re-sends collapsed)" 0 "${R[out_of_order]}"
check "duplicates ($KEYS keys): at most one re-send per key, the one in flight" \
    test "${R[duplicates]}" -le "$KEYS"
finish
