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

[[ -n "${RELAYBUS_CLUSTER_DIR:-}" && -f "$RELAYBUS_CLUSTER_DIR/log/postgresql.log" ]] ||
    die "RELAYBUS_CLUSTER_DIR is not set: this test crashes the cluster and reads its log"
SERVER_LOG=$RELAYBUS_CLUSTER_DIR/log/postgresql.log
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

# (b) a permanent failure inside a window: seq 5 of 10 is larger than the
# topic's max.message.bytes; batch.size below it (docs/kafka.md) keeps the
# broker's refusal to that one's batch.
kafka_create_topic relay-gap 1 max.message.bytes=2000 || die "could not create topic relay-gap"
kafka_handler "$db" gap relay-gap \
    "{\"key_window\": $WINDOW, \"backoff_base\": \"100ms\", \"max_attempts\": 10, \"producer\": {\"batch.size\": \"1500\"}}" \
    'kg.#' || die "could not create the handler"
log_mark=$(wc -c <"$SERVER_LOG")
# Paused while publishing, so that the ten are claimed as one run.
sql "$db" "SELECT relay_pause_handler('gap')" \
    "SELECT relay_publish('kg.ev', CASE WHEN i = 5 THEN jsonb_build_object('i', i, 'blob', repeat('x', 5000))
                                        ELSE jsonb_build_object('i', i) END, 'g')
       FROM generate_series(1, 10) i" \
    "SELECT relay_resume_handler('gap')" >/dev/null
check "the large one is dead" wait_until 60 dead_is "$db" gap 1
check "the others are delivered" wait_until 60 none_pending "$db" gap
check_eq "dead on its first attempt with the broker's error, seq 5" \
    "1|5|kafka: Broker: Message size too large (MSG_SIZE_TOO_LARGE)" \
    "$(sql "$db" "SELECT attempts, seq, last_error FROM relay.dead_letters WHERE handler = 'gap'")"
check_topic_has "nine messages in the topic" "$db" gap relay-gap 9 20
kafka_consume relay-gap "$TMP/gap.json"
check_eq "the key's seqs in the partition: the gap at 5, the later ones after it" "1 2 3 4 6 7 8 9 10" \
    "$(python3 -c 'import json,sys
ms=sorted((json.loads(l) for l in open(sys.argv[1]) if l.strip()), key=lambda m: m["offset"])
print(" ".join(dict(zip(m["headers"][0::2], m["headers"][1::2]))["relay-seq"] for m in ms))' "$TMP/gap.json")"
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
# The hot key's backlog keeps its window full.
hot_backlog() { (($(sql "$db" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                                WHERE h.name = 'wc' AND d.key = 'wh'") > WINDOW)); }
check "the hot key has more than a window pending (the kill comes mid-stream)" wait_until 30 hot_backlog
# The broker is frozen (SIGSTOP): the dispatcher's runs go out and wait for
# their acknowledgements, so the kill comes with whole windows in flight;
# thawed after it, the broker writes what it had received.
broker_pid=$(cat "$KAFKA_DIR/broker.pid")
kill -STOP "$broker_pid"
sleep 2
kafka_kill_mid_stream "$db" "$old_dispatcher" "$publisher" 600 "kill -CONT $broker_pid"
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
