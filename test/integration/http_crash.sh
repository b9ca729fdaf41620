#!/usr/bin/env bash
# kill -9 of a dispatcher while webhook requests are in flight (the receiver
# answers every request after 2 s): the postmaster crash-restarts, a new
# dispatcher sends the deliveries again, and in the end every committed event
# was received at least once, per key in order, with duplicates only for the
# requests in flight at the crash (and every one of those sent again); nothing
# is left pending or dead.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

[[ -n "${RELAYBUS_CLUSTER_DIR:-}" && -d "${RELAYBUS_CLUSTER_DIR}" ]] ||
    die "RELAYBUS_CLUSTER_DIR is not set: this test crashes the cluster"
DELAY=2

start_receiver r || die "the receiver did not start"
LOG=$TMP/r.log
allow_loopback || die "could not set relaybus.http_allowlist"
new_db db http_crash || die "could not create a database"
create_pub_log "$db"
check "a dispatcher serves the new database" wait_workers "$db" 1 20
old_dispatcher=$(sql "$db" "SELECT pid FROM relay.workers")
http_handler "$db" slow "http://127.0.0.1:$RECV_PORT/slow" \
    '{"timeout": "10s", "backoff_base": "100ms", "backoff_max": "1s", "max_attempts": 10, "concurrency": 16}' \
    'hc.#' || die "could not create the handler"
recv_plan "$RECV_PORT" /slow "[{\"delay\": $DELAY, \"repeat\": true}]" || die "receiver control"

# 10 keys x 3 events and 20 unkeyed ones, committed before the crash.
sql "$db" "INSERT INTO pub_log SELECT relay_publish('hc.ev', jsonb_build_object('i', i), 'k-' || (i % 10)), 'k-' || (i % 10)
             FROM generate_series(1, 30) i" \
    "INSERT INTO pub_log SELECT relay_publish('hc.unkeyed', jsonb_build_object('i', i)), NULL
             FROM generate_series(1, 20) i" >/dev/null
published=$(sql "$db" "SELECT count(*) FROM pub_log")
# The first 16 requests (the handler's concurrency) are answered after 2 s,
# then the next ones go out: kill the dispatcher while those are in flight.
check "16 requests in flight, then the next wave" wait_requests "$LOG" /slow 20 30
sleep 0.3
kill_t=$(date +%s.%N)
log "kill -9 of dispatcher $old_dispatcher with $(recv_count "$LOG" /slow) requests received"
kill -9 "$old_dispatcher"
after_dispatcher_kill "$db" "$old_dispatcher"
check "every delivery is completed in the end (relay.deliveries empty)" wait_until 60 none_pending "$db" slow
sleep 0.5
check_eq "nothing is dead" 0 "$(dead_of "$db" slow)"
dump_pub_log "$db" "$TMP/pub.txt"
py_facts crash "$LOG" "$TMP/pub.txt" "$kill_t" "$DELAY" <<'EOF'
import sys, http_log
recs = http_log.records(sys.argv[1], "/slow")
pub = {}
for line in open(sys.argv[2]):
    eid, _, key = line.rstrip("\n").partition("|")
    pub[int(eid)] = key or None
kill, delay = float(sys.argv[3]), float(sys.argv[4])
copies, before, after = {}, {}, {}
for r in recs:
    e = r["env"]["event_id"]
    copies[e] = copies.get(e, 0) + 1
    (before if r["t"] < kill else after).setdefault(e, []).append(r["t"])
# In flight at the kill: arrived less than `delay` before it (not answered yet),
# with slack for an answer whose completion had not committed.
in_flight = {e for e, ts in before.items() if any(kill - delay - 0.7 < t for t in ts)}
surely_unanswered = {e for e, ts in before.items() if any(kill - delay + 0.1 < t for t in ts)}
dups = {e for e, n in copies.items() if n > 1}
order = 0
last = {}
for r in recs:
    e = r["env"]
    if e["key"] is None:
        continue
    prev = last.get(e["key"])
    if prev is not None and (e["seq"] < prev or (e["seq"] == prev and e["event_id"] not in in_flight)):
        order += 1
    last[e["key"]] = e["seq"]
http_log.facts(dict(
    requests=len(recs), before=sum(len(v) for v in before.values()),
    missing=len(set(pub) - set(copies)), extra=len(set(copies) - set(pub)),
    dups=len(dups), bad_dups=len(dups - in_flight), in_flight=len(in_flight),
    unanswered=len(surely_unanswered), resent=len({e for e in surely_unanswered if e in after}),
    order=order))
EOF
log "requests: $(r requests) ($(r before) before the kill); in flight at the kill: $(r in_flight); duplicates: $(r dups)"
check_eq "every one of the $published committed events was received" 0 "$(r missing)"
check_eq "nothing was received that was not committed" 0 "$(r extra)"
check "requests were in flight at the kill ($(r unanswered) surely unanswered)" test "$(r unanswered)" -ge 1
check_eq "every request unanswered at the kill was sent again after the restart" "$(r unanswered)" "$(r resent)"
check_eq "duplicates only for requests in flight at the kill ($(r dups) duplicates)" 0 "$(r bad_dups)"
check_eq "per key, seqs never go back in arrival order (a repeat only for one in flight at the kill)" 0 "$(r order)"

finish
