#!/usr/bin/env bash
# A narrowed relaybus.http_allowlist applies to the next connection and the
# next request at once, also while a handler stays busy (requests in flight
# all the time) and on a kept-alive connection opened before: once the
# dispatcher reloaded, nothing more reaches the removed address, and the
# deliveries refused go to dead letters with the policy's error.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

http_test_db http_allowlist

# Every request is answered after 0.2 s: with concurrency 4 and 400 deliveries
# the handler is busy for ~20 s, with 4 kept-alive connections.
http_handler "$db" busy "$URL/busy" '{"concurrency": 4, "timeout": "5s", "max_attempts": 3}' 'al.t' ||
    die "handler busy"
recv_plan "$RECV_PORT" /busy '[{"delay": 0.2, "repeat": true}]' || die "receiver control"
sql "$db" "SELECT relay_publish('al.t', jsonb_build_object('i', i), 'k' || (i % 8)) FROM generate_series(1, 400) i" >/dev/null
check "requests flow" wait_requests "$LOG" /busy 12 15
before=$(recv_count "$LOG" /busy)
pending=$(pending_of "$db" busy)
check "the handler is busy when the list is narrowed ($pending deliveries left)" test "$pending" -ge 100

# Narrow the list: 127.0.0.1 is no longer allowed.
set_conf relaybus.http_allowlist 127.0.0.2 || die "could not narrow relaybus.http_allowlist"
edition_exception "new sessions see the narrowed list (the agents' list is their --http-allowlist, not a setting)" ||
    check "new sessions see the narrowed list" wait_until 10 setting_is relaybus.http_allowlist 127.0.0.2
t_reload=$(date +%s.%N)
refused() {
    [[ $(sql "$db" "SELECT count(*) FROM relay.dead_letters WHERE handler = 'busy'
                    AND last_error LIKE 'address 127.0.0.1 is not allowed%'") -ge 1 ]]
}
check "deliveries are refused by the policy (dead letters, 'address 127.0.0.1 is not allowed ...')" \
    wait_until 10 refused
sleep 1.5  # a window in which no request may arrive
py_facts al "$LOG" "$t_reload" <<'EOF'
import sys, http_log
recs = http_log.records(sys.argv[1], "/busy")
t = float(sys.argv[2])
# Allow 1 s for the dispatcher to reload (it runs the SIGHUP at its next loop).
http_log.facts(dict(total=len(recs), late=sum(r["t"] > t + 1.0 for r in recs)))
EOF
log "requests: $before before narrowing, $(r total) in all"
check_eq "no request reaches 127.0.0.1 later than 1 s after the reload" 0 "$(r late)"
check "only what was in flight or went out during the reload was sent: $(r total) of 400 ($before before)" \
    test "$(r total)" -lt $((before + 40))
finish
