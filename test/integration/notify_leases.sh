#!/usr/bin/env bash
# Leases of ack-mode notify deliveries (docs/consumers.md):
#  (1) a forged pg_notify on a handler's channel, sent by a role that can only
#      connect, is acked by an ack-mode consumer and nothing happens: the ack
#      names no lease the consumer holds (55P03), the delivery it names (of
#      another handler) stays, and the channel's real delivery is delivered;
#  (2) a delivery that is never acked is sent again after each lease, with
#      attempt 1, 2, 3, and after max_attempts it is a dead letter ("lease
#      expired"): every hand-over is an attempt;
#  (3) a restarted consumer drains what was sent to nobody with relay_claim at
#      start (the NOTIFYs' leases are taken over), without waiting for a lease.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new_db db nlease || die "could not create a database"
notify_handler "$db" forge it_forge '{"ack": true, "lease": "30s"}' 'forge.#' || die "handler forge"
notify_handler "$db" neverack it_never \
    '{"ack": true, "lease": "1s", "max_attempts": 3, "backoff_base": "10ms", "backoff_max": "10ms"}' 'never.#' ||
    die "handler neverack"
notify_handler "$db" drain it_drain '{"ack": true, "lease": "1 hour"}' 'drain.#' || die "handler drain"
sql "$db" "SELECT relay_create_handler('victim', 'pull')" "SELECT relay_route('victim.#', 'victim')" >/dev/null ||
    die "handler victim"
check "a dispatcher serves the database" wait_workers "$db" 1 20

# field FILE LINE EXPR: evaluates a Python expression over the JSON `m` of line LINE (1-based).
field() {
    python3 -c 'import json, sys
m = json.loads(open(sys.argv[1]).read().splitlines()[int(sys.argv[2]) - 1].split("\t")[1])
print(eval(sys.argv[3]))' "$@"
}
pending() {
    sql "$db" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = '$1'"
}
# is N CMD...: CMD prints N (for wait_until, which runs it again each time).
is() { [[ "$("${@:2}")" == "$1" ]]; }
refused() { grep -c "55P03: lease of delivery $victim is not held\|lease of delivery $victim is not held" "$TMP/forged.err"; }
dead_of() { sql "$db" "SELECT count(*) FROM relay.dead_letters WHERE handler = '$1'"; }
drain_leases() {
    sql "$db" "SELECT count(*) FROM relay._leases() l JOIN relay.handlers h ON h.id = l.handler_id
                WHERE h.name = 'drain' AND l.lease_until > now() + interval '50 minutes'"
}

# ---------------------------------------------------------------- (1) forged NOTIFY
log "(1) a forged NOTIFY acks nothing"
victim=$(sql "$db" "SELECT relay_publish('victim.a', '{\"v\": 1}')" "SELECT id FROM relay.deliveries WHERE payload = '{\"v\": 1}'" | tail -1)
sql "$db" "DROP ROLE IF EXISTS it_forger" "CREATE ROLE it_forger LOGIN" >/dev/null
start_client forged "$db" it_forge --ack || die "client forged"
psql -X -q -At -v ON_ERROR_STOP=1 -U it_forger -d "$db" \
    -c "SELECT pg_notify('it_forge', '{\"id\": $victim}')" \
    -c "SELECT pg_notify('it_forge', json_build_object('id', $victim, 'lease', gen_random_uuid())::text)" \
    >/dev/null </dev/null || die "the forger could not notify"
check "the consumer received both forged messages" wait_lines "$TMP/forged.out" 2 10
check "both of its acks were refused (the lease of delivery $victim is not held)" wait_until 10 is 2 refused
check_eq "the victim delivery (another handler's) is still pending, attempt 0, not dead-lettered" "1|0|0" \
    "$(sql "$db" "SELECT count(*), max(attempt), (SELECT count(*) FROM relay.dead_letters) FROM relay.deliveries WHERE id = $victim")"
sql "$db" "SELECT relay_publish('forge.real', '{\"r\": 1}')" >/dev/null
check "the channel's real delivery arrives" wait_lines "$TMP/forged.out" 3 10
check "and is acked with its lease (gone, not dead)" wait_until 10 is 0 pending forge
check_eq "no dead letter anywhere" 0 "$(sql "$db" "SELECT count(*) FROM relay.dead_letters")"
check_eq "the victim is still pending" 1 "$(sql "$db" "SELECT count(*) FROM relay.deliveries WHERE id = $victim")"
kill "$CLIENT_PID" 2>/dev/null

# ---------------------------------------------------------------- (2) never acked
log "(2) a delivery never acked ends in dead letters after max_attempts"
start_client never "$db" it_never || die "client never"
sql "$db" "SELECT relay_publish('never.x', '{\"n\": 1}', 'nk')" >/dev/null
check "it is sent three times (1 s lease each)" wait_lines "$TMP/never.out" 3 15
check_eq "with attempt 1, 2, 3 and a new lease each time" "1 2 3 3" \
    "$(for i in 1 2 3; do field "$TMP/never.out" $i 'm["attempt"]'; done | tr '\n' ' ')$(for i in 1 2 3; do field "$TMP/never.out" $i 'm["lease"]'; done | sort -u | wc -l)"
check "after the third lease it is a dead letter" wait_until 10 is 1 dead_of neverack
check_eq "dead letter: 3 attempts, last_error 'lease expired'" "3|lease expired" \
    "$(sql "$db" "SELECT attempts, last_error FROM relay.dead_letters WHERE handler = 'neverack'")"
check_eq "nothing of it is pending" 0 "$(pending neverack)"
await_counters "$db"
if edition_exception "retries for expired leases: charged by the next claim in SQL, counted by no agent (docs/managed.md, difference 3)"; then
    check_eq "relay.handler_stats counts 1 dead" "0|1" \
        "$(sql "$db" "SELECT retried, dead FROM relay.handler_stats WHERE handler = 'neverack'")"
else
    check_eq "relay.handler_stats counts 2 retries and 1 dead" "2|1" \
        "$(sql "$db" "SELECT retried, dead FROM relay.handler_stats WHERE handler = 'neverack'")"
fi
sleep 1.5  # a lease and more: it must not be sent again
check_eq "it was not sent a fourth time" 3 "$(line_count "$TMP/never.out")"
kill "$CLIENT_PID" 2>/dev/null

# ---------------------------------------------------------------- (3) drain at start
log "(3) a restarted consumer drains with relay_claim at start"
sql "$db" "SELECT relay_publish('drain.x', jsonb_build_object('n', g), 'dk' || g) FROM generate_series(1, 3) g" >/dev/null
check "the three are sent to nobody (leased by the dispatcher for an hour)" wait_until 10 is 3 drain_leases
t0=$(date +%s.%N)
start_client drained "$db" it_drain --ack --claim-at-start drain || die "client drained"
check "the consumer claims all three at start" wait_lines "$TMP/drained.out" 3 5
check "and acks them: nothing pending, within seconds (not an hour)" wait_until 10 is 0 pending drain
check_eq "the claimed ones are the three, attempt 1, each with a lease" "1,2,3 1 3" \
    "$(cut -f2 "$TMP/drained.out" | python3 -c 'import json, sys
ms = [json.loads(l) for l in sys.stdin]
print(",".join(sorted(str(m["payload"]["n"]) for m in ms)), " ".join(sorted(set(str(m["attempt"]) for m in ms))),
      len(set(m["lease"] for m in ms)))')"
check_eq "its acks all succeeded" "" "$(cat "$TMP/drained.err")"
sql "$db" "SELECT relay_publish('drain.x', '{\"n\": 4}', 'dk1')" >/dev/null
check "a delivery published later arrives by NOTIFY" wait_lines "$TMP/drained.out" 4 10
check "and is acked" wait_until 10 is 0 pending drain
check_eq "no dead letters" 0 "$(sql "$db" "SELECT count(*) FROM relay.dead_letters WHERE handler = 'drain'")"
log "drain took $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s"
kill "$CLIENT_PID" 2>/dev/null
sql "$db" "DROP ROLE IF EXISTS it_forger" >/dev/null

finish
