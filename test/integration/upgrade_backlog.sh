#!/usr/bin/env bash
# ALTER EXTENSION relaybus UPDATE from 0.1.0 with a backlog, while the workers
# run: a notify handler's 10000 pending deliveries (50 keys) and 5 delayed ones, a
# pull handler's pending deliveries and dead letters. The update runs while the
# dispatcher is sending the backlog; afterwards everything is delivered, once,
# in key order: the notify backlog by the dispatcher, the pull backlog and the
# replayed dead letters through relay_claim/relay_ack with leases.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHANNEL=it_up_backlog
name="it_upbacklog_$$_${RANDOM}"
psql_q -d postgres -c "CREATE DATABASE \"$name\"" >/dev/null || die "could not create a database"
DBS+=("$name")
db=$name
sql "$db" "CREATE EXTENSION relaybus VERSION '0.1.0'" \
    "SELECT relay_create_handler('up_notify', 'notify', '$CHANNEL', '{\"ack\": false}')" \
    "SELECT relay_route('upn.#', 'up_notify')" \
    "SELECT relay_create_handler('up_pull', 'pull', NULL, '{\"max_attempts\": 1}')" \
    "SELECT relay_route('upp.#', 'up_pull')" >/dev/null || die "could not set up 0.1.0"
create_pub_log "$db"

log "the backlog, published on 0.1.0 with the dispatchers stopped"
set_conf relaybus.enabled off || die "set_conf"
no_dispatcher() { [[ -z $(dispatcher_pids "$db") ]]; }
wait_until 20 no_dispatcher || die "the dispatchers did not stop"
sql "$db" \
    "INSERT INTO pub_log SELECT relay_publish('upn.x', jsonb_build_object('n', g), 'k' || (g % 50)), 'k' || (g % 50)
       FROM generate_series(1, 10000) g" \
    "INSERT INTO pub_log SELECT relay_publish('upn.later', jsonb_build_object('n', g), 'late' || g,
       not_before => now() + interval '3 seconds'), 'late' || g FROM generate_series(1, 5) g" \
    "SELECT relay_publish('upp.x', jsonb_build_object('n', g), 'p' || g) FROM generate_series(1, 4) g" \
    "SELECT relay_nack(id, 'fails') FROM relay_claim('up_pull', 2)" >/dev/null || die "could not publish"
check_eq "0.1.0 holds 10005 notify and 2 pull deliveries pending, 2 dead letters" "0.1.0|10005|2|2" \
    "$(sql "$db" "SELECT extversion,
        (SELECT count(*) FROM relay.deliveries WHERE topic LIKE 'upn.%'),
        (SELECT count(*) FROM relay.deliveries WHERE topic LIKE 'upp.%'),
        (SELECT count(*) FROM relay.dead_letters) FROM pg_extension WHERE extname = 'relaybus'")"

# The dispatcher drains 10000 notify deliveries in well under a second, so the
# update would race it. A second session row-locks the newest delivery of
# the backlog: the dispatcher sends up to it, then waits in that batch's DELETE
# with the rest still pending. The update's session counts the pending rows,
# ends the locker, and updates while the dispatcher goes on sending.
LOCKER=upgrade_backlog_locker
PGAPPNAME=$LOCKER psql_q -d "$db" -c "BEGIN" \
    -c "SELECT id FROM relay.deliveries WHERE topic = 'upn.x' ORDER BY id DESC LIMIT 1 FOR UPDATE" \
    -c "SELECT pg_sleep(300)" -c "COMMIT" >/dev/null 2>&1 &
bg_track $!
locking() { [[ $(sql "$db" "SELECT count(*) FROM pg_stat_activity
                             WHERE application_name = '$LOCKER' AND query LIKE '%pg_sleep%'") == 1 ]]; }
wait_until 20 locking || die "the locking session did not start"

start_client main "$db" "$CHANNEL" || die "the LISTEN client did not start"
reset_conf relaybus.enabled
check "a dispatcher serves the database" wait_workers "$db" 1 20
delivering() { has_lines "$TMP/main.out" 1; }
check "the dispatcher started sending the backlog" wait_until 20 delivering
log "ALTER EXTENSION relaybus UPDATE while it sends ($(line_count "$TMP/main.out") received so far)"
out=$(psql_q -d "$db" -c "BEGIN" -c "SELECT count(*) FROM relay.deliveries WHERE topic = 'upn.x'" \
    -c "SELECT count(pg_terminate_backend(pid)) * 0 FROM pg_stat_activity WHERE application_name = '$LOCKER'" \
    -c "ALTER EXTENSION relaybus UPDATE" -c "COMMIT" 2>&1)
rc=$?
log "the update's session said: ${out//$'\n'/ | }"
out=${out%%$'\n'*}
check_eq "ALTER EXTENSION relaybus UPDATE ran" 0 "$rc"
log "notify deliveries pending when the update started: $out"
check "the update ran while ready notify deliveries were pending" test "${out:-0}" -gt 0
check_eq "the database is at $RELAYBUS_VERSION" "$RELAYBUS_VERSION" "$(sql "$db" "SELECT extversion FROM pg_extension WHERE extname = 'relaybus'")"

check "the 10005 notify deliveries arrive (the delayed ones once due)" wait_lines "$TMP/main.out" 10005 60
dump_pub_log "$db" "$TMP/published"
analyze --published "$TMP/published" "$TMP/main.out" || die "could not analyze"
check_eq "each exactly once, in key order, no seq gap" "10005|0|0|0|0" \
    "${R[distinct]}|${R[missing]}|${R[dups]}|${R[order_violations]}|${R[seq_gap_keys]}"
drained() { [[ $(sql "$db" "SELECT count(*) FROM relay.deliveries WHERE topic LIKE 'upn.%'") == 0 ]]; }
check "no notify delivery is left" wait_until 10 drained

log "the pull backlog and the dead letters, through the current API"
check_eq "the dead letters replay" 2 "$(sql "$db" "SELECT relay_replay('up_pull')")"
check_eq "4 deliveries are claimed with leases and acked by lease" "4|4" \
    "$(sql "$db" "WITH c AS (SELECT * FROM relay_claim('up_pull', 10, per_key => 10))
                  SELECT count(*), relay_ack(array_agg(id), array_agg(lease)) FROM c")"
check_eq "nothing is left, nothing dead" "0|0" \
    "$(sql "$db" "SELECT (SELECT count(*) FROM relay.deliveries), (SELECT count(*) FROM relay.dead_letters)")"
finish
