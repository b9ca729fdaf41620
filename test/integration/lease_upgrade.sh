#!/usr/bin/env bash
# ALTER EXTENSION relaybus UPDATE from a live 0.1.0 install with a claimed
# delivery: every row stays; relay_claim, relay_ack and relay_nack gain their
# lease column/arguments, relay_extend appears, relay_consumer may call them;
# the lease taken through the 0.1.0 relay_claim stays completable (id-only, in
# the session that took it).
# A database at 0.2.0 (installed through the chain) keeps working with this
# library: its stats views read the counters they knew; the update to the
# current version adds the send-time columns, which relay_monitor reads.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

name="it_upgrade_$$_${RANDOM}"
psql_q -d postgres -c "CREATE DATABASE \"$name\"" >/dev/null || die "could not create a database"
DBS+=("$name")
db=$name
out=$(psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" <<'SQL' 2>&1
CREATE EXTENSION relaybus VERSION '0.1.0';
SELECT relay_create_handler('up_pull', 'pull');
SELECT relay_route('up.#', 'up_pull');
SELECT count(*) FROM (SELECT relay_publish('up.a', jsonb_build_object('n', g), 'k' || g) FROM generate_series(1, 3) g) p;
SELECT (payload->>'n') FROM relay_claim('up_pull', 1);
SELECT 'before', extversion, (SELECT count(*) FROM relay.deliveries) FROM pg_extension WHERE extname = 'relaybus';
ALTER EXTENSION relaybus UPDATE;
SELECT 'after', extversion, (SELECT count(*) FROM relay.deliveries) FROM pg_extension WHERE extname = 'relaybus';
SELECT 'ack', relay_ack(array(SELECT id FROM relay.deliveries WHERE payload->>'n' = '1'));
SELECT 'claim', count(*), bool_and(lease IS NOT NULL) FROM relay_claim('up_pull', 10);
SELECT 'grants', has_function_privilege('relay_consumer', 'relay_extend(bigint, uuid, interval)', 'EXECUTE'),
       has_function_privilege('relay_consumer', 'relay_ack(bigint[], uuid[])', 'EXECUTE'),
       has_function_privilege('relay_consumer', 'relay_nack(bigint, text, interval, uuid)', 'EXECUTE'),
       has_function_privilege('relay_consumer', 'relay_claim(text, integer, interval, integer)', 'EXECUTE'),
       has_function_privilege('public', 'relay_extend(bigint, uuid, interval)', 'EXECUTE');
SELECT 'old', count(*) FROM pg_proc WHERE proname IN ('relay_ack', 'relay_nack', 'relay_claim');
SQL
)
rc=$?
log "$(tr '\n' ' ' <<<"$out")"
check_eq "the script ran" 0 "$rc"
check_eq "before the update: 0.1.0, 3 deliveries" "before|0.1.0|3" "$(grep '^before' <<<"$out")"
check_eq "after: $RELAYBUS_VERSION, 3 deliveries" "after|$RELAYBUS_VERSION|3" "$(grep '^after' <<<"$out")"
check_eq "the lease taken through 0.1.0's relay_claim is acked by id in its session" "ack|1" "$(grep '^ack' <<<"$out")"
check_eq "relay_claim now returns a lease" "claim|2|t" "$(grep '^claim' <<<"$out")"
check_eq "relay_consumer may call relay_extend, relay_ack, relay_nack, relay_claim; PUBLIC may not" \
    "grants|t|t|t|t|f" "$(grep '^grants' <<<"$out")"
check_eq "one function of each name (the 0.1.0 signatures were replaced)" "old|3" "$(grep '^old' <<<"$out")"

name2="it_upgrade2_$$_${RANDOM}"
psql_q -d postgres -c "CREATE DATABASE \"$name2\"" >/dev/null || die "could not create a database"
DBS+=("$name2")
out=$(psql -X -q -At -v ON_ERROR_STOP=1 -d "$name2" <<'SQL' 2>&1
CREATE EXTENSION relaybus VERSION '0.2.0';
SELECT relay_create_handler('up2', 'pull');
SELECT 'stats020', count(*), bool_and(delivered = 0) FROM relay.handler_stats;
SELECT 'cols020', count(*) FROM information_schema.columns
 WHERE table_schema = 'relay' AND table_name IN ('handler_stats', 'handler_metrics')
   AND column_name IN ('send_p50_ms', 'send_p99_ms', 'sends', 'send_sum_seconds', 'delivered_after_gap');
ALTER EXTENSION relaybus UPDATE;
SELECT 'version', extversion FROM pg_extension WHERE extname = 'relaybus';
SET ROLE relay_monitor;
SELECT 'stats', handler, send_p50_ms IS NULL, delivered_after_gap FROM relay.handler_stats;
SELECT 'metrics', handler, sends, send_sum_seconds, delivered_after_gap FROM relay.handler_metrics;
SELECT 'limits', s.held_back, s.limited, m.held_back, m.limited
  FROM relay.handler_stats s JOIN relay.handler_metrics m USING (handler);
SQL
)
rc=$?
log "$(tr '\n' ' ' <<<"$out")"
check_eq "0.2.0 through the chain, then updated" 0 "$rc"
check_eq "at 0.2.0 relay.handler_stats reads with this library" "stats020|1|t" "$(grep '^stats020' <<<"$out")"
check_eq "0.2.0 has no send columns" "cols020|0" "$(grep '^cols020' <<<"$out")"
check_eq "updated to $RELAYBUS_VERSION" "version|$RELAYBUS_VERSION" "$(grep '^version' <<<"$out")"
check_eq "relay_monitor reads the send columns of relay.handler_stats" "stats|up2|t|0" "$(grep '^stats|' <<<"$out")"
check_eq "... and of relay.handler_metrics" "metrics|up2|0|0|0" "$(grep '^metrics' <<<"$out")"
check_eq "... and the shared limits' columns of both" "limits|0|f|0|f" "$(grep '^limits' <<<"$out")"
finish
