#!/usr/bin/env bash
# pg_dump -Fc of a database with relaybus, pg_restore into a fresh database
# (of the same cluster, in sections while the dispatchers run, and of a fresh
# cluster):
# handlers, routes, pending, delayed and dead deliveries and key counters come
# back, and everything continues. New handlers, events and deliveries get fresh
# ids (the identity sequence of relay.handlers is dumped too), key seqs
# continue, and the restored backlog is delivered: the pull backlog claimed, the
# notify backlog sent by the dispatchers. The dead letters of a dropped handler
# never reach a handler created after the restore.
# On 0.1.0 relay_create_handler after the restore failed with a duplicate key
# on handlers_pkey (the identity sequence was not dumped, so it started at 1).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new_db src backup || die "could not create a database"
sql "$src" \
    "SELECT relay_create_handler('br_pull', 'pull', NULL, '{\"max_attempts\": 1}')" \
    "SELECT relay_route('br.#', 'br_pull')" \
    "SELECT relay_create_handler('br_notify', 'notify', 'it_br_notify')" \
    "SELECT relay_route('brn.#', 'br_notify')" \
    "SELECT relay_create_handler('br_gone', 'pull', NULL, '{\"max_attempts\": 1}')" \
    "SELECT relay_route('gone.#', 'br_gone')" >/dev/null || die "could not create handlers"
# The dropped handler's dead letter stays, keyed to its id.
sql "$src" "SELECT relay_publish('gone.x', '{\"gone\": 1}')" \
    "SELECT relay_nack(id, 'fails') FROM relay_claim('br_gone', 10)" \
    "SELECT relay_drop_handler('br_gone')" >/dev/null || die "could not dead-letter br_gone's delivery"
# Dead: a delivery of key dk fails for good.
sql "$src" "SELECT relay_publish('br.dead', '{\"n\": 0}', 'dk')" \
    "SELECT relay_nack(id, 'fails') FROM relay_claim('br_pull', 10)" >/dev/null || die "dead letter"
# The notify backlog must reach the dump undelivered: the dispatchers are
# stopped (docs/operations.md, "Stopping delivery") while it is published and
# dumped, and started again once it is restored.
set_conf relaybus.enabled off || die "set_conf"
no_dispatcher() { [[ -z $(dispatcher_pids "$src") ]]; }
wait_until 20 no_dispatcher || die "the dispatchers did not stop"
sql "$src" \
    "SELECT relay_publish('br.a', jsonb_build_object('n', g), 'k1') FROM generate_series(1, 3) g" \
    "SELECT relay_publish('br.b', jsonb_build_object('n', g), dedupe_key => 'dd' || g) FROM generate_series(4, 5) g" \
    "SELECT relay_publish('br.later', '{\"n\": 6}', 'k2', not_before => now() + interval '4 seconds')" \
    "SELECT relay_publish('brn.x', jsonb_build_object('n', g), 'nk') FROM generate_series(7, 8) g" >/dev/null \
    || die "could not publish the backlog"

before=$(sql "$src" "SELECT (SELECT count(*) FROM relay.handlers), (SELECT count(*) FROM relay.routes),
    (SELECT count(*) FROM relay.deliveries), (SELECT count(*) FROM relay.deliveries WHERE not_before > published_at),
    (SELECT count(*) FROM relay.dead_letters), (SELECT string_agg(key || '=' || seq, ',' ORDER BY key) FROM relay.key_seqs)")
log "before the dump: $before"
check_eq "the source: 2 handlers, 2 routes, 8 pending (1 delayed), 2 dead, key counters" \
    "2|2|8|1|2|dk=1,k1=3,k2=1,nk=2" "$before"
max_ids=$(sql "$src" "SELECT max(id) FROM relay.deliveries" "SELECT max(event_id) FROM relay.deliveries")
read -r max_delivery max_event <<<"$(tr '\n' ' ' <<<"$max_ids")"

log "pg_dump -Fc, pg_restore into a fresh database"
check "pg_dump -Fc" pg_dump -Fc -f "$TMP/dump" -d "$src"
check "the dump holds the handler id sequence's value" \
    bash -c "pg_restore -l '$TMP/dump' | grep -q 'SEQUENCE SET relay handlers_id_seq'"
dst="${src}_restored"
psql_q -d postgres -c "CREATE DATABASE \"$dst\"" >/dev/null || die "could not create $dst"
DBS+=("$dst")
check "pg_restore --exit-on-error" pg_restore --exit-on-error -d "$dst" "$TMP/dump"

after=$(sql "$dst" "SELECT (SELECT count(*) FROM relay.handlers), (SELECT count(*) FROM relay.routes),
    (SELECT count(*) FROM relay.deliveries), (SELECT count(*) FROM relay.deliveries WHERE not_before > published_at),
    (SELECT count(*) FROM relay.dead_letters), (SELECT string_agg(key || '=' || seq, ',' ORDER BY key) FROM relay.key_seqs)")
check_eq "the restored database holds the same rows" "$before" "$after"

out=$(sql "$dst" "SELECT relay_create_handler('br_new', 'pull')" 2>&1)
check "relay_create_handler works after the restore" test "$?" -eq 0 -a -n "$out"
log "relay_create_handler: $out"
check_eq "the new handler's id is fresh (above every id a handler or a dead letter has used)" t \
    "$(sql "$dst" "SELECT (SELECT id FROM relay.handlers WHERE name = 'br_new')
                        > greatest((SELECT max(handler_id) FROM relay.dead_letters), 3)")"
sql "$dst" "SELECT relay_route('br.#', 'br_new')" >/dev/null
check_eq "replaying for the new handler hands it nothing of the dropped one" 0 \
    "$(sql "$dst" "SELECT relay_replay('br_new')")"
check_eq "the dropped handler's dead letter stays where it was" "br_gone|1" \
    "$(sql "$dst" "SELECT handler, count(*) FROM relay.dead_letters WHERE payload = '{\"gone\": 1}' GROUP BY 1")"

log "new events continue the ids and the key counters"
sql "$dst" "SELECT relay_publish('br.c', '{\"n\": 9}', 'k1')" >/dev/null
check_eq "a new event of key k1 gets seq 4; its event and delivery ids are fresh" "4|t|t" \
    "$(sql "$dst" "SELECT seq, event_id > $max_event, id > $max_delivery FROM relay.deliveries
                   WHERE handler_id = (SELECT id FROM relay.handlers WHERE name = 'br_pull') AND payload = '{\"n\": 9}'")"
check_eq "a dedupe key of the dump still names its event" "$(sql "$src" "SELECT event_id FROM relay.dedupe WHERE key = 'dd4'")" \
    "$(sql "$dst" "SELECT relay_publish('br.b', '{\"n\": 4}', dedupe_key => 'dd4')")"
check_eq "the dead letter of br_pull replays into br_pull" 1 "$(sql "$dst" "SELECT relay_replay('br_pull')")"

log "the restored backlog is delivered"
reset_conf relaybus.enabled
check "a dispatcher serves the restored database" wait_workers "$dst" 1 20
notify_drained() {
    [[ $(sql "$dst" "SELECT count(*) FROM relay.deliveries WHERE topic LIKE 'brn.%'
                     AND handler_id = (SELECT id FROM relay.handlers WHERE name = 'br_notify')") == 0 ]]
}
check "the notify backlog is sent by the dispatchers" wait_until 20 notify_drained
claimed() {
    sql "$dst" "SELECT relay_ack(array_agg(id)) FROM relay_claim('br_pull', 100)
                 HAVING count(*) > 0" >/dev/null
    [[ $(sql "$dst" "SELECT count(*) FROM relay.deliveries
                     WHERE handler_id = (SELECT id FROM relay.handlers WHERE name = 'br_pull')") == 0 ]]
}
check "the pull backlog (the delayed delivery once due, the replayed one) is claimed and acked" wait_until 20 claimed

# A restore while the dispatchers run: the extension (pre-data) is counted by
# its dispatcher before the rows arrive (data); the COPY makes it count again,
# so relay.handler_metrics.pending matches the restored rows.
log "pg_restore in sections while the dispatchers run"
new_db dst2 backup_restore2 || die "could not create a database"
sql "$dst2" "DROP EXTENSION relaybus" >/dev/null || die "could not empty $dst2"
check "pg_restore --section=pre-data" pg_restore --exit-on-error --section=pre-data -d "$dst2" "$TMP/dump"
counted() { [[ $(sql "$dst2" "SELECT relay._pending_counted()") == t ]]; }
check "the dispatcher counted the empty outbox" wait_until 20 counted
check "pg_restore --section=data" pg_restore --exit-on-error --section=data -d "$dst2" "$TMP/dump"
check "pg_restore --section=post-data" pg_restore --exit-on-error --section=post-data -d "$dst2" "$TMP/dump"
pull_pending_matches() {
    [[ $(sql "$dst2" "SELECT m.pending = (SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h
                                          ON h.id = d.handler_id WHERE h.name = 'br_pull')
                        FROM relay.handler_metrics m WHERE m.handler = 'br_pull'") == t ]]
}
check "relay.handler_metrics.pending counts the restored rows" wait_until 20 pull_pending_matches
log "br_pull: pending $(sql "$dst2" "SELECT pending FROM relay.handler_metrics WHERE handler = 'br_pull'"),
    rows $(sql "$dst2" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                          WHERE h.name = 'br_pull'")"

# Into a fresh cluster: no relay_* role, no relaybus anywhere yet (the
# extension's script creates its roles as the restore installs it).
log "pg_restore into a fresh cluster"
fresh=$(mktemp -d /tmp/relaybus-restore.XXXXXX)  # outside $TMP (mode 700): postgres must reach it
# Its dispatchers stay off, so that the notify backlog is still there to count.
if RELAYBUS_EXTRA_CONF="relaybus.enabled = off" bash "$RELAYBUS_ROOT/test/cluster.sh" start "$fresh" \
    >"$TMP/fresh.out" 2>&1; then
    fport=$(. "$fresh/env" && echo "$PGPORT")
    fsql() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$fresh" -p "$fport" -U postgres -d "$@" </dev/null; }
    check_eq "the fresh cluster has no relaybus role" 0 \
        "$(fsql postgres -c "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'relay\_%'")"
    fsql postgres -c "CREATE DATABASE restored" >/dev/null
    check "pg_restore --exit-on-error into it" \
        pg_restore --exit-on-error -h "$fresh" -p "$fport" -U postgres -d restored "$TMP/dump"
    check_eq "the fresh cluster's copy holds the dumped rows" "$before" \
        "$(fsql restored -c "SELECT (SELECT count(*) FROM relay.handlers), (SELECT count(*) FROM relay.routes),
            (SELECT count(*) FROM relay.deliveries), (SELECT count(*) FROM relay.deliveries WHERE not_before > published_at),
            (SELECT count(*) FROM relay.dead_letters), (SELECT string_agg(key || '=' || seq, ',' ORDER BY key) FROM relay.key_seqs)")"
    check_eq "a new handler there gets an id above every dumped one" t \
        "$(fsql restored -c "SELECT relay_create_handler('br_new2', 'pull')
                                    > coalesce((SELECT max(handler_id) FROM relay.dead_letters), 0)")"
    fsql restored -c "SELECT relay_publish('br.a', '{\"n\": 9}', 'k1')" >/dev/null
    check_eq "a new event of key k1 there gets seq 4" 4 \
        "$(fsql restored -c "SELECT max(seq) FROM relay.deliveries WHERE key = 'k1'")"
    fresh_drained() {
        fsql restored -c "SELECT relay_ack(array_agg(id)) FROM relay_claim('br_pull', 100, per_key => 100)
                          HAVING count(*) > 0" >/dev/null
        [[ $(fsql restored -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h
                                ON h.id = d.handler_id WHERE h.name = 'br_pull'") == 0 ]]
    }
    check "its pull backlog is claimed and acked" wait_until 20 fresh_drained
else
    fail "a fresh cluster starts" "$(tail -n 20 "$TMP/fresh.out")"
fi
bash "$RELAYBUS_ROOT/test/cluster.sh" destroy "$fresh" >/dev/null 2>&1
finish
