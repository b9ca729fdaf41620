#!/usr/bin/env bash
# Monitoring (docs/operations.md "Monitoring"):
#  (1) relay.handler_metrics counts published deliveries at commit (not those
#      rolled back, nor those of a rolled-back savepoint), delivered ones, and
#      relay.handler_latency_buckets is a cumulative histogram ending in +Inf;
#  (2) the server log says when a handler's deliveries start failing, its
#      circuit breaker opens and closes, and a delivery is dead-lettered, at
#      most once per handler and kind of event per minute;
#  (3) prometheus-postgres-exporter with docs/postgres_exporter.yml, connected
#      as a relay_monitor login role to two databases, serves /metrics that
#      promtool accepts, with the database label on every relaybus series.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/prometheus_lib.sh"

[[ -n "$SERVER_LOG" && -f "$SERVER_LOG" ]] || die "RELAYBUS_CLUSTER_DIR is not set: this test reads the server log"
new_db db mon || die "could not create a database"
new_db db2 mon2 || die "could not create a second database"
scraper="it_scraper_$$"
psql_q -d postgres -c "CREATE ROLE $scraper LOGIN IN ROLE relay_monitor" >/dev/null || die "role"
drop_scraper() { psql_q -d postgres -c "DROP ROLE IF EXISTS $scraper" >/dev/null 2>&1; }

metric() { sql "$db" "SELECT $2 FROM relay.handler_metrics WHERE handler = '$1'"; }

# ---------------------------------------------------------------- (1) counters and buckets
log "(1) published at commit, delivered, latency buckets"
sql "$db" "SELECT relay_create_handler('m_pull', 'pull')" "SELECT relay_route('m.pull.#', 'm_pull')" >/dev/null
notify_handler "$db" m_fire it_m_fire '{}' 'm.fire.#' || die "handler m_fire"
check "a dispatcher serves the database" wait_workers "$db" 1 20
sql "$db" "SELECT relay_publish('m.pull.a', '{}') FROM generate_series(1, 3)" >/dev/null
sql "$db" "BEGIN" "SELECT relay_publish('m.pull.a', '{}') FROM generate_series(1, 2)" "ROLLBACK" >/dev/null
sql "$db" "BEGIN" "SELECT relay_publish('m.pull.a', '{}')" "SAVEPOINT s" \
    "SELECT relay_publish_batch('m.pull.a', ARRAY['{}', '{}']::jsonb[])" "ROLLBACK TO SAVEPOINT s" \
    "SAVEPOINT t" "SELECT relay_publish('m.pull.a', '{}')" "RELEASE SAVEPOINT t" "COMMIT" >/dev/null
check_eq "published: 3 + 0 (rolled back) + 2 (one savepoint rolled back, one released)" 5 "$(metric m_pull published)"
check_eq "relay.handler_stats agrees on pending" 5 "$(handler_stat "$db" m_pull pending)"
check_eq "the oldest pending delivery has an age" t "$(metric m_pull 'oldest_pending_seconds > 0')"
sql "$db" "SELECT relay_publish('m.fire.a', jsonb_build_object('n', g)) FROM generate_series(1, 7) g" >/dev/null
metric_is() { [[ "$(metric "$1" "$2")" == "$3" ]]; }
check "the 7 notify deliveries are counted delivered" wait_until 10 metric_is m_fire delivered 7
check_eq "... and published" 7 "$(metric m_fire published)"
check_eq "... with their latency sum" t "$(metric m_fire 'latency_sum_seconds > 0')"
check_eq "buckets: cumulative, le ascending, +Inf last with every delivery" "t|t|7" \
    "$(sql "$db" "SELECT bool_and(count >= coalesce(prev, 0)), bool_and(le > coalesce(prev_le, 0)),
                         max(count) FILTER (WHERE le = 'Infinity')
                    FROM (SELECT le, count, lag(count) OVER w AS prev, lag(le) OVER w AS prev_le
                            FROM relay.handler_latency_buckets WHERE handler = 'm_fire' WINDOW w AS (ORDER BY le)) x")"

log "(1b) pending from shared memory: kept by publish, ack, dead letter, replay and the dispatchers"
pending_is() { [[ "$(metric "$1" "coalesce(pending::text, 'null')")" == "$2" ]]; }
count_of() { sql "$db" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = '$1'"; }
check "a dispatcher counted the pending deliveries: m_pull 5" wait_until 10 pending_is m_pull 5
check_eq "... m_fire 0 (all delivered)" 0 "$(metric m_fire pending)"
sql "$db" "SELECT relay_alter_handler('m_pull', options => '{\"max_attempts\": 1}')" >/dev/null
read -r a1 l1 a2 l2 < <(sql "$db" "SELECT string_agg(id || ' ' || lease, ' ') FROM relay_claim('m_pull', 2)")
sql "$db" "SELECT relay_ack(ARRAY[$a1]::bigint[], ARRAY['$l1']::uuid[])" >/dev/null
check_eq "an ack: 4" 4 "$(metric m_pull pending)"
sql "$db" "BEGIN" "SELECT relay_ack(ARRAY[$a2]::bigint[], ARRAY['$l2']::uuid[])" "ROLLBACK" >/dev/null
check_eq "an ack rolled back: still 4" 4 "$(metric m_pull pending)"
sql "$db" "SELECT relay_nack($a2, 'boom', lease => '$l2')" >/dev/null
check_eq "a nack at max_attempts (dead letter): 3" 3 "$(metric m_pull pending)"
sql "$db" "SELECT relay_replay('m_pull')" >/dev/null
check_eq "relay_replay: 4, as counted by count(*)" "4 4" "$(metric m_pull pending) $(count_of m_pull)"
sql "$db" "SELECT relay_publish('m.fire.a', jsonb_build_object('n', g)) FROM generate_series(1, 20) g" >/dev/null
check "20 more notify deliveries: back to 0 when delivered" wait_until 10 pending_is m_fire 0
check_eq "... with 27 delivered" 27 "$(metric m_fire delivered)"
log "(1c) after a server restart the first dispatcher counts again"
bash "$RELAYBUS_ROOT/test/cluster.sh" restart "$RELAYBUS_CLUSTER_DIR" >"$TMP/restart.out" 2>&1 || die "restart failed"
check "after the restart: m_pull 4 again (counted once, not summed from 0)" wait_until 20 pending_is m_pull 4
check_eq "... and published restarted at 0" 0 "$(metric m_pull published)"
sql "$db" "SELECT relay_publish('m.pull.a', '{}')" >/dev/null
check_eq "... then kept: 5" 5 "$(metric m_pull pending)"
sql "$db" "SELECT relay._recount_pending()" >/dev/null
check_eq "relay._recount_pending() (admin) agrees" 5 "$(metric m_pull pending)"
sql "$db" "SELECT relay_publish('m.fire.a', jsonb_build_object('n', g)) FROM generate_series(1, 3) g" >/dev/null
check "3 notify deliveries after the restart are delivered" wait_until 10 metric_is m_fire delivered 3
check_eq "the views carry the database" "$db|$db" \
    "$(sql "$db" "SELECT (SELECT DISTINCT database FROM relay.handler_metrics), (SELECT DISTINCT database FROM relay.handler_latency_buckets)")"

# ---------------------------------------------------------------- (2) log lines
log "(2) log lines: failing, breaker, dead letter; rate limited"
start_receiver r || die "receiver"
allow_loopback || die "allowlist"
URL="http://127.0.0.1:$RECV_PORT"
log_from=$(stat -c %s "$SERVER_LOG")
new_lines() { tail -c +$((log_from + 1)) "$SERVER_LOG" | grep -F "relaybus: handler \"m_hook\" in database \"$db\": $1"; }
count_lines() { new_lines "$1" | wc -l; }
has_line() { new_lines "$1" >/dev/null; }
recv_plan "$RECV_PORT" /hook '[{"status": 503, "repeat": true}]' || die "plan"
http_handler "$db" m_hook "$URL/hook" \
    '{"max_attempts": 2, "backoff_base": "50ms", "backoff_max": "300ms", "concurrency": 1}' 'm.hook.#' ||
    die "handler m_hook"
sql "$db" "SELECT relay_publish('m.hook.a', jsonb_build_object('n', g)) FROM generate_series(1, 6) g" >/dev/null
check "'started failing' is logged" wait_until 20 has_line "deliveries started failing"
check "'dead-lettered' is logged" wait_until 20 has_line "a delivery was dead-lettered"
check "'circuit breaker opened' is logged (5 failures in a row)" wait_until 20 has_line "circuit breaker opened until"
check_eq "the breaker line has the status" 1 "$(new_lines "circuit breaker opened until" | grep -c '(HTTP 503)')"
recv_plan "$RECV_PORT" /hook '[{"status": 200, "repeat": true}]' || die "plan"
sql "$db" "SELECT relay_publish('m.hook.a', '{\"n\": 100}')" >/dev/null
check "'circuit breaker closed' is logged once a probe succeeds" wait_until 20 has_line "circuit breaker closed"
check "everything left is delivered" wait_until 20 none_pending "$db" m_hook
dead=$(dead_of "$db" m_hook)
# How many of the six die before the breaker opens depends on the order of
# their attempts (one, on a loaded machine): at least one, and with the next
# failure at least two for the one line within a minute.
check "a delivery was dead-lettered ($dead)" test "$dead" -ge 1
recv_plan "$RECV_PORT" /hook '[{"status": 503, "repeat": true}]' || die "plan"
sql "$db" "SELECT relay_publish('m.hook.a', '{\"n\": 200}')" >/dev/null
check "the new failure is dead-lettered too" wait_until 20 dead_is "$db" m_hook $((dead + 1))
check_eq "within a minute: one line per kind (failing, $((dead + 1)) dead letters, breaker opened, closed)" "1 1 1 1" \
    "$(count_lines "deliveries started failing") $(count_lines "a delivery was dead-lettered") $(count_lines "circuit breaker opened") $(count_lines "circuit breaker closed")"
check_eq "the counters agree: dead_lettered" "$((dead + 1))" "$(metric m_hook dead_lettered)"

# ---------------------------------------------------------------- (3) the exporter
log "(3) prometheus-postgres-exporter with docs/postgres_exporter.yml, checked by promtool"
command -v promtool >/dev/null || die "no promtool (scripts/install-deps.sh: prometheus)"
sql "$db2" "SELECT relay_create_handler('m2_pull', 'pull')" "SELECT relay_route('x.#', 'm2_pull')" \
    "SELECT relay_publish('x.y', '{}')" >/dev/null
dsn() { echo "host=$PGHOST port=$PGPORT user=$scraper dbname=$1 sslmode=disable"; }
start_exporter "$(dsn "$db"),$(dsn "$db2")"
check_eq "the exporter serves /metrics" 0 "$?"
curl -sf -o "$TMP/metrics.txt" "http://127.0.0.1:$EXPORTER_PORT/metrics"
[[ -s "$TMP/metrics.txt" ]] || log "exporter log: $(tail -5 "$TMP/exporter.log")"
promtool check metrics <"$TMP/metrics.txt" >"$TMP/promtool.out" 2>&1
check_eq "promtool check metrics accepts it (exit 0)" "0" "$?"
[[ -s "$TMP/promtool.out" ]] && log "promtool: $(head -5 "$TMP/promtool.out")"
relay_series() { grep -E "^relay_handler" "$TMP/metrics.txt"; }
check_eq "no query error in the exporter's log" 0 "$(grep -ci 'level=error' "$TMP/exporter.log")"
check_eq "published_total (1 since the restart) and pending (5) of m_pull in the first database" "1 1" \
    "$(relay_series | grep -c "^relay_handler_published_total{database=\"$db\",handler=\"m_pull\",kind=\"pull\".*} 1$") $(relay_series | grep -c "^relay_handler_pending{database=\"$db\",handler=\"m_pull\",kind=\"pull\".*} 5$")"
check_eq "a series of the second database" 1 \
    "$(relay_series | grep -c "^relay_handler_published_total{database=\"$db2\",handler=\"m2_pull\",.*} 1$")"
check_eq "every relaybus series carries a database label" 0 "$(relay_series | grep -vc 'database="')"
check_eq "the latency is a histogram (TYPE histogram, +Inf bucket = count = 3 for m_fire)" "1 1 1" \
    "$(grep -c '^# TYPE relay_handler_latency_seconds histogram' "$TMP/metrics.txt") $(relay_series | grep -c "^relay_handler_latency_seconds_bucket{database=\"$db\",handler=\"m_fire\",.*le=\"+Inf\"} 3$") $(relay_series | grep -c "^relay_handler_latency_seconds_count{database=\"$db\",handler=\"m_fire\".*} 3$")"
check_eq "the scraper role reads nothing else: relay.deliveries is refused (42501)" 1 \
    "$(psql -X -At -v VERBOSITY=verbose -U "$scraper" -d "$db" -c 'SELECT count(*) FROM relay.deliveries' 2>&1 | grep -c 42501)"

drop_scraper
finish
