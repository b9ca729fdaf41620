#!/usr/bin/env bash
# Several pull consumers of one handler share its backlog without reading
# each other's rows in flight, and the claim frontier that lets them do so
# never hides a delivery for long (issue 14, item 2; docs/performance.md,
# "Pull: profile and fixes").
#
# (a) Four consumers drain 40,000 unkeyed deliveries (claim 100, ack, COMMIT):
#     each delivery once, and the claim scans read under 3.5 rows per row
#     acked, with under 3 % empty claims while a backlog remains. Every claim
#     used to scan from the oldest row, through the rows the other consumers
#     held and the entries of rows acked a moment ago: 6-7 scan rows per
#     delivery, and 17-39 % empty claims (rows acked after the claim's
#     snapshot, taken and found gone).
# (b) A retried delivery (nack, retry at once) behind a full backlog comes back
#     at the next claim.
# (c) A delivery whose publisher commits after later ones were claimed is
#     claimed while the backlog ahead still lasts (within the frontier's
#     250 ms), not after it.
# (d) A lease that expires behind a full backlog is handed over again (a
#     second attempt) while the backlog lasts.
# (e) A replayed dead letter (its old id) comes back at the next claim.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new_db db pullc || die "could not create a database"
sql "$db" "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null ||
    die "pg_stat_statements is not available"
set_conf pg_stat_statements.track all || die "could not set pg_stat_statements.track"
sql "$db" "SELECT relay_create_handler('p', 'pull', '', '{}')" "SELECT relay_route('p.#', 'p')" \
    "SELECT relay_create_handler('q', 'pull', '', '{\"backoff_base\": \"10ms\", \"backoff_max\": \"50ms\"}')" "SELECT relay_route('q.#', 'q')" \
    "SELECT relay_create_handler('r', 'pull', '', '{\"max_attempts\": 1}')" "SELECT relay_route('r.#', 'r')" \
    "CREATE TABLE got (id bigint PRIMARY KEY, consumer int NOT NULL)" \
    "CREATE TABLE claims (consumer int PRIMARY KEY, claims int, empty_with_backlog int)" \
    >/dev/null || die "could not create the handlers"

# publish DB TOPIC N: N unkeyed events in calls of 10,000.
publish() {
    local left=$3 n
    while ((left > 0)); do
        n=$((left > 10000 ? 10000 : left))
        sql "$1" "SELECT count(*) FROM unnest(relay_publish_batch('$2',
                      (SELECT array_agg(jsonb_build_object('i', g)) FROM generate_series(1, $n) g)))" >/dev/null ||
            return 1
        left=$((left - n))
    done
}

# ---------------------------------------------------------------- (a) four consumers
log "(a) four consumers drain 40,000 deliveries"
publish "$db" p.x 40000 || die "could not publish"
sql "$db" "VACUUM ANALYZE relay.deliveries" "SELECT pg_stat_statements_reset()" >/dev/null
consumer() {
    psql_q -d "$db" -c "DO \$\$
DECLARE ids bigint[]; leases uuid[]; n int := 0; e int := 0;
BEGIN
  LOOP
    SELECT array_agg(c.id), array_agg(c.lease) INTO ids, leases FROM relay_claim('p', 100) c;
    n := n + 1;
    IF ids IS NULL THEN
      EXIT WHEN NOT EXISTS (SELECT 1 FROM relay.deliveries WHERE handler_id = (SELECT id FROM relay.handlers WHERE name = 'p'));
      IF EXISTS (SELECT 1 FROM relay.deliveries WHERE handler_id = (SELECT id FROM relay.handlers WHERE name = 'p')
                 OFFSET 1000) THEN e := e + 1; END IF;
      COMMIT;
      PERFORM pg_sleep(0.002);
      CONTINUE;
    END IF;
    INSERT INTO got SELECT unnest(ids), $1;
    PERFORM relay_ack(ids, leases);
    COMMIT;
  END LOOP;
  INSERT INTO claims VALUES ($1, n, e);
END \$\$"
}
for i in 1 2 3 4; do
    consumer "$i" >"$TMP/consumer$i.out" 2>&1 &
    bg_track $!
done
rcs=0
for p in "${BG_PIDS[@]}"; do wait "$p" || rcs=$((rcs + 1)); done
BG_PIDS=()
check_eq "(a) the four consumers ran" 0 "$rcs"
check_eq "(a) every delivery once" "40000|40000|0" \
    "$(sql "$db" "SELECT count(*), count(DISTINCT id), (SELECT count(*) FROM relay.deliveries) FROM got")"
check_eq "(a) every consumer took a share" 4 "$(sql "$db" "SELECT count(DISTINCT consumer) FROM got")"
counters=$(sql "$db" "WITH s AS (SELECT query, sum(rows) AS rows FROM pg_stat_statements
                                  WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                                  GROUP BY query)
    SELECT round((SELECT sum(rows) FROM s WHERE query LIKE 'SELECT id, priority, key, not_before FROM (%')
                 / 40000.0, 2),
           (SELECT sum(claims) FROM claims), (SELECT sum(empty_with_backlog) FROM claims)")
IFS='|' read -r scan_rows nclaims nempty <<<"$counters"
log "(a) scans (calls, rows; from the frontier = 'id >= \$3'): $(sql "$db" "SELECT string_agg(
        CASE WHEN query LIKE '%id >= \$3%' THEN 'frontier ' ELSE 'head ' END || calls || ', ' || rows, '; ')
      FROM pg_stat_statements WHERE query LIKE 'SELECT id, priority, key, not_before FROM (%'
       AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")"
log "(a) scan rows per delivery $scan_rows, claims $nclaims, empty with a backlog left $nempty"
check "(a) under 3.5 scan rows per delivery (was 5.8-7)" awk -v r="$scan_rows" 'BEGIN { exit !(r != "" && r < 3.5) }'
check "(a) under 3 % empty claims while a backlog remains" \
    awk -v n="$nclaims" -v e="$nempty" 'BEGIN { exit !(n > 0 && e < 0.03 * n) }'

# A consumer of handler q: claims of 100, each acked, with a pause between
# them, until the backlog is gone; writes each claim's ids and the rows left.
slow_consumer() {
    psql_q -d "$db" -c "DO \$\$
DECLARE ids bigint[]; leases uuid[]; h int := (SELECT id FROM relay.handlers WHERE name = 'q');
BEGIN
  LOOP
    SELECT array_agg(c.id), array_agg(c.lease) INTO ids, leases FROM relay_claim('q', 100) c;
    EXIT WHEN ids IS NULL;
    INSERT INTO q_log SELECT clock_timestamp(), unnest(ids),
                             (SELECT count(*) FROM relay.deliveries WHERE handler_id = h) - array_length(ids, 1);
    PERFORM relay_ack(ids, leases);
    COMMIT;
    PERFORM pg_sleep(0.01);
  END LOOP;
END \$\$"
}
sql "$db" "CREATE TABLE q_log (at timestamptz, id bigint, left_after int)" >/dev/null

# ---------------------------------------------------------------- (b) a retry behind a backlog
log "(b) a retried delivery behind a full backlog"
publish "$db" q.x 300 || die "could not publish"
out=$(sql "$db" "DO \$\$
DECLARE ids bigint[]; leases uuid[]; again bigint[];
BEGIN
  SELECT array_agg(c.id), array_agg(c.lease) INTO ids, leases FROM relay_claim('q', 100) c;
  PERFORM relay_nack(ids[1], 'again', '0 seconds', leases[1]);
  PERFORM relay_ack(ids[2:100], leases[2:100]);
  COMMIT;
  SELECT array_agg(c.id), array_agg(c.lease) INTO again, leases FROM relay_claim('q', 100) c;
  RAISE NOTICE 'retried=% full=%', ids[1] = ANY (again), array_length(again, 1);
  PERFORM relay_ack(again, leases);
END \$\$" 2>&1)
check "(b) the retry is in the next claim of 100" grep -q "retried=t full=100" <<<"$out"
sql "$db" "DO \$\$ DECLARE ids bigint[]; leases uuid[]; BEGIN LOOP
             SELECT array_agg(c.id), array_agg(c.lease) INTO ids, leases FROM relay_claim('q', 1000) c;
             EXIT WHEN ids IS NULL; PERFORM relay_ack(ids, leases); COMMIT; END LOOP; END \$\$" >/dev/null

# ---------------------------------------------------------------- (c) a late commit
log "(c) a publisher that commits after later deliveries were claimed"
sql "$db" "TRUNCATE q_log" >/dev/null
psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" >"$TMP/late.out" 2>&1 <<'EOF' &
BEGIN;
SELECT 'late=' || relay_publish('q.late', '{}');
-- Commit once the consumer has claimed 2,000 later deliveries (and the
-- frontier is past this one's id).
DO $$ BEGIN
  WHILE (SELECT count(*) FROM q_log) < 2000 LOOP PERFORM pg_sleep(0.01); END LOOP;
END $$;
COMMIT;
EOF
late_pid=$!
bg_track $late_pid
wait_until 10 grep -q "late=" "$TMP/late.out" || die "the late publisher did not start"
late_event=$(sed -n 's/^late=//p' "$TMP/late.out")
publish "$db" q.x 20000 || die "could not publish"
slow_consumer >"$TMP/slow_c.out" 2>&1 &
slow_pid=$!
bg_track $slow_pid
wait "$late_pid"
check_eq "(c) the late publisher committed" 0 "$?"
wait "$slow_pid"
check_eq "(c) the consumer drained the backlog" 0 "$?"
# The late delivery's id was drawn before the 20,000 others: the lowest.
first_id=$(sql "$db" "SELECT min(id) FROM q_log")
late_info=$(sql "$db" "SELECT left_after FROM q_log WHERE id = $first_id")
log "(c) the late delivery (the lowest id, event $late_event) was claimed with $late_info rows left behind it"
check "(c) the late delivery was claimed" test -n "$late_info"
check "(c) ... after 2,000 later ones, while over 2,000 were left (not after the drain)" \
    test "${late_info:-0}" -gt 2000 -a "${late_info:-0}" -lt 18000

# ---------------------------------------------------------------- (d) an expired lease
log "(d) a lease that expires behind a full backlog"
sql "$db" "TRUNCATE q_log" >/dev/null
publish "$db" q.x 1 || die "could not publish"
held=$(sql "$db" "SELECT id FROM relay_claim('q', 1, '1 second')")
publish "$db" q.x 20000 || die "could not publish"
slow_consumer >"$TMP/slow_d.out" 2>&1
check_eq "(d) the consumer drained the backlog" 0 "$?"
held_left=$(sql "$db" "SELECT left_after FROM q_log WHERE id = $held")
log "(d) the expired delivery $held was claimed again with ${held_left:-?} rows left"
check "(d) the expired delivery was handed over again while over 2,000 rows were left" \
    test "${held_left:-0}" -gt 2000

# ---------------------------------------------------------------- (e) a replayed dead letter
log "(e) a replayed dead letter behind a full backlog"
publish "$db" r.x 1 || die "could not publish"
IFS='|' read -r dead_id dead < <(sql "$db" "SELECT c.id, relay_nack(c.id, 'poison', NULL, c.lease) FROM relay_claim('r', 1) c")
check_eq "(e) the delivery was dead-lettered" dead "$dead"
publish "$db" r.x 300 || die "could not publish"
sql "$db" "SELECT count(relay_ack(ARRAY[c.id], ARRAY[c.lease])) FROM relay_claim('r', 100) c" >/dev/null
sql "$db" "SELECT relay_replay(handler => 'r')" >/dev/null || die "relay_replay failed"
replayed=$(sql "$db" "SELECT count(*) FILTER (WHERE c.id = $dead_id) || '/' || count(*) FROM relay_claim('r', 100) c")
check_eq "(e) the replayed delivery is in the next claim of 100" "1/100" "$replayed"

finish
