#!/usr/bin/env bash
# Publishers wake the dispatchers when they commit: with relaybus.poll_interval
# at 10 s, a published event reaches a LISTEN client in well under 2 s, round
# after round (single publish, batch, a transaction that commits late), and in
# ack mode relay_ack wakes the dispatcher for the key's next delivery; a
# wake-up during a lock wait (in an iteration, or completing an http
# delivery) is not lost.
# A functional check of the wake-up path, not a benchmark.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

LIMIT=2.0  # seconds; the poll interval is 10 s
new_db db wakeup || die "could not create a database"
notify_handler "$db" fire it_wake '{}' 'wake.#' || die "handler fire"
notify_handler "$db" acked it_wake_ack '{"ack": true}' 'wakeack.#' || die "handler acked"
check "a dispatcher serves the database" wait_workers "$db" 1 20

set_conf relaybus.poll_interval 10s || die "could not set relaybus.poll_interval"
show_is() { [[ $(sql "$db" "SHOW relaybus.poll_interval") == "$1" ]]; }
check "relaybus.poll_interval is 10s" wait_until 5 show_is 10s
# The dispatcher renews its lanes (heartbeat) on every pass: an idle one that
# keeps a heartbeat older than 3 s really sleeps longer than the old 1 s.
hb_age() { sql "$db" "SELECT extract(epoch FROM now() - heartbeat)::numeric(10,3) FROM relay.workers"; }
asleep() { python3 -c "import sys; sys.exit(not float('$(hb_age)') >= $1)"; }
check "the dispatcher took the setting (idle, heartbeat older than 3 s)" wait_until 15 asleep 3

start_client main "$db" it_wake --timestamps || die "client"
recv_time() { sed -n "${2}p" "$1" | grep -o 'recv=[0-9.]*' | cut -d= -f2; }
# latency_ok LINE T_BEFORE_COMMIT: line LINE arrived less than LIMIT s after T.
latency_ok() {
    local t
    wait_lines "$TMP/main.out" "$1" 9 || { echo "not received within 9 s"; return 1; }
    t=$(recv_time "$TMP/main.out" "$1")
    python3 -c "import sys; d = $t - $2; print('latency %.3f s' % d); sys.exit(not d < $LIMIT)"
}

n=0
for round in 1 2 3 4; do
    sleep 1.2  # the dispatcher is back asleep
    t=$(sql "$db" "SELECT extract(epoch FROM clock_timestamp()), relay_publish('wake.one', jsonb_build_object('round', $round))" | cut -d'|' -f1)
    n=$((n + 1))
    check "round $round: a single publish arrives in < ${LIMIT}s" latency_ok "$n" "$t"
done

sleep 1.2
t=$(sql "$db" "SELECT extract(epoch FROM clock_timestamp()), relay_publish_batch('wake.batch', ARRAY['{\"b\": 1}', '{\"b\": 2}']::jsonb[], ARRAY['x', 'y'])" | cut -d'|' -f1)
n=$((n + 2))
check "a batch publish arrives in < ${LIMIT}s" latency_ok "$n" "$t"

# A transaction that publishes, then works 1.5 s before COMMIT: the wake-up
# must come at commit (a wake at publish time would find nothing visible and
# the dispatcher would sleep its 10 s).
sleep 1.2
t=$(psql_q -d "$db" -c "BEGIN" -c "SELECT relay_publish('wake.late', '{\"late\": true}') IS NOT NULL" \
    -c "SELECT pg_sleep(1.5)" -c "SELECT extract(epoch FROM clock_timestamp())" -c "COMMIT" | tail -n 1)
n=$((n + 1))
check "a publish that commits 1.5 s later arrives < ${LIMIT}s after the COMMIT" latency_ok "$n" "$t"
check_eq "it is the late one" 1 "$(sed -n "${n}p" "$TMP/main.out" | grep -c '"late": true')"
sleep 0.5
check_eq "nothing else arrived" "$n" "$(line_count "$TMP/main.out")"

# Ack mode: a key's next delivery goes out when the previous one is acked.
start_client acker "$db" it_wake_ack --ack --timestamps || die "client acker"
sleep 1.2
sql "$db" "SELECT relay_publish('wakeack.k', jsonb_build_object('n', g), 'k') FROM generate_series(1, 4) g" >/dev/null
check "ack mode: the 4 deliveries of one key arrive (each after the previous ack)" \
    wait_lines "$TMP/acker.out" 4 20
check "ack mode: each next delivery came < ${LIMIT}s after the previous one" python3 -c "
import re, sys
t = [float(re.search(r'recv=([0-9.]+)', l).group(1)) for l in open('$TMP/acker.out')]
gaps = [b - a for a, b in zip(t, t[1:])]
print('gaps', ['%.3f' % g for g in gaps])
sys.exit(not (len(gaps) == 3 and max(gaps) < $LIMIT))"
check "ack mode: in seq order" python3 -c "
import json, sys
seqs = [json.loads(l.split('\t')[1])['seq'] for l in open('$TMP/acker.out')]
sys.exit(seqs != [1, 2, 3, 4])"

# A wake-up that comes while the dispatcher waits on a lock inside an iteration
# is not lost (PostgreSQL's lock wait resets the process latch): the event goes
# out as soon as the iteration ends, not at the next poll (10 s).
set_conf relaybus.enabled off || die "could not disable the workers"
no_dispatcher() { [[ -z $(dispatcher_pids "$db") ]]; }
check "the dispatcher stopped" wait_until 20 no_dispatcher
sql "$db" "SELECT relay_publish('wake.locked', '{\"locked\": \"a\"}', 'lock-a')" >/dev/null
# Holds the row the dispatcher will delete when it hands the event over.
psql_q -d "$db" -c "BEGIN" -c "SELECT id FROM relay.deliveries WHERE topic = 'wake.locked' FOR UPDATE" \
    -c "SELECT pg_sleep(3)" -c "COMMIT" >/dev/null &
locker=$!
bg_track "$locker"
sleep 0.5
reset_conf relaybus.enabled
dispatcher_waits() {
    [[ $(sql "$db" "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'
                    AND datname = current_database() AND wait_event_type = 'Lock'") == 1 ]]
}
check "the dispatcher waits on the held row" wait_until 10 dispatcher_waits
sql "$db" "SELECT relay_publish('wake.locked', '{\"locked\": \"b\"}', 'lock-b')" >/dev/null
wait_pid "$locker" 10
t=$(sql "$db" "SELECT extract(epoch FROM clock_timestamp())")
n=$((n + 2))
check "the event published during the lock wait arrives < ${LIMIT}s after the lock is released" latency_ok "$n" "$t"
check_eq "it is the second one" 1 "$(sed -n "${n}p" "$TMP/main.out" | grep -c '"locked": "b"')"

# The same while it waits on a lock outside an iteration: completing an http
# delivery (its DELETE waits for a row another session holds) when a publish
# wakes it. The wake-up is not lost either.
start_receiver r || die "the receiver did not start"
allow_loopback || die "could not set relaybus.http_allowlist"
http_handler "$db" hook "http://127.0.0.1:$RECV_PORT/hook" '{}' 'wakehttp.#' || die "handler hook"
recv_plan "$RECV_PORT" /hook "[{\"hold\": \"$TMP/answer\"}]" || die "receiver control"
sql "$db" "SELECT relay_publish('wakehttp.one', '{}')" >/dev/null
check "the http request is in flight (the receiver holds its answer)" wait_requests "$TMP/r.log" /hook 1 10
psql_q -d "$db" -c "BEGIN" -c "SELECT id FROM relay.deliveries WHERE topic = 'wakehttp.one' FOR UPDATE" \
    -c "SELECT pg_sleep(3)" -c "COMMIT" >/dev/null &
locker=$!
bg_track "$locker"
sleep 0.5
touch "$TMP/answer"
check "the dispatcher waits on the held row to complete the http delivery" wait_until 10 dispatcher_waits
sql "$db" "SELECT relay_publish('wake.locked', '{\"locked\": \"c\"}', 'lock-c')" >/dev/null
wait_pid "$locker" 10
t=$(sql "$db" "SELECT extract(epoch FROM clock_timestamp())")
n=$((n + 1))
check "the event published during the completion's lock wait arrives < ${LIMIT}s after the lock is released" latency_ok "$n" "$t"
check_eq "it is that one" 1 "$(sed -n "${n}p" "$TMP/main.out" | grep -c '"locked": "c"')"

reset_conf relaybus.poll_interval
check "relaybus.poll_interval is back to its default" wait_until 5 show_is 1s

finish
