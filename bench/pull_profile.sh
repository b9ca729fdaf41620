#!/usr/bin/env bash
# Where pull consumers spend their claims: N consumers of one unkeyed pull
# handler drain a preloaded backlog (psql loops: claim MAX, ack, COMMIT), while
# pg_stat_activity is sampled every 10 ms for the consumers' wait events. Runs
# against a server from the environment (PGHOST/PGPORT/PGUSER) with
# pg_stat_statements loaded; creates and drops database pull_profile.
#
#   bench/pull_profile.sh CONSUMERS MAX [DELIVERIES] [PERF_OUT]
#
# Prints deliveries/s, per delivery: scan rows (the claim's window statement),
# statements, WAL bytes, buffers and time of relay_claim and relay_ack, the
# scans' time per call (from the frontier and from the head); empty claims
# while a backlog remained; and the wait events sampled (share of samples of a
# consumer backend that were waiting, by event). With PERF_OUT, `perf record
# -e cpu-clock -g` of the consumer backends goes there (perf report -i PERF_OUT).
# Used for docs/performance.md ("Pull: profile and fixes").
set -euo pipefail
(($# >= 2 && $# <= 4)) || { echo "usage: $0 CONSUMERS MAX [DELIVERIES] [PERF_OUT]" >&2; exit 2; }
consumers=$1 max=$2 total=${3:-200000} perf_out=${4:-}
db=pull_profile
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" "$@"; }

psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
q -c "CREATE EXTENSION relaybus" -c "CREATE EXTENSION pg_stat_statements" \
  -c "SELECT relay_create_handler('h', 'pull', '', '{}')" -c "SELECT relay_route('e.#', 'h')" \
  -c "CREATE TABLE claims (consumer int, claims int, empty_with_backlog int)" \
  -c "CREATE UNLOGGED TABLE waits (at timestamptz, pid int, state text, wait text)" >/dev/null
for ((from = 1; from <= total; from += 10000)); do
    q -c "SELECT count(*) FROM unnest(relay_publish_batch('e.x', (SELECT array_agg(jsonb_build_object('i', g,
            'pad', repeat('x', 80))) FROM generate_series($from, least($total, $from + 9999)) g)))" >/dev/null
done
q -c "VACUUM ANALYZE relay.deliveries" -c "CHECKPOINT" >/dev/null
q -c "SET pg_stat_statements.track = 'all'" -c "SELECT pg_stat_statements_reset()" \
  -c "SELECT pg_stat_reset_shared('wal')" >/dev/null

hid=$(q -c "SELECT id FROM relay.handlers WHERE name = 'h'")
pids=()
for ((i = 1; i <= consumers; i++)); do
    q -c "SET pg_stat_statements.track = 'all'" -c "DO \$\$
DECLARE ids bigint[]; leases uuid[]; n int := 0; e int := 0;
BEGIN
  LOOP
    SELECT array_agg(c.id), array_agg(c.lease) INTO ids, leases FROM relay_claim('h', $max) c;
    n := n + 1;
    IF ids IS NULL THEN
      EXIT WHEN NOT EXISTS (SELECT 1 FROM relay.deliveries WHERE handler_id = $hid);
      IF EXISTS (SELECT 1 FROM relay.deliveries WHERE handler_id = $hid OFFSET 1000) THEN e := e + 1; END IF;
      COMMIT;
      PERFORM pg_sleep(0.002);
      CONTINUE;
    END IF;
    PERFORM relay_ack(ids, leases);
    COMMIT;
  END LOOP;
  INSERT INTO claims VALUES ($i, n, e);
END \$\$" &
    pids+=($!)
done
t0=$(date +%s%N)
# Sample the consumers' wait events until they are done.
q -c "DO \$\$ BEGIN
  FOR i IN 1..100000 LOOP
    INSERT INTO waits SELECT clock_timestamp(), pid, state, coalesce(wait_event_type || ':' || wait_event, 'CPU')
      FROM pg_stat_activity WHERE datname = '$db' AND query LIKE '%relay_claim(''h''%' AND pid <> pg_backend_pid();
    EXIT WHEN NOT FOUND;
    COMMIT;
    PERFORM pg_sleep(0.01);
  END LOOP; END \$\$" &
sampler=$!
if [[ -n "$perf_out" ]]; then
    sleep 0.3
    bpids=$(q -c "SELECT string_agg(pid::text, ',') FROM pg_stat_activity
                   WHERE datname = '$db' AND query LIKE '%relay_claim(''h''%' AND pid <> pg_backend_pid()")
    [[ -n "$bpids" ]] && perf record -q -e cpu-clock -g -o "$perf_out" -p "$bpids" -- sleep 2 >/dev/null 2>&1 || true
fi
for p in "${pids[@]}"; do wait "$p"; done
t1=$(date +%s%N)
wait "$sampler" || true
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
q -c "WITH s AS (SELECT query, calls, rows, shared_blks_hit + shared_blks_read AS blks, toplevel, total_exec_time AS ms
                   FROM pg_stat_statements
                   WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())),
      d AS (SELECT sum(rows) AS n FROM s WHERE query LIKE 'DELETE FROM relay.deliveries WHERE id = ANY%')
  SELECT 'consumers=$consumers max=$max deliveries=' || d.n || ' seconds=$secs rate=' || round(d.n / $secs),
         'scan_rows/delivery=' || round((SELECT sum(rows) FROM s WHERE query LIKE 'SELECT id, priority, key, not_before FROM (%') / d.n, 2),
         'scans(frontier/head)=' || (SELECT coalesce(sum(calls) FILTER (WHERE query LIKE '%id >= \$3%'), 0) || '/' ||
                                            coalesce(sum(calls) FILTER (WHERE query NOT LIKE '%id >= \$3%'), 0)
                                       FROM s WHERE query LIKE 'SELECT id, priority, key, not_before FROM (%'),
         'scan_ms_per_call(frontier/head)=' ||
             (SELECT coalesce(round((sum(ms) FILTER (WHERE query LIKE '%id >= \$3%') /
                                     nullif(sum(calls) FILTER (WHERE query LIKE '%id >= \$3%'), 0))::numeric, 3), 0) || '/' ||
                     coalesce(round((sum(ms) FILTER (WHERE query NOT LIKE '%id >= \$3%') /
                                     nullif(sum(calls) FILTER (WHERE query NOT LIKE '%id >= \$3%'), 0))::numeric, 3), 0)
                FROM s WHERE query LIKE 'SELECT id, priority, key, not_before FROM (%'),
         'claim_us/delivery=' || round(((SELECT sum(ms) FROM s WHERE query LIKE 'SELECT array_agg(c.id)%') * 1000 / d.n)::numeric, 2),
         'ack_us/delivery=' || round(((SELECT sum(ms) FROM s WHERE query LIKE 'SELECT relay_ack%') * 1000 / d.n)::numeric, 2),
         'claims=' || (SELECT sum(claims) FROM claims) || ' empty_with_backlog=' || (SELECT sum(empty_with_backlog) FROM claims),
         'stmts/delivery=' || round((SELECT sum(calls) FROM s WHERE (query LIKE '%relay_claim%' OR query LIKE '%relay_ack%'
                                        OR query LIKE '%relay.deliveries%') AND query NOT LIKE '%SELECT 1 FROM relay.deliveries%'
                                        AND query NOT LIKE 'DO %') / d.n, 4),
         'claim_blks/delivery=' || round((SELECT sum(blks) FROM s WHERE query LIKE 'SELECT array_agg(c.id)%') / d.n, 2),
         'ack_blks/delivery=' || round((SELECT sum(blks) FROM s WHERE query LIKE 'SELECT relay_ack%') / d.n, 2),
         'wal_bytes/delivery=' || round((SELECT wal_bytes FROM pg_stat_wal) / d.n)
    FROM d" | tr '|' '\n'
echo "wait events (share of consumer samples):"
q -c "SELECT '  ' || wait || ' ' || round(100.0 * count(*) / sum(count(*)) OVER (), 1) || ' %'
        FROM waits WHERE state = 'active' GROUP BY wait ORDER BY count(*) DESC"
psql -X -q -d postgres -c "DROP DATABASE $db" >/dev/null
