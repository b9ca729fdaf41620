#!/usr/bin/env bash
# Notify handlers in ack mode and deliveries by reference:
#  - the next delivery of a key is not sent before the previous one is acked;
#    other keys are not held up;
#  - a delivery not acked within its lease is sent again (same id and seq; the
#    expired lease counted a failed attempt, so attempt 2, after the backoff),
#    then the key moves on;
#  - every message carries its lease token ("lease"), and acks name it;
#  - a payload too big for NOTIFY is sent by reference ("ref": true, no
#    payload); relay_payload(id) returns it and relay_ack completes it, in ack
#    mode and in fire mode (where the reference also holds its key until acked).
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new_db db ack || die "could not create a database"
notify_handler "$db" acked it_ack '{"ack": true, "lease": "30s"}' 'ack.#' || die "handler acked"
notify_handler "$db" short it_lease '{"ack": true, "lease": "1s", "backoff_base": "100ms", "backoff_max": "100ms"}' \
    'lease.#' || die "handler short"
notify_handler "$db" fire it_ref '{}' 'ref.#' || die "handler fire"
notify_handler "$db" bigack it_refack '{"ack": true}' 'refack.#' || die "handler bigack"
check "a dispatcher serves the database" wait_workers "$db" 1 20

# field FILE LINE EXPR: evaluates a Python expression over the JSON `m` of line LINE (1-based).
field() {
    python3 -c 'import json, sys
m = json.loads(open(sys.argv[1]).read().splitlines()[int(sys.argv[2]) - 1].split("\t")[1])
print(eval(sys.argv[3]))' "$@"
}
# ack_new FILE [ID...]: acks (in a psql session, with each message's lease) the
# deliveries of FILE not acked yet; IDs are taken as acked already.
ack_new() {
    local f=$1 ids leases
    shift
    printf '%s\n' "$@" >>"$f.acked"
    read -r ids leases < <(cut -f2 "$f" | python3 -c 'import json, sys
done = set(open(sys.argv[1]).read().split())
new = [m for m in map(json.loads, sys.stdin) if str(m["id"]) not in done]
print(",".join(str(m["id"]) for m in new), ",".join("%s" % m["lease"] for m in new))' "$f.acked")
    [[ -z "$ids" ]] && return 0
    sql "$db" "SELECT relay_ack(ARRAY[$ids]::bigint[], string_to_array('$leases', ',')::uuid[])" >/dev/null &&
        tr ',' '\n' <<<"$ids" >>"$f.acked"
}
recv_time() { sed -n "${2}p" "$1" | grep -o 'recv=[0-9.]*' | cut -d= -f2; }

# ---------------------------------------------------------------- the key waits for the ack
log "ack mode: a key waits for its ack"
start_client watch "$db" it_ack --timestamps || die "client watch"
sql "$db" "SELECT relay_publish('ack.a', jsonb_build_object('n', g), 'k1') FROM generate_series(1, 3) g" \
    "SELECT relay_publish('ack.a', jsonb_build_object('n', g), 'k2') FROM generate_series(1, 2) g" >/dev/null
check "the heads of both keys arrive" wait_lines "$TMP/watch.out" 2 10
sleep 1.5  # two poll intervals: nothing else may come
check_eq "only the two heads were sent (no ack yet)" 2 "$(line_count "$TMP/watch.out")"
check_eq "the heads are k1/1 and k2/1, attempt 1" "k1/1/1 k2/1/1" \
    "$(for i in 1 2; do field "$TMP/watch.out" $i '"%s/%s/%s" % (m["key"], m["seq"], m["attempt"])'; done | sort | tr '\n' ' ' | sed 's/ $//')"
check_eq "relay.handler_stats: 5 pending, 2 in flight" "5|2" \
    "$(sql "$db" "SELECT pending, in_flight FROM relay.handler_stats WHERE handler = 'acked'")"
check_eq "relay._leases(): the two heads are leased" "2" "$(sql "$db" "SELECT count(*) FROM relay._leases()")"
k1=$(grep '"key": "k1"' "$TMP/watch.out" | head -1 | cut -f2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
k1lease=$(grep '"key": "k1"' "$TMP/watch.out" | head -1 | cut -f2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["lease"])')
check "an ack without the lease (another session than the dispatcher's) fails with 55P03" bash -c "
    out=\$(psql -X -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -d '$db' -c 'SELECT relay_ack(ARRAY[$k1])' 2>&1)
    [[ \$? != 0 && \$out == *'55P03: lease of delivery $k1 is not held: another holder'* ]]"
check_eq "relay_ack(k1's head, its lease) acks 1" 1 "$(sql "$db" "SELECT relay_ack(ARRAY[$k1], ARRAY['$k1lease'::uuid])")"
check "k1's second delivery arrives after the ack" wait_lines "$TMP/watch.out" 3 10
check_eq "it is k1/2" "k1/2" "$(field "$TMP/watch.out" 3 '"%s/%s" % (m["key"], m["seq"])')"
sleep 1.5
check_eq "nothing else was sent (k1/3 waits for k1/2, k2/2 for k2/1)" 3 "$(line_count "$TMP/watch.out")"
check "acking an already acked delivery fails with P0002" bash -c "
    out=\$(psql -X -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -d '$db' -c 'SELECT relay_ack(ARRAY[$k1])' 2>&1)
    [[ \$? != 0 && \$out == *'P0002: delivery $k1 does not exist'* ]]"
# Ack what arrives, in another session, until all 5 came: each once, in key order.
ack_new "$TMP/watch.out" "$k1"
for n in 4 5; do
    wait_lines "$TMP/watch.out" "$n" 10
    ack_new "$TMP/watch.out"
done
check_eq "all 5 deliveries were sent, each once, keys in seq order" "k1/1 k1/2 k1/3 k2/1 k2/2" \
    "$(cut -f2 "$TMP/watch.out" | python3 -c 'import json,sys
print(" ".join(sorted("%s/%s" % (m["key"], m["seq"]) for m in map(json.loads, sys.stdin))))')"
check "k1 arrived in seq order" bash -c "grep '\"key\": \"k1\"' '$TMP/watch.out' | grep -o '\"seq\": [0-9]*' | tr -d '\\n' | grep -q '\"seq\": 1\"seq\": 2\"seq\": 3'"
check "relay.deliveries of the handler is empty after the acks" \
    wait_until 10 sql_is "$db" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'acked'" 0
kill "$CLIENT_PID" 2>/dev/null

# ---------------------------------------------------------------- redelivery after the lease
log "ack mode: redelivery after a 1 s lease"
start_client lease "$db" it_lease --ack --ack-skip 1 --timestamps || die "client lease"
sql "$db" "SELECT relay_publish('lease.a', jsonb_build_object('n', g), 'r') FROM generate_series(1, 2) g" >/dev/null
check "three notifications: r/1, r/1 again after its lease, then r/2" wait_lines "$TMP/lease.out" 3 15
sleep 1.5
check_eq "exactly three notifications" 3 "$(line_count "$TMP/lease.out")"
check_eq "the order is r/1, r/1, r/2" "r/1 r/1 r/2" \
    "$(for i in 1 2 3; do field "$TMP/lease.out" $i '"%s/%s" % (m["key"], m["seq"])'; done | tr '\n' ' ' | sed 's/ $//')"
check_eq "the redelivery has the same delivery id and event id" \
    "$(field "$TMP/lease.out" 1 '(m["id"], m["event_id"])')" "$(field "$TMP/lease.out" 2 '(m["id"], m["event_id"])')"
check_eq "attempt is 1, then 2 (the expired lease counted a failed attempt)" "1 2" \
    "$(field "$TMP/lease.out" 1 'm["attempt"]') $(field "$TMP/lease.out" 2 'm["attempt"]')"
check "each send has its own lease token" \
    test "$(field "$TMP/lease.out" 1 'm["lease"]')" != "$(field "$TMP/lease.out" 2 'm["lease"]')"
gap=$(python3 -c "print(round($(recv_time "$TMP/lease.out" 2) - $(recv_time "$TMP/lease.out" 1), 3))")
check "the redelivery came after the 1 s lease (allowing 0.3 s of client lag), within 5 s (gap ${gap}s)" \
    python3 -c "import sys; sys.exit(not (0.7 <= $gap < 5))"
check "relay.deliveries is empty after the ack of the redelivery" \
    wait_until 10 sql_is "$db" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'short'" 0
check_eq "the client's acks all succeeded" "" "$(grep -i 'failed' "$TMP/lease.err")"
kill "$CLIENT_PID" 2>/dev/null

# ---------------------------------------------------------------- by reference, fire mode
log "by reference (fire mode)"
start_client ref "$db" it_ref --fetch-ref --timestamps || die "client ref"
# (The key's next delivery is published once the reference went out: one
# committed in the same batch as the reference is sent along with it.)
sql "$db" "SELECT relay_publish('ref.big', jsonb_build_object('blob', repeat('x', 20000), 'n', 1), 'b')" >/dev/null
check "the big one arrives" wait_lines "$TMP/ref.out" 1 10
sql "$db" "SELECT relay_publish('ref.small', '{\"n\": 2}', 'b')" \
    "SELECT relay_publish('ref.fits', jsonb_build_object('blob', repeat('y', 7000), 'n', 3), 'c')" >/dev/null
check "the one that fits arrives" wait_lines "$TMP/ref.out" 2 10
sleep 1.5
check_eq "the small one waits behind the unacked reference of its key" 2 "$(line_count "$TMP/ref.out")"
bigline=$(grep -n '"key": "b"' "$TMP/ref.out" | head -1 | cut -d: -f1)
check_eq "the big payload is sent by reference: ref true, no payload" "True False" \
    "$(field "$TMP/ref.out" "$bigline" '"%s %s" % (m.get("ref") is True, "payload" in m)')"
check "the reference notification is small (< 7900 bytes)" \
    test "$(sed -n "${bigline}p" "$TMP/ref.out" | cut -f2 | wc -c)" -lt 7900
check "relay_payload(id) returned the full payload" python3 -c "
import json, sys
line = open('$TMP/ref.out').read().splitlines()[$bigline - 1].split('\t')
fetched = [f for f in line if f.startswith('fetched=')][0][len('fetched='):]
p = json.loads(fetched)
sys.exit(not (p == {'blob': 'x' * 20000, 'n': 1}))"
fitline=$(grep -n '"key": "c"' "$TMP/ref.out" | head -1 | cut -d: -f1)
check_eq "a 7000-byte payload is sent inline" "False 7000" \
    "$(field "$TMP/ref.out" "$fitline" '"%s %s" % ("ref" in m, len(m["payload"]["blob"]))')"
check_eq "the inline one is completed at once; the reference and the key's next one stay" "b/1 b/2" \
    "$(sql "$db" "SELECT string_agg(d.key || '/' || d.seq, ' ' ORDER BY d.seq) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'fire'")"
bigid=$(field "$TMP/ref.out" "$bigline" 'm["id"]')
biglease=$(field "$TMP/ref.out" "$bigline" 'm["lease"]')
check_eq "a fire-mode message sent inline carries no lease (nothing to complete)" "False" \
    "$(field "$TMP/ref.out" "$fitline" '"lease" in m')"
check_eq "relay_ack(the reference, its lease) acks it" 1 "$(sql "$db" "SELECT relay_ack(ARRAY[$bigid], ARRAY['$biglease'::uuid])")"
check "then the key's next delivery arrives" wait_lines "$TMP/ref.out" 3 10
check_eq "it is b/2 inline" "b/2/2" "$(field "$TMP/ref.out" 3 '"%s/%s/%s" % (m["key"], m["seq"], m["payload"]["n"])')"
check_eq "relay_payload of a completed delivery is NULL" "" "$(sql "$db" "SELECT relay_payload($bigid)")"
check "nothing of the fire handler is left" \
    wait_until 10 sql_is "$db" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'fire'" 0
kill "$CLIENT_PID" 2>/dev/null

# ---------------------------------------------------------------- by reference, ack mode, a consumer that fetches and acks
log "by reference (ack mode, fetch + ack by the client)"
create_pub_log "$db"
start_client refack "$db" it_refack --fetch-ref --ack || die "client refack"
sql "$db" "INSERT INTO pub_log SELECT relay_publish('refack.x', jsonb_build_object('blob', repeat(chr(97 + g), 9000 * (g % 2)), 'n', g), 'rk' || (g % 3)), 'rk' || (g % 3) FROM generate_series(1, 12) g" >/dev/null
check "all 12 arrive" wait_lines "$TMP/refack.out" 12 20
check "relay.deliveries is empty (every delivery acked by the client)" \
    wait_until 10 sql_is "$db" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'bigack'" 0
kill "$CLIENT_PID" 2>/dev/null
dump_pub_log "$db" "$TMP/pub.txt"
analyze --published "$TMP/pub.txt" "$TMP/refack.out" || die "analysis failed"
check_eq "each once, in key order, 6 by reference" "0 0 0 0 0 6" \
    "${R[missing]} ${R[dups]} ${R[order_violations]} ${R[seq_repeats]} ${R[seq_gap_keys]} ${R[by_ref]}"
check "each fetched payload is the published one" python3 -c "
import json, sys
bad = 0
for line in open('$TMP/refack.out'):
    f = line.rstrip('\n').split('\t')
    m = json.loads(f[1])
    if m.get('ref'):
        p = json.loads([x for x in f if x.startswith('fetched=')][0][8:])
    else:
        p = m['payload']
    g = p['n']
    bad += p['blob'] != chr(97 + g) * (9000 * (g % 2)) or bool(m.get('ref')) != (g % 2 == 1)
sys.exit(bad)"
check_eq "the client's fetches and acks all succeeded" "" "$(cat "$TMP/refack.err")"

finish
