#!/usr/bin/env bash
# A LISTEN consumer receives every delivery of a fire-mode notify handler
# exactly once, in key order, from 4 concurrent publishers (pgbench: single
# publishes, multi-publish transactions, relay_publish_batch) over 3 hot keys,
# many distinct keys and unkeyed events; rolled-back publishes never arrive and
# a publish is sent only after its transaction commits.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHANNEL=it_delivery
new_db db delivery || die "could not create a database"
create_pub_log "$db"
notify_handler "$db" fire "$CHANNEL" '{"ack": false}' 'deliv.#' || die "could not create the handler"
check "a dispatcher serves the new database (relay.workers: 1 worker; the extension's holds all 64 lanes)" wait_workers "$db" 1 20
dispatcher=$(sql "$db" "SELECT pid FROM relay.workers")

start_client main "$db" "$CHANNEL" --timestamps || die "the LISTEN client did not start"

# ---- a publish is sent only when its transaction commits
log "late commit"
psql_q -d "$db" -c "BEGIN" \
    -c "INSERT INTO pub_log SELECT relay_publish('deliv.late', '{\"late\": true}', 'late-key'), 'late-key'" \
    -c "SELECT pg_sleep(4)" -c "COMMIT" >/dev/null &
late_pid=$!
bg_track "$late_pid"
in_sleep() {
    [[ $(sql postgres "SELECT count(*) FROM pg_stat_activity
        WHERE datname = '$db' AND query = 'SELECT pg_sleep(4)' AND state = 'active'") == 1 ]]
}
check "the late transaction published and is sleeping before COMMIT" wait_until 10 in_sleep
sleep 1.2
check "nothing arrives while the publishing transaction is open" \
    bash -c "! grep -q '\"late\": true' '$TMP/main.out'"
check "(the transaction was still open after that look)" in_sleep
wait_pid "$late_pid" 15
check_eq "the late transaction committed" 0 "$WAIT_RC"
check "the event arrives once its transaction committed" \
    wait_until 10 grep -q '"late": true' "$TMP/main.out"

# ---- 4 concurrent publishers
cat >"$TMP/single.sql" <<'EOF'
\set r random(1, 1000000000)
\set hot random(1, 6)
WITH k AS (SELECT CASE WHEN :hot <= 3 THEN 'hot-' || :hot
                       WHEN :hot = 4 THEN NULL
                       ELSE 'd-' || :client_id || '-' || :r END AS key)
INSERT INTO pub_log
SELECT relay_publish('deliv.single', jsonb_build_object('r', :r, 'c', :client_id), k.key), k.key FROM k;
EOF
cat >"$TMP/multi.sql" <<'EOF'
\set r random(1, 1000000000)
\set hot random(1, 3)
BEGIN;
INSERT INTO pub_log SELECT relay_publish('deliv.multi', jsonb_build_object('r', :r, 'i', 1), 'hot-' || :hot), 'hot-' || :hot;
INSERT INTO pub_log SELECT relay_publish('deliv.multi', jsonb_build_object('r', :r, 'i', 2), 'hot-' || :hot), 'hot-' || :hot;
INSERT INTO pub_log SELECT relay_publish('deliv.multi.unkeyed', jsonb_build_object('r', :r, 'i', 3)), NULL;
COMMIT;
EOF
cat >"$TMP/batch.sql" <<'EOF'
\set r random(1, 1000000000)
WITH ks AS (SELECT ARRAY['hot-1', 'b-' || :client_id || '-' || :r, 'hot-3', NULL] AS k)
INSERT INTO pub_log
SELECT u.id, u.key
  FROM ks, unnest(relay_publish_batch('deliv.batch',
                                      ARRAY['{"b": 1}', '{"b": 2}', '{"b": 3}', '{"b": 4}']::jsonb[],
                                      ks.k), ks.k) AS u(id, key);
EOF
# Rolled-back publishes, interleaved with the load: a ROLLBACK, a rolled-back
# savepoint, and a transaction that fails after publishing.
{
    for i in $(seq 1 15); do
        echo "BEGIN;"
        echo "SELECT relay_publish('deliv.rb', '{\"rolledback\": \"rollback\"}', 'hot-$((i % 3 + 1))');"
        echo "ROLLBACK;"
        echo "BEGIN; SAVEPOINT s;"
        echo "SELECT relay_publish('deliv.rb', '{\"rolledback\": \"savepoint\"}', 'hot-$((i % 3 + 1))');"
        echo "ROLLBACK TO SAVEPOINT s; COMMIT;"
        echo "BEGIN;"
        echo "SELECT relay_publish('deliv.rb', '{\"rolledback\": \"error\"}', 'rb-$i');"
        echo "SELECT 1/0;"
        echo "ROLLBACK;"
        echo "SELECT pg_sleep(0.1);"
    done
} >"$TMP/rollback.sql"

log "publishing with pgbench (4 clients) and a rollback session"
psql -X -At -d "$db" -f "$TMP/rollback.sql" >"$TMP/rollback.out" 2>"$TMP/rollback.err" &
rb_pid=$!
bg_track "$rb_pid"
pgbench -n -c 4 -j 4 -t 260 -f "$TMP/single.sql@6" -f "$TMP/multi.sql@2" -f "$TMP/batch.sql@2" \
    "$db" >"$TMP/pgbench.out" 2>&1
pgbench_rc=$?
check_eq "pgbench ran without errors" 0 "$pgbench_rc"
check "pgbench: every transaction processed" \
    grep -q 'number of transactions actually processed: 1040/1040' "$TMP/pgbench.out"
wait_pid "$rb_pid" 30
grep -E '^[0-9]+$' "$TMP/rollback.out" >"$TMP/rolled_back.ids"
check_eq "45 rolled-back publishes returned ids" 45 "$(wc -l <"$TMP/rolled_back.ids")"

published=$(sql "$db" "SELECT count(*) FROM pub_log")
log "published $published events; waiting for them"
check "about 2000 events were committed (got $published)" test "$published" -ge 1800
check "the client receives $published notifications" wait_lines "$TMP/main.out" "$published" 60
check "relay.deliveries is empty" wait_until 20 sql_is "$db" "SELECT count(*) FROM relay.deliveries" 0
sleep 1  # a late duplicate would show up now
kill "$CLIENT_PID" 2>/dev/null

dump_pub_log "$db" "$TMP/pub.txt"
analyze --published "$TMP/pub.txt" --rolled-back "$TMP/rolled_back.ids" "$TMP/main.out" \
    || die "analysis failed"
log "received: ${R[lines]} lines, ${R[distinct]} distinct events"
check_eq "every committed event was received" 0 "${R[missing]}"
[[ "${R[missing]}" == 0 ]] || echo "    missing: ${R[missing_ids]}"
check_eq "no event was received that was not committed" 0 "${R[extra]}"
check_eq "no event was received twice" 0 "${R[dups]}"
check_eq "no rolled-back event was received" 0 "${R[rolled_back_seen]}"
check_eq "per key, seqs strictly increase in receive order" "0 0" "${R[order_violations]} ${R[seq_repeats]}"
check_eq "per key, the received seqs are exactly 1..n" 0 "${R[seq_gap_keys]}"
check_eq "every notification carries its event's key" 0 "${R[key_mismatch]}"
check_eq "every line is PID<TAB>JSON" 0 "${R[bad_lines]}"
check_eq "the notifications come from the dispatcher" "$dispatcher" \
    "$(cut -f1 "$TMP/main.out" | sort -u | tr '\n' ' ' | sed 's/ $//')"
check "every notification has the documented fields with the right types" python3 - "$TMP/main.out" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line.split("\t")[1])
    assert set(m) == {"id", "event_id", "topic", "key", "seq", "attempt", "headers", "payload"}, m
    assert isinstance(m["id"], int) and isinstance(m["event_id"], int), m
    assert m["attempt"] == 1, m
    assert m["topic"].startswith("deliv."), m
    assert (m["key"] is None) == (m["seq"] is None), m
    assert isinstance(m["payload"], dict), m
EOF
await_counters "$db"
stats=$(sql "$db" "SELECT pending, in_flight, delivered FROM relay.handler_stats WHERE handler = 'fire'")
check_eq "relay.handler_stats: nothing pending or in flight, all delivered" "0|0|$published" "$stats"

finish
