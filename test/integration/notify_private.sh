#!/usr/bin/env bash
# Private payloads on NOTIFY ("inline_payload": false, docs/consumers.md):
#  - any role that can connect may LISTEN; on a handler with inline_payload
#    false it sees only the delivery reference (id, lease, topic, key, seq,
#    "ref": true), never the payload, and cannot fetch it (relay_payload: 42501);
#  - a relay_consumer fetches it with relay_payload(id) and completes it with
#    relay_ack and the lease; the key's next delivery follows;
#  - in fire mode too the reference waits for its ack;
#  - with the default (inline) the same listener reads the payload: what the
#    docs say the default exposes.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new_db db priv || die "could not create a database"
eaves="it_eaves_$$"
reader="it_reader_$$"
psql_q -d postgres -c "CREATE ROLE $eaves LOGIN" -c "CREATE ROLE $reader LOGIN IN ROLE relay_consumer" \
    >/dev/null || die "could not create the roles"
cleanup_roles() { psql_q -d postgres -c "DROP ROLE IF EXISTS $eaves" -c "DROP ROLE IF EXISTS $reader" >/dev/null 2>&1; }
notify_handler "$db" private it_private '{"ack": true, "inline_payload": false}' 'priv.#' || die "handler private"
notify_handler "$db" privfire it_privfire '{"inline_payload": false}' 'pfire.#' || die "handler privfire"
notify_handler "$db" open it_open '{}' 'open.#' || die "handler open"
check "a dispatcher serves the database" wait_workers "$db" 1 20

as_role() { local role=$1 q=$2; psql -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -d "$db" -U "$role" -c "$q" 2>&1 </dev/null; }
msg_field() { sed -n "${2}p" "$1" | cut -f2 | python3 -c 'import json, sys; m = json.load(sys.stdin); print(eval(sys.argv[1]))' "$3"; }

log "inline_payload false: the listener sees a reference only"
start_client spy "$db user=$eaves" it_private || die "client spy"
start_client spyfire "$db user=$eaves" it_privfire || die "client spyfire"
start_client spyopen "$db user=$eaves" it_open || die "client spyopen"
sql "$db" "SELECT relay_publish('priv.card', jsonb_build_object('card', 'SECRET-4111-' || g), 'k1') FROM generate_series(1, 2) g" \
    "SELECT relay_publish('pfire.card', '{\"card\": \"SECRET-FIRE\"}', 'f1')" \
    "SELECT relay_publish('open.card', '{\"card\": \"SECRET-OPEN\"}')" >/dev/null
check "the private head arrives" wait_lines "$TMP/spy.out" 1 10
check "the fire-mode reference arrives" wait_lines "$TMP/spyfire.out" 1 10
check "the inline message arrives" wait_lines "$TMP/spyopen.out" 1 10
check_eq "the reference has exactly id, event_id, topic, key, seq, attempt, ref, lease" \
    "attempt,event_id,id,key,lease,ref,seq,topic" "$(msg_field "$TMP/spy.out" 1 '",".join(sorted(m))')"
check_eq "... for key k1, seq 1, ref true" "k1 1 True" "$(msg_field "$TMP/spy.out" 1 '"%s %s %s" % (m["key"], m["seq"], m["ref"])')"
check_eq "no SECRET in anything the listener of the private channels got" 0 \
    "$(cat "$TMP/spy.out" "$TMP/spyfire.out" | grep -c SECRET)"
check_eq "with the default, the same listener reads the payload" 1 "$(grep -c SECRET-OPEN "$TMP/spyopen.out")"
id=$(msg_field "$TMP/spy.out" 1 'm["id"]')
lease=$(msg_field "$TMP/spy.out" 1 'm["lease"]')
out=$(as_role "$eaves" "SELECT relay_payload($id)")
check_eq "the listener without relay_consumer cannot fetch the payload (42501)" 1 "$(grep -c '42501' <<<"$out")"
check_eq "... and learns nothing of it" 0 "$(grep -c SECRET <<<"$out")"
check_eq "a relay_consumer fetches it with relay_payload" '{"card": "SECRET-4111-1"}' \
    "$(as_role "$reader" "SELECT relay_payload($id)")"
check_eq "... and acks it with the lease" 1 \
    "$(as_role "$reader" "SELECT relay_ack(ARRAY[$id]::bigint[], ARRAY['$lease']::uuid[])")"
check "the key's next delivery follows the ack" wait_lines "$TMP/spy.out" 2 10
check_eq "... k1/2, by reference" "k1 2 True" "$(msg_field "$TMP/spy.out" 2 '"%s %s %s" % (m["key"], m["seq"], m["ref"])')"

log "fire mode: the reference waits for its ack"
fid=$(msg_field "$TMP/spyfire.out" 1 'm["id"]')
flease=$(msg_field "$TMP/spyfire.out" 1 'm["lease"]')
check_eq "the fire-mode delivery is still pending after it was sent" 1 \
    "$(sql "$db" "SELECT count(*) FROM relay.deliveries WHERE id = $fid")"
check_eq "a relay_consumer fetches and acks it" '{"card": "SECRET-FIRE"}|1' \
    "$(as_role "$reader" "SELECT relay_payload($fid), relay_ack(ARRAY[$fid]::bigint[], ARRAY['$flease']::uuid[])")"
check_eq "then it is gone" 0 "$(sql "$db" "SELECT count(*) FROM relay.deliveries WHERE id = $fid")"

log "the option is shown and can be turned back on"
check_eq "relay.handlers.options keeps it as given" false \
    "$(sql "$db" "SELECT options->>'inline_payload' FROM relay.handlers WHERE name = 'private'")"
sql "$db" "SELECT relay_alter_handler('privfire', options => '{\"inline_payload\": true}')" >/dev/null
sql "$db" "SELECT relay_publish('pfire.card', '{\"card\": \"NOW-INLINE\"}')" >/dev/null
check "after alter (inline_payload true) the payload is inline again" wait_until 10 grep -q NOW-INLINE "$TMP/spyfire.out"

cleanup_roles
finish
