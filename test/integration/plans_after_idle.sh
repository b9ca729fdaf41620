#!/usr/bin/env bash
# The claim and completion statements keep index plans whatever the table's
# statistics said when they were planned (issue 14, item 1).
#
# A quiet system plans them on a tiny or empty relay.deliveries: the 0.1.0
# plans were then a sequential scan plus sort per priority class (and
# sequential DELETEs), kept until the next ANALYZE, so a burst after idle read
# the whole backlog on every claim. Autovacuum is off for the table here, so
# nothing re-plans behind the test's back.
#
# (a) A pull consumer's session: its statements are planned on a tiny table,
#     re-planned after an ANALYZE of that tiny table, after a VACUUM of the
#     empty table and after a VACUUM that kept the pages of dead rows (0 rows
#     in N pages); then 20,000 deliveries arrive without ANALYZE, and
#     auto_explain (notices to this session) shows the plans each statement
#     runs: relay_claim's scan, key heads and fetch, relay_ack's DELETE and
#     existence check, relay_nack's judgement, retry and dead letter (settle),
#     relay_extend.
# (b) A dispatcher (notify, fire mode) idles on the vacuumed empty table, then
#     drains a 20,000-row burst: pg_stat_statements shows its claim scan reads
#     fewer blocks per call than the table has pages (a sequential scan per
#     class reads them all four times).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new_db db plans || die "could not create a database"
sql "$db" "ALTER TABLE relay.deliveries SET (autovacuum_enabled = false)" \
    "SELECT relay_create_handler('p', 'pull', '', '{}')" "SELECT relay_route('p.#', 'p')" \
    "SELECT relay_create_handler('d', 'pull', '', '{\"max_attempts\": 1}')" "SELECT relay_route('d.#', 'd')" \
    >/dev/null || die "could not create the handlers"

# One consumer round in its own transaction: claim, extend and nack the first
# row (retry at once), ack the rest, claim and ack the retried row, dead-letter
# a row of d, and ack a delivery that does not exist.
cat >"$TMP/round.sql" <<'EOF'
DO $$
DECLARE ids bigint[]; leases uuid[]; n int;
BEGIN
  SELECT array_agg(c.id), array_agg(c.lease) INTO ids, leases FROM relay_claim('p', 100, NULL, 1) c;
  n := coalesce(array_length(ids, 1), 0);
  IF n > 0 THEN
    PERFORM relay_extend(ids[1], leases[1]);
    PERFORM relay_nack(ids[1], 'again', '0 seconds', leases[1]);
  END IF;
  IF n > 1 THEN PERFORM relay_ack(ids[2:n], leases[2:n]); END IF;
  SELECT array_agg(c.id), array_agg(c.lease) INTO ids, leases FROM relay_claim('d', 10) c;
  IF ids IS NOT NULL THEN PERFORM relay_nack(ids[1], 'poison', NULL, leases[1]); END IF;
  BEGIN
    PERFORM relay_ack(ARRAY[-1]::bigint[]);
  EXCEPTION WHEN no_data_found THEN NULL;
  END;
END $$;
DO $$
DECLARE ids bigint[]; leases uuid[];
BEGIN
  SELECT array_agg(c.id), array_agg(c.lease) INTO ids, leases FROM relay_claim('p', 100, NULL, 1) c;
  IF ids IS NOT NULL THEN PERFORM relay_ack(ids, leases); END IF;
END $$;
EOF
tiny="SELECT relay_publish('p.x', '{}', 'k1'), relay_publish('p.x', '{}', 'k1'),
             relay_publish('p.x', '{}'), relay_publish('d.x', '{}');"
burst="SELECT count(*) FROM (SELECT relay_publish_batch('p.x',
           array_agg(jsonb_build_object('i', g, 'pad', repeat('x', 200))),
           array_agg(CASE WHEN g % 4 = 0 THEN NULL ELSE 'hot-' || (g % 20) END))
         FROM generate_series(1, 10000) g) s;"
{
    echo "\\set QUIET on"
    # Quiet system: rounds on a tiny table (generic plans are made after 5
    # executions), an ANALYZE of it, more rounds, then a VACUUM of the empty
    # table and claims that find nothing (the scan is planned again on it).
    for i in 1 2 3 4 5 6 7; do echo "$tiny"; cat "$TMP/round.sql"; done
    echo "ANALYZE relay.deliveries;"
    for i in 1 2 3 4 5 6 7; do echo "$tiny"; cat "$TMP/round.sql"; done
    echo "VACUUM relay.deliveries;"
    for i in 1 2 3 4 5 6 7; do echo "SELECT count(*) FROM relay_claim('p', 100);"; done
    # A VACUUM that finds only dead rows and keeps the pages (an autovacuum
    # that cannot take the lock to truncate while dispatchers work): pg_class
    # says 0 rows in N pages, which the planner reads as an empty table
    # whatever the file grows to.
    for i in 1 2 3 4 5 6 7; do echo "$tiny"; cat "$TMP/round.sql"; done
    echo "SELECT count(*) FROM (SELECT relay_publish_batch('p.x', array_agg(jsonb_build_object('pad', repeat('x', 200)))) FROM generate_series(1, 300) g) s;"
    echo "DELETE FROM relay.deliveries; SELECT relay._recount_pending();"
    echo "VACUUM (TRUNCATE false) relay.deliveries;"
    echo "SELECT 'dead_pages=' || (relpages > 1 AND reltuples = 0) FROM pg_class WHERE oid = 'relay.deliveries'::regclass;"
    for i in 1 2 3 4 5 6 7; do echo "SELECT count(*) FROM relay_claim('p', 100);"; done
    # The burst, never analyzed.
    echo "$burst"
    echo "$burst"
    echo "SELECT relay_publish_batch('d.x', array_agg('{}'::jsonb)) FROM generate_series(1, 5);"
    echo "SELECT 'backlog=' || (count(*) >= 20000) FROM relay.deliveries;"
    echo "SELECT 'reltuples=' || (reltuples < 100) FROM pg_class WHERE oid = 'relay.deliveries'::regclass;"
    echo "LOAD 'auto_explain';"
    echo "SET auto_explain.log_min_duration = 0;"
    echo "SET auto_explain.log_nested_statements = on;"
    echo "SET auto_explain.log_level = notice;"
    echo "SET client_min_messages = notice;"
    cat "$TMP/round.sql"
    echo "SELECT count(*) FROM relay_claim('p', 100);"
} >"$TMP/session.sql"

log "(a) pull session: tiny, analyzed, vacuumed, then a 20,000-row burst"
psql -X -At -v ON_ERROR_STOP=1 -d "$db" -f "$TMP/session.sql" >"$TMP/session.out" 2>"$TMP/session.err"
check_eq "(a) the session ran" 0 "$?"
check "(a) over 20,000 deliveries pending at the burst" grep -qx "backlog=true" "$TMP/session.out"
check "(a) pg_class still says under 100 rows (no statistics of the burst)" \
    grep -qx "reltuples=true" "$TMP/session.out"
check "(a) pg_class said 0 rows in more than one page before the burst" \
    grep -qx "dead_pages=true" "$TMP/session.out"

plans=$TMP/session.err
# Every statement of the claim and completion paths ran and was explained.
for stmt in "FROM relay.deliveries WHERE handler_id = \$1 AND priority" "WITH RECURSIVE k(key)" "WITH d AS MATERIALIZED" \
        "DELETE FROM relay.deliveries WHERE id = ANY" "SELECT id FROM relay.deliveries WHERE id = ANY" \
        "SELECT id, handler_id, attempt FROM relay.deliveries WHERE id = ANY" "UPDATE relay.deliveries d SET attempt" \
        "WITH u AS (SELECT * FROM unnest" "SELECT handler_id FROM relay.deliveries WHERE id"; do
    check "(a) explained: $stmt" grep -qF "$stmt" "$plans"
done
check "(a) no sequential scan of relay.deliveries" bash -c "! grep -E 'Seq Scan on deliveries' '$plans'"
check "(a) no bitmap scan of relay.deliveries" bash -c "! grep -E 'Bitmap (Heap|Index) Scan' '$plans'"
check "(a) no sort in any plan" bash -c "! grep -E '(^|[> ])Sort( |$)|Incremental Sort' '$plans'"
check "(a) the claim scan reads deliveries_claim" grep -q "Index Scan using deliveries_claim" "$plans"
check "(a) key heads read deliveries_key" grep -qE "Index (Only )?Scan using deliveries_key" "$plans"
check "(a) completions find rows by deliveries_pkey" grep -q "Index Scan using deliveries_pkey" "$plans"
# deliveries_claim holds id too, after handler_id and priority: a lookup by
# ids through it reads the whole index (2.7 s a statement at 600,000 rows).
check "(a) no lookup by ids reads deliveries_claim" \
    bash -c "! grep -A1 'Scan using deliveries_claim' '$plans' | grep -q 'Index Cond: (id = ANY'"

# ---------------------------------------------------------------- (b) a dispatcher
log "(b) dispatcher: idle on the vacuumed empty table, then a burst"
sql "$db" "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null ||
    die "pg_stat_statements is not available"
sql "$db" "DELETE FROM relay.deliveries" "SELECT relay._recount_pending()" >/dev/null
notify_handler "$db" n it_plans '{"ack": false}' 'n.#' || die "could not create the notify handler"
check "(b) a dispatcher serves the database" wait_workers "$db" 1 20
start_client main "$db" it_plans || die "the LISTEN client did not start"
for i in 1 2 3 4 5 6 7; do sql "$db" "SELECT relay_publish('n.x', '{}', 'k')" >/dev/null; done
check "(b) the idle-time deliveries arrive" wait_lines "$TMP/main.out" 7 20
drained() { [[ $(sql "$db" "SELECT count(*) FROM relay.deliveries") == 0 ]]; }
check "(b) the table is empty" wait_until 20 drained
sql "$db" "VACUUM relay.deliveries" "SELECT pg_stat_statements_reset()" >/dev/null
# The dispatcher's claim scan, with a lane list or without one (a dispatcher
# holding all 64 lanes claims without it).
scan_calls() {
    sql "$db" "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
               WHERE query LIKE '%FROM relay.deliveries WHERE handler_id = \$1 AND priority >= 3 AND priority <= 3%'"
}
# One more event on the vacuumed table, delivered before the burst. (An idle
# dispatcher need not run the class scan at all, and a lone delivery may be
# claimed another way: the plans of part (a) are what is re-planned here.)
sql "$db" "SELECT relay_publish('n.x', '{}')" >/dev/null
check "(b) a delivery on the vacuumed table arrives" wait_lines "$TMP/main.out" 8 20
check "(b) the table is empty again" wait_until 20 drained
log "(b) class scans on the vacuumed table before the burst: $(scan_calls)"
sql "$db" "SELECT pg_stat_statements_reset()" >/dev/null
for i in 1 2; do
    sql "$db" "SELECT count(*) FROM (SELECT relay_publish_batch('n.x',
                 array_agg(jsonb_build_object('i', g, 'pad', repeat('x', 200))),
                 array_agg(CASE WHEN g % 4 = 0 THEN NULL ELSE 'hot-' || (g % 20) END))
               FROM generate_series(1, 10000) g) s" >/dev/null
done
check "(b) the burst is delivered" wait_until 120 drained
check "(b) the client got every notification" wait_lines "$TMP/main.out" 20008 20
pages=$(sql "$db" "SELECT pg_relation_size('relay.deliveries') / 8192")
read -r calls blocks < <(sql "$db" "SELECT sum(calls), sum(shared_blks_hit + shared_blks_read)
        FROM pg_stat_statements
        WHERE query LIKE '%FROM relay.deliveries WHERE handler_id = \$1 AND priority >= 3 AND priority <= 3%'" | tr '|' ' ')
log "(b) table pages $pages, claim scans $calls, blocks read by them $blocks"
check "(b) the dispatcher's claim scan ran" test "${calls:-0}" -gt 0
check "(b) a claim scan reads fewer blocks than half of one pass per class ($blocks / $calls vs 2 x $pages)" \
    test $((${blocks:-0} / ${calls:-1})) -lt $((2 * pages))

finish
