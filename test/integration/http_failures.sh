#!/usr/bin/env bash
# Webhook failures, injected by a real HTTP receiver on loopback
# (http_receiver.py behaviours):
#  (1) per-key order across failures: key A's first delivery is answered 500
#      three times, then 200; A's later deliveries arrive only after it, key B
#      of the same handler flows meanwhile; the envelope's attempt grows 1..4
#      and the gaps between attempts stay within the backoff;
#  (2) 429 with Retry-After: 2: the retry comes 2 s later (the backoff would be
#      at most 0.1 s; a Retry-After longer than backoff_max is cut to it, see
#      http_retry_after.sh);
#  (3) 400: dead letter at once (last_status 400, the error), the key's next
#      delivery goes on; relay_replay() sends it again and it is gone;
#  (4) a timeout and a dropped connection are retried; after max_attempts the
#      delivery is a dead letter with attempts = max_attempts;
#  (5) endpoints that fail everything (503 always, a closed port) do not delay
#      another handler, open their circuit breaker (breaker_until), get far
#      fewer requests than they have deliveries, and drain by themselves once
#      the endpoint recovers.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

start_receiver r || die "the receiver did not start"
URL=http://127.0.0.1:$RECV_PORT
LOG=$TMP/r.log
log "receiver on port $RECV_PORT"
allow_loopback || die "could not set relaybus.http_allowlist"
new_db db http_failures || die "could not create a database"
check "a dispatcher serves the new database" wait_workers "$db" 1 20

# ================================================================ (1) per-key order across failures
log "(1) per-key order across failures"
http_handler "$db" ord "$URL/ord" \
    '{"backoff_base": "200ms", "backoff_max": "1s", "timeout": "2s", "max_attempts": 6}' 'hf.ord' ||
    die "handler ord"
# A-1 is answered 500 three times, each after 0.3 s, so that its failing
# window (>= 0.9 s plus the backoffs) is long enough to see B flow meanwhile.
recv_plan "$RECV_PORT" /ord "$(python3 -c 'import json; print(json.dumps(
    [{"status": 500, "delay": 0.3, "match": "\"n\": \"A-1\""}] * 3))')" || die "receiver control"
sql "$db" "BEGIN" \
    "SELECT relay_publish('hf.ord', jsonb_build_object('n', 'A-' || i), 'A') FROM generate_series(1, 5) i" \
    "SELECT relay_publish('hf.ord', jsonb_build_object('n', 'B-' || i), 'B') FROM generate_series(1, 10) i" \
    "COMMIT" >/dev/null
a_head_retrying() {
    [[ $(sql "$db" "SELECT attempt >= 1 AND last_error = 'HTTP 500' FROM relay.deliveries
                     WHERE key = 'A' AND seq = 1") == t ]]
}
check "(1) while failing, A's head shows in relay.deliveries with attempt >= 1 and last_error 'HTTP 500'" \
    wait_until 10 a_head_retrying
check "(1) all 15 deliveries arrive" wait_requests "$LOG" /ord 18 30
check "(1) relay.deliveries is empty" wait_until 10 none_pending "$db" ord
py_facts ord "$LOG" <<'EOF'
import sys, http_log
recs = http_log.records(sys.argv[1], "/ord")
n = lambda r: r["env"]["payload"]["n"]
a1 = [r for r in recs if n(r) == "A-1"]
later_a = [r for r in recs if n(r).startswith("A-") and n(r) != "A-1"]
b = [r for r in recs if n(r).startswith("B-")]
ok_at = a1[-1]["t"] if a1 else 0
caps = [0.2, 0.4, 0.8]
gaps = [a1[i + 1]["t"] - a1[i]["t"] - 0.3 for i in range(len(a1) - 1)]
http_log.facts(dict(
    a1_statuses=",".join(str(r["answered"].get("status", 200)) for r in a1),
    a1_attempts=",".join(str(r["env"]["attempt"]) for r in a1),
    a1_ids=len({r["headers"]["webhook-id"] for r in a1}),
    later_a=",".join(n(r) for r in later_a),
    later_a_after=sum(r["t"] > ok_at for r in later_a),
    b=",".join(str(r["env"]["seq"]) for r in b),
    # B-1 goes out with A-1's first attempt and may be logged a moment before it:
    # what matters is that all of B arrived before A-1 succeeded.
    b_before=sum(r["t"] < ok_at for r in b) if a1 else -1,
    gaps=",".join(f"{g:.3f}" for g in gaps),
    gaps_in_bounds=sum(-0.05 <= g <= c + 0.35 for g, c in zip(gaps, caps)),
    gaps_sum_ms=int(sum(gaps) * 1000),
    window_ms=int((ok_at - a1[0]["t"]) * 1000) if a1 else -1))
EOF
log "(1) A-1 window $(r window_ms) ms; gaps between attempts (minus the 0.3 s answer delay): $(r gaps) s"
check_eq "(1) A-1 was answered 500, 500, 500, 200" "500,500,500,200" "$(r a1_statuses)"
check_eq "(1) the envelope's attempt grows 1, 2, 3, 4" "1,2,3,4" "$(r a1_attempts)"
check_eq "(1) every attempt of A-1 carries the same webhook-id" 1 "$(r a1_ids)"
check_eq "(1) A's later deliveries arrive once each, in order" "A-2,A-3,A-4,A-5" "$(r later_a)"
check_eq "(1) ... and only after A-1 succeeded" 4 "$(r later_a_after)"
check_eq "(1) key B's deliveries arrive once each, in order" "1,2,3,4,5,6,7,8,9,10" "$(r b)"
check_eq "(1) ... all while A-1 was failing (B is not blocked by A)" 10 "$(r b_before)"
check_eq "(1) each gap between attempts is within its backoff (full jitter up to 0.2, 0.4, 0.8 s; + 0.35 s slack)" \
    3 "$(r gaps_in_bounds)"
check "(1) the retries are not immediate: the backoffs add up to > 20 ms ($(r gaps_sum_ms) ms)" \
    test "$(r gaps_sum_ms)" -gt 20

# ================================================================ (2) 429 + Retry-After
log "(2) 429 with Retry-After: 2"
http_handler "$db" ra "$URL/ra" \
    '{"backoff_base": "100ms", "backoff_max": "5s", "timeout": "2s", "max_attempts": 4}' 'hf.ra' || die "handler ra"
recv_plan "$RECV_PORT" /ra '[{"status": 429, "retry_after": "2"}]' || die "receiver control"
sql "$db" "SELECT relay_publish('hf.ra', '{\"ra\": 1}', 'ra')" >/dev/null
check "(2) the delivery is sent twice" wait_requests "$LOG" /ra 2 15
check "(2) ... and completed" wait_until 10 none_pending "$db" ra
py_facts ra "$LOG" <<'EOF'
import sys, http_log
recs = http_log.records(sys.argv[1], "/ra")
http_log.facts(dict(
    statuses=",".join(str(r["answered"].get("status", 200)) for r in recs),
    attempts=",".join(str(r["env"]["attempt"]) for r in recs),
    gap_ms=int((recs[1]["t"] - recs[0]["t"]) * 1000) if len(recs) > 1 else -1))
EOF
log "(2) retry after $(r gap_ms) ms"
check_eq "(2) answered 429 then 200, attempts 1 then 2" "429,200 1,2" "$(r statuses) $(r attempts)"
check "(2) the retry came >= 1.9 s later (Retry-After: 2, though the backoff is at most 0.1 s): $(r gap_ms) ms" \
    test "$(r gap_ms)" -ge 1900
check "(2) ... and not much later than that (< 4 s)" test "$(r gap_ms)" -lt 4000
check_eq "(2) relay.handler_stats: http_4xx, http_2xx, retried" "1|1|1" "$(handler_stat "$db" ra "http_4xx, http_2xx, retried")"

# ================================================================ (3) 400 -> dead letter, replay
log "(3) 400: dead letter at once, replay"
http_handler "$db" bad "$URL/bad" \
    '{"backoff_base": "100ms", "backoff_max": "1s", "timeout": "2s", "max_attempts": 4}' 'hf.bad' || die "handler bad"
recv_plan "$RECV_PORT" /bad '[{"status": 400, "match": "\"n\": \"bad-1\""}]' || die "receiver control"
sql "$db" "SELECT relay_publish('hf.bad', jsonb_build_object('n', 'bad-' || i), 'bad') FROM generate_series(1, 2) i" >/dev/null
check "(3) the delivery is dead-lettered" wait_until 15 dead_is "$db" bad 1
dl=$(sql "$db" "SELECT seq, attempts, last_status, last_error FROM relay.dead_letters WHERE handler = 'bad'")
check_eq "(3) dead letter: seq 1, 1 attempt, last_status 400, last_error 'HTTP 400'" "1|1|400|HTTP 400" "$dl"
check "(3) the key's next delivery is sent after it" wait_requests "$LOG" /bad 2 10
check "(3) ... and nothing is pending" wait_until 10 none_pending "$db" bad
sleep 0.3
check_eq "(3) the 400 was not retried (2 requests: bad-1 once, bad-2)" 2 "$(recv_count "$LOG" /bad)"
check_eq "(3) relay_replay('bad') moves 1 dead letter back" 1 "$(sql "$db" "SELECT relay_replay('bad')")"
check "(3) the replayed delivery is sent again (answered 200)" wait_requests "$LOG" /bad 3 15
check "(3) ... and completed: gone from relay.deliveries" wait_until 10 none_pending "$db" bad
check_eq "(3) ... and from relay.dead_letters" 0 "$(dead_of "$db" bad)"
py_facts bad "$LOG" <<'EOF'
import sys, http_log
recs = http_log.records(sys.argv[1], "/bad")
http_log.facts(dict(
    seq=",".join(str(r["env"]["seq"]) for r in recs),
    statuses=",".join(str(r["answered"].get("status", 200)) for r in recs),
    attempts=",".join(str(r["env"]["attempt"]) for r in recs),
    same_id=int(len(recs) == 3 and recs[0]["headers"]["webhook-id"] == recs[2]["headers"]["webhook-id"])))
EOF
check_eq "(3) requests: seq 1 (400), seq 2 (200), seq 1 replayed (200) with attempt 1 and the same webhook-id" \
    "1,2,1 400,200,200 1,1,1 1" "$(r seq) $(r statuses) $(r attempts) $(r same_id)"

# ================================================================ (4) timeout, dropped connection, max_attempts
log "(4) timeout, dropped connection, max_attempts"
OPT4='"backoff_base": "100ms", "backoff_max": "1s", "timeout": "1s"'
# The dropped connection is a fresh one, on a receiver of its own: libcurl
# resends a request by itself (within the same attempt) when a reused
# keep-alive connection closes without a response.
port1=$RECV_PORT
start_receiver r2 || die "the second receiver did not start"
DROP_PORT=$RECV_PORT
RECV_PORT=$port1
http_handler "$db" slow "$URL/slow" "{$OPT4, \"max_attempts\": 4}" 'hf.slow' || die "handler slow"
http_handler "$db" drop "http://127.0.0.1:$DROP_PORT/drop" "{$OPT4, \"max_attempts\": 4}" 'hf.drop' || die "handler drop"
http_handler "$db" exhaust "$URL/exhaust" "{$OPT4, \"max_attempts\": 3}" 'hf.exhaust' || die "handler exhaust"
recv_plan "$RECV_PORT" /slow '[{"delay": 2.5}]' || die "receiver control"
recv_plan "$DROP_PORT" /drop '[{"drop": true}]' || die "receiver control"
recv_plan "$RECV_PORT" /exhaust '[{"status": 503}, {"status": 500}, {"delay": 2.5}, {"status": 200}]' ||
    die "receiver control"
sql "$db" "SELECT relay_publish(t, '{\"x\": 1}') FROM unnest(ARRAY['hf.slow', 'hf.drop', 'hf.exhaust']) t" >/dev/null
check "(4) timeout: the delivery is sent again" wait_requests "$LOG" /slow 2 15
check "(4) timeout: ... and completed" wait_until 10 none_pending "$db" slow
check "(4) dropped connection: the delivery is sent again" wait_requests "$TMP/r2.log" /drop 2 15
check "(4) dropped connection: ... and completed" wait_until 10 none_pending "$db" drop
check "(4) max_attempts 3: the delivery becomes a dead letter" wait_until 20 dead_is "$db" exhaust 1
py_facts t4 "$LOG" "$TMP/r2.log" <<'EOF'
import sys, http_log
f = {}
for p in ("slow", "drop", "exhaust"):
    recs = http_log.records(sys.argv[2] if p == "drop" else sys.argv[1], "/" + p)
    f[p + "_n"] = len(recs)
    f[p + "_attempts"] = ",".join(str(r["env"]["attempt"]) for r in recs)
    f[p + "_ids"] = len({r["headers"]["webhook-id"] for r in recs})
    f[p + "_gap_ms"] = int((recs[1]["t"] - recs[0]["t"]) * 1000) if len(recs) > 1 else -1
    f[p + "_last"] = f'{recs[-1]["answered"].get("status", 200)}/{recs[-1]["env"]["attempt"]}' if recs else "none"
http_log.facts(f)
EOF
log "(4) timeout retry after $(r slow_gap_ms) ms; drop: attempts $(r drop_attempts)"
check_eq "(4) timeout: 2 requests of one delivery, attempts 1, 2" "2 1,2 1" "$(r slow_n) $(r slow_attempts) $(r slow_ids)"
check "(4) timeout: the retry came after the 1 s timeout ($(r slow_gap_ms) ms)" test "$(r slow_gap_ms)" -ge 950
check_eq "(4) timeout: counted as a network error (http_errors 1, http_2xx 1)" "1|1" \
    "$(handler_stat "$db" slow "http_errors, http_2xx")"
check_eq "(4) dropped connection: 2 requests of one delivery, attempts 1, 2, the second answered 200" \
    "2 1,2 1 200/2" "$(r drop_n) $(r drop_attempts) $(r drop_ids) $(r drop_last)"
check_eq "(4) dropped connection: counted as a network error, then a 2xx; no dead letter" "1|1|0" \
    "$(handler_stat "$db" drop "http_errors, http_2xx, dead")"
dl=$(sql "$db" "SELECT attempts, coalesce(last_status::text, 'null'), last_error FROM relay.dead_letters WHERE handler = 'exhaust'")
check_eq "(4) max_attempts 3: dead letter with attempts 3, no status, the last error (timeout)" \
    "3|null|timeout after 1000 ms" "$dl"
check_eq "(4) max_attempts 3: exactly 3 requests, attempts 1, 2, 3" "3 1,2,3" "$(r exhaust_n) $(r exhaust_attempts)"
check_eq "(4) max_attempts 3: nothing pending" 0 "$(pending_of "$db" exhaust)"

# ================================================================ (5) down endpoints, breaker, recovery
log "(5) down endpoints"
closed_port=$(python3 "$RELAYBUS_ROOT/scripts/free-port.py")
# backoff_max is large: the breaker's backoff must start at backoff_base and
# grow per failed probe, not per request that was in flight when it opened.
OPT5='"backoff_base": "200ms", "backoff_max": "1min", "timeout": "1s", "max_attempts": 1000'
http_handler "$db" down "$URL/down" "{$OPT5}" 'hf.down' || die "handler down"
http_handler "$db" closed "http://127.0.0.1:$closed_port/closed" "{$OPT5}" 'hf.closed' || die "handler closed"
http_handler "$db" up "$URL/up" "{$OPT5}" 'hf.up' || die "handler up"
recv_plan "$RECV_PORT" /down '[{"status": 503, "repeat": true}]' || die "receiver control"
sql "$db" "SELECT relay_publish('hf.down', jsonb_build_object('i', i)) FROM generate_series(1, 200) i" \
    "SELECT relay_publish('hf.closed', jsonb_build_object('i', i)) FROM generate_series(1, 100) i" >/dev/null
breaker_open() { [[ $(handler_stat "$db" "$1" "breaker_until IS NOT NULL") == t ]]; }
check "(5) 503 always: the breaker opens (relay.handler_stats.breaker_until set)" wait_until 15 breaker_open down
check "(5) closed port: the breaker opens" wait_until 15 breaker_open closed
# Grown from 200 ms per failed probe, the backoff passes 40 s only after 8
# probes (51 s of probing); started at backoff_max it would be ~60 s ahead.
# (A 5 s bound failed once at load 18: the second wait above took long
# enough for the backoff to grow past it.)
check "(5) the breaker's first backoffs are short (breaker_until < 40 s ahead; backoff_max is 1 min)" \
    test "$(sql "$db" "SELECT count(*) FROM relay.handler_stats WHERE handler IN ('down', 'closed')
                        AND breaker_until < now() + interval '40 s'")" = 2
check_eq "(5) closed port: the error is 'connection refused'" "connection refused" \
    "$(sql "$db" "SELECT DISTINCT last_error FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                   WHERE h.name = 'closed' AND last_error IS NOT NULL")"
sleep 1
# While both fail: 30 events to 'up', one every 0.1 s, and the requests to /down counted.
down0=$(recv_count "$LOG" /down)
t0=$(date +%s%N)
for i in $(seq 1 30); do
    sql "$db" "SELECT relay_publish('hf.up', jsonb_build_object('i', $i, 'at', extract(epoch FROM clock_timestamp())))" >/dev/null
    sleep 0.1
done
check "(5) the other handler's 30 deliveries arrive" wait_requests "$LOG" /up 30 10
down1=$(recv_count "$LOG" /down)
window_ms=$((($(date +%s%N) - t0) / 1000000))
down_pending=$(pending_of "$db" down)
log "(5) $((down1 - down0)) requests to /down in ${window_ms} ms with $down_pending deliveries pending; $down0 before"
check "(5) breaker: at most 12 requests to /down in ${window_ms} ms ($((down1 - down0))), while its 200 deliveries wait" \
    test $((down1 - down0)) -le 12 -a "$down_pending" -eq 200
check_eq "(5) 'down' is still failing with its breaker open" t "$(handler_stat "$db" down "breaker_until IS NOT NULL AND pending = 200")"
py_facts up "$LOG" <<'EOF'
import sys, http_log
recs = http_log.records(sys.argv[1], "/up")
lat = [r["t"] - r["env"]["payload"]["at"] for r in recs]
http_log.facts(dict(n=len(recs), max_ms=int(max(lat) * 1000), attempts=sum(r["env"]["attempt"] != 1 for r in recs)))
EOF
check "(5) the other handler is not delayed: every delivery within 1 s of its publish (max $(r max_ms) ms)" \
    test "$(r max_ms)" -lt 1000
check_eq "(5) ... each at its first attempt" 0 "$(r attempts)"
log "(5) the endpoint recovers"
recv_plan "$RECV_PORT" /down '[]' || die "receiver control"
t0=$(date +%s%N)
check "(5) after recovery the backlog of 'down' drains by itself" wait_until 30 none_pending "$db" down
log "(5) drained in $((($(date +%s%N) - t0) / 1000000)) ms"
py_facts down "$LOG" <<'EOF'
import sys, http_log
recs = http_log.records(sys.argv[1], "/down")
ok = {r["headers"]["webhook-id"] for r in recs if r["answered"].get("status", 200) == 200}
http_log.facts(dict(delivered=len(ok), requests=len(recs)))
EOF
check_eq "(5) every one of its 200 deliveries got a 200" 200 "$(r delivered)"
check "(5) its breaker closed" wait_until 5 bash -c "[[ \$(psql -X -At -d '$db' -c \"SELECT breaker_until IS NULL FROM relay.handler_stats WHERE handler = 'down'\") == t ]]"
check_eq "(5) no dead letters" 0 "$(dead_of "$db" down)"
sql "$db" "SELECT relay_drop_handler('closed', true)" >/dev/null

finish
