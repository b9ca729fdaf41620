#!/usr/bin/env bash
# A busy key pipelined (the kafka handler option key_window), with a real
# broker and kcat as the consumer:
#   (a) one hot key of 2,000 events: every one in the topic once, in seq order;
#   (b) a message too large for its topic inside a window: dead-lettered with
#       the broker's error, the key's later ones of the window in the topic
#       after the gap, named in a log line and counted (relay.handler_stats.
#       delivered_after_gap), order kept;
#   (c) kill -9 of the dispatcher with a full window (its completion held
#       by a row lock, publishers committing): nothing lost, order kept, the
#       only repeats whole contiguous runs of at most the window per key.
# The broker outage with a window in flight is kafka_outage.sh.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

[[ -n "$SERVER_LOG" && -f "$SERVER_LOG" ]] ||
    die "RELAYBUS_CLUSTER_DIR is not set: this test crashes the cluster and reads its log"
WINDOW=16

kafka_start || die "the broker did not start"
new_db db kafka_window || die "could not create a database"
create_pub_log "$db"
check "a dispatcher serves the new database" wait_workers "$db" 1 20

# (a) one hot key.
kafka_create_topic relay-hot 3 || die "could not create topic relay-hot"
kafka_handler "$db" hot relay-hot \
    "{\"key_window\": $WINDOW, \"concurrency\": 64, \"backoff_base\": \"100ms\", \"backoff_max\": \"1s\"}" 'kh.#' ||
    die "could not create the handler"
t0=$(date +%s%N)
sql "$db" "INSERT INTO pub_log SELECT relay_publish('kh.ev', jsonb_build_object('i', i), 'hot'), 'hot'
             FROM generate_series(1, 2000) i" >/dev/null
check "the hot key's 2,000 deliveries are completed" wait_until 120 none_pending "$db" hot
log "2,000 events of one key drained in $((($(date +%s%N) - t0) / 1000000)) ms (key_window $WINDOW)"
check_eq "nothing is dead" 0 "$(dead_of "$db" hot)"
check_topic_has "the topic holds 2,000 messages" "$db" hot relay-hot 2000 30
kafka_consume relay-hot "$TMP/hot.json"
dump_pub_log "$db" "$TMP/pub-hot.txt"
kafka_order_facts "$TMP/hot.json" "$TMP/pub-hot.txt"
check_eq "nothing is missing" 0 "${R[missing]}"
check_eq "no duplicates without a failure" 0 "${R[duplicates]}"
check_eq "the key in seq order" 0 "${R[out_of_order]}"

# (b) a permanent failure inside a window.
log_mark=$(wc -c <"$SERVER_LOG")
kafka_gap_case "$db" "$WINDOW"
gap_line() { tail -c +"$((log_mark + 1))" "$SERVER_LOG" | grep -m1 'kafka handler gap, key "g": delivery [0-9]* (seq 5) failed'; }
check "a log line names the failure and counts the later ones acknowledged after it" wait_until 20 gap_line
log "$(gap_line | sed 's/.*relaybus dispatcher: //')"
check "... five of them (6 to 10, all in flight with it)" grep -q '5 later message(s) of the key' <<<"$(gap_line)"
check_eq "relay.handler_stats counts them in delivered_after_gap; 10 produces went out, each with its send time" \
    "5|10|t" "$(sql "$db" "SELECT s.delivered_after_gap, m.sends, s.send_p99_ms > 0 FROM relay.handler_stats s
                            JOIN relay.handler_metrics m USING (handler) WHERE handler = 'gap'")"

# (c) kill -9 with a full window: one hot key and a few others, publishers
# committing all along.
kafka_create_topic relay-wcrash 3 || die "could not create topic relay-wcrash"
kafka_handler "$db" wc relay-wcrash \
    "{\"key_window\": $WINDOW, \"timeout\": \"10s\", \"backoff_base\": \"100ms\", \"backoff_max\": \"1s\", \"max_attempts\": 100, \"concurrency\": 64}" \
    'kw.#' || die "could not create the handler"
old_dispatcher=$(sql "$db" "SELECT pid FROM relay.workers")
kafka_publish_loop "$db" "INSERT INTO pub_log SELECT relay_publish('kw.ev', jsonb_build_object('b', %B%, 'i', i), k), k
                            FROM generate_series(1, 60) i, LATERAL (SELECT CASE WHEN i % 6 = 0 THEN 'w-' || (i % 4)
                                                                                ELSE 'wh' END AS k) kk" 0.1 &
publisher=$!
bg_track "$publisher"
check "publishing is under way" wait_until 60 pub_log_has "$db" 1200
check_topic_has "messages flow into the topic" "$db" wc relay-wcrash 300 90
kafka_freeze_mid_window "$db" wc wh "$WINDOW"
kafka_kill_mid_stream "$db" "$old_dispatcher" "$publisher" 600 "kill -CONT $BROKER_PID"
committed=$(sql "$db" "SELECT count(*) FROM pub_log WHERE key = 'wh' OR key LIKE 'w-%'")
check "every delivery is completed in the end" wait_until 180 none_pending "$db" wc
check_eq "nothing is dead" 0 "$(dead_of "$db" wc)"
check_topic_has "every committed event is in the topic" "$db" wc relay-wcrash "$committed" 30
kafka_consume relay-wcrash "$TMP/wc.json"
sql "$db" "SELECT id, key FROM pub_log WHERE key = 'wh' OR key LIKE 'w-%' ORDER BY id" >"$TMP/pub-wc.txt"
kafka_order_facts "$TMP/wc.json" "$TMP/pub-wc.txt"
log "messages=${R[messages]} duplicates=${R[duplicates]} rewinds=${R[rewinds]} max_rewind=${R[max_rewind]} max_dups_per_key=${R[max_dups_per_key]}"
check_eq "nothing committed is missing" 0 "${R[missing]}"
check_eq "nothing uncommitted arrived" 0 "${R[extra]}"
check_eq "each key in one partition" True "${R[keys_in_one_partition]}"
check_eq "per key in seq order, repeats only of contiguous runs" 0 "${R[out_of_order_runs]}"
check "the window in flight at the kill came again (some copies)" test "${R[duplicates]}" -gt 0
check "a key repeats at most a window ($WINDOW)" test "${R[max_dups_per_key]}" -le "$WINDOW"
finish
