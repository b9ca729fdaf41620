#!/usr/bin/env bash
# ALTER EXTENSION relaybus UPDATE from a live 0.1.0 install with a claimed
# delivery: every row stays; relay_claim, relay_ack and relay_nack gain their
# lease column/arguments, relay_extend appears, relay_consumer may call them;
# the lease taken through the 0.1.0 relay_claim stays completable (id-only, in
# the session that took it).
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
check_eq "after: 0.2.0, 3 deliveries" "after|0.2.0|3" "$(grep '^after' <<<"$out")"
check_eq "the lease taken through 0.1.0's relay_claim is acked by id in its session" "ack|1" "$(grep '^ack' <<<"$out")"
check_eq "relay_claim now returns a lease" "claim|2|t" "$(grep '^claim' <<<"$out")"
check_eq "relay_consumer may call relay_extend, relay_ack, relay_nack, relay_claim; PUBLIC may not" \
    "grants|t|t|t|t|f" "$(grep '^grants' <<<"$out")"
check_eq "one function of each name (the 0.1.0 signatures were replaced)" "old|3" "$(grep '^old' <<<"$out")"
finish
