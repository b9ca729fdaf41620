#!/usr/bin/env bash
# A dispatcher frozen (SIGSTOP) with a webhook request in flight, past its
# lanes' lease_timeout and the request's lease, while a second dispatcher takes
# its lanes over: the second charges the expired lease as a failed attempt
# ("lease expired") and sends the delivery again; when the frozen one wakes
# with its (late) response, it completes nothing (its lease token is stale):
# the delivery stays, held by the second, until the second's own response.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

[[ -n "$SERVER_LOG" && -f "$SERVER_LOG" ]] ||
    die "RELAYBUS_CLUSTER_DIR is not set: this test reads the server log"
frozen=""
trap '[[ -n "$frozen" ]] && kill -CONT "$frozen" 2>/dev/null; cleanup' EXIT

start_receiver r || die "the receiver did not start"
LOG=$TMP/r.log
allow_loopback || die "could not set relaybus.http_allowlist"
set_conf relaybus.lease_timeout 1s || die "lease_timeout"
set_conf relaybus.workers_per_database 2 || die "workers_per_database"
# The request's lease is timeout + this margin (30 s by default): the test
# waits for it to expire.
set_conf relaybus.http_lease_margin 5s || die "http_lease_margin"
new_db db http_fence || die "could not create a database"
check "two dispatchers serve the database" wait_workers "$db" 2 20
# timeout 20s: the request's lease is timeout + 5 s = 25 s. The second
# request is answered when the test has looked at its lease (the file), at
# the latest at its timeout.
http_handler "$db" fence "http://127.0.0.1:$RECV_PORT/fence" \
    '{"timeout": "20s", "backoff_base": "100ms", "backoff_max": "100ms", "max_attempts": 5}' 'fence.#' ||
    die "could not create the handler"
recv_plan "$RECV_PORT" /fence "[{\"delay\": 2.0}, {\"hold\": \"$TMP/answer\"}]" || die "receiver control"

lease_owner() { sql "$db" "SELECT owner_pid FROM relay._leases()"; }
row() { sql "$db" "SELECT attempt, coalesce(last_error, '') FROM relay.deliveries"; }
log_lines() { grep -c "$1" "$SERVER_LOG" 2>/dev/null || true; }
lost_before=$(log_lines "not completed: their leases were lost")
lost_logged() { (($(log_lines "not completed: their leases were lost") > lost_before)); }

sql "$db" "SELECT relay_publish('fence.x', '{\"n\": 1}', 'f')" >/dev/null
check "the first request reaches the receiver" wait_requests "$LOG" /fence 1 10
frozen=$(lease_owner)
[[ -n "$frozen" ]] || die "no lease owner"
others=$(sql "$db" "SELECT string_agg(pid::text, ' ') FROM relay.workers WHERE pid <> $frozen")
log "freezing dispatcher $frozen (the other: $others) with the request in flight"
kill -STOP "$frozen"
t0=$(date +%s.%N)
check "after the 25 s lease the other dispatcher sends it again" wait_requests "$LOG" /fence 2 90
log "second request after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
check_eq "the expiry was charged: attempt 1, 'lease expired'" "1|lease expired" "$(row)"
check_eq "the other dispatcher holds the new lease" "$others" "$(lease_owner)"
kill -CONT "$frozen"
frozen_pid=$frozen
frozen=""
check "the woken dispatcher reports its result as not completed (lease lost)" wait_until 30 lost_logged
check_eq "it completed nothing: the delivery is still there, attempt 1" "1|lease expired" "$(row)"
check_eq "still held by the other dispatcher" "$others" "$(lease_owner)"
touch "$TMP/answer"
check "the other dispatcher's response completes it" wait_until 30 none_pending "$db" fence
check_eq "no dead letter" 0 "$(dead_of "$db" fence)"
check_eq "the receiver got exactly two requests" 2 "$(recv_count "$LOG" /fence)"
check "the woken dispatcher is still alive" kill -0 "$frozen_pid"
finish
