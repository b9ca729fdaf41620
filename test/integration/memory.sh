#!/usr/bin/env bash
# Dispatcher memory stays flat (issue 15): the dispatcher's TopMemoryContext,
# read with pg_log_backend_memory_contexts(), does not grow with the number of
# deliveries nor with idle time once warmed up:
#  (1) an http handler: 3,000 webhooks to the real receiver plus idle waits;
#  (2) notify and pull traffic beside it.
# Each phase compares TopMemoryContext's "used" bytes and the grand total
# before and after against a small fixed bound (an allocation per loop
# iteration or per delivery that outlives it shows up as tens of kB here).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

[[ -f "$SERVER_LOG" ]] || die "no server log at $SERVER_LOG"
TOP_BOUND=${MEMORY_TOP_BOUND:-8192}       # bytes TopMemoryContext may grow by
TOTAL_BOUND=${MEMORY_TOTAL_BOUND:-262144}  # bytes all contexts may grow by

start_receiver r || die "the receiver did not start"
allow_loopback || die "could not set relaybus.http_allowlist"
new_db db memory || die "could not create a database"
check "a dispatcher serves the database" wait_workers "$db" 1 20
pid=$(dispatcher_pids "$db" | head -n 1)
[[ -n "$pid" ]] || die "no dispatcher pid"
log "dispatcher pid $pid"

FAST='"backoff_base": "100ms", "backoff_max": "1s", "timeout": "5s", "concurrency": 16'
http_handler "$db" hook "http://127.0.0.1:$RECV_PORT/mem" "{$FAST}" 'mem.http' ||
    die "could not create the http handler"

# memory_of PID: "TOP_USED GRAND_TOTAL_USED" from the server log, after asking
# the process to log its memory contexts.
memory_of() {
    local before
    before=$(grep -c "\[$1\] .*Grand total:" "$SERVER_LOG")
    sql "$db" "SELECT pg_log_backend_memory_contexts($1)" >/dev/null || return 1
    wait_until 10 bash -c "(( \$(grep -c '\[$1\] .*Grand total:' '$SERVER_LOG') > $before ))" || return 1
    local top total
    top=$(grep "\[$1\] .*level: 0; TopMemoryContext:" "$SERVER_LOG" | tail -n 1 |
        sed -E 's/.* ([0-9]+) used.*/\1/')
    total=$(grep "\[$1\] .*Grand total:" "$SERVER_LOG" | tail -n 1 | sed -E 's/.* ([0-9]+) used.*/\1/')
    echo "$top $total"
}

delivered_of() { handler_stat "$db" "$1" delivered; }
delivered_is() { [[ "$(delivered_of "$1")" == "$2" ]]; }

# publish TOPIC N: N events in transactions of 100.
publish() {
    local i
    for ((i = 0; i < $2 / 100; i++)); do
        sql "$db" "SELECT count(relay_publish('$1', jsonb_build_object('n', g), key => 'k' || (g % 50)))
                     FROM generate_series(1, 100) g" >/dev/null || return 1
    done
}

# grown NAME BEFORE AFTER: TopMemoryContext and the grand total grew by less than the bounds.
grown() {
    local name=$1 t0 g0 t1 g1
    read -r t0 g0 <<<"$2"
    read -r t1 g1 <<<"$3"
    log "$name: TopMemoryContext used $t0 -> $t1 bytes, all contexts $g0 -> $g1 bytes"
    check "$name: TopMemoryContext grew by less than $TOP_BOUND bytes ($t0 -> $t1)" \
        test $((t1 - t0)) -lt "$TOP_BOUND"
    check "$name: all contexts grew by less than $TOTAL_BOUND bytes ($g0 -> $g1)" \
        test $((g1 - g0)) -lt "$TOTAL_BOUND"
}

# ================================================================ (1) http
log "(1) warm-up: 500 webhooks"
publish mem.http 500 || die "publish failed"
check "(1) the warm-up is delivered" wait_until 60 delivered_is hook 500
sleep 1
m0=$(memory_of "$pid") || die "could not read the dispatcher's memory"
log "(1) 3,000 webhooks, then 3 s idle"
publish mem.http 3000 || die "publish failed"
check "(1) 3,000 more are delivered" wait_until 120 delivered_is hook 3500
sleep 3
m1=$(memory_of "$pid") || die "could not read the dispatcher's memory"
grown "(1) http" "$m0" "$m1"

# ================================================================ (2) notify + pull beside http
log "(2) notify (fire) and pull handlers beside the http one"
sql "$db" "SELECT relay_create_handler('bell', 'notify', 'mem_bell')" \
    "SELECT relay_route('mem.notify', 'bell')" \
    "SELECT relay_create_handler('box', 'pull')" \
    "SELECT relay_route('mem.pull', 'box')" >/dev/null || die "could not create handlers"
publish mem.notify 300 || die "publish failed"
check "(2) the notify warm-up is delivered" wait_until 60 delivered_is bell 300
sleep 1
m2=$(memory_of "$pid") || die "could not read the dispatcher's memory"
for round in 1 2 3; do
    publish mem.notify 500 || die "publish failed"
    publish mem.http 500 || die "publish failed"
    publish mem.pull 200 || die "publish failed"
    sql "$db" "SELECT relay_ack(array_agg(id)) FROM relay_claim('box', 200, per_key => 100)" >/dev/null ||
        die "claim/ack failed"
done
check "(2) the notify deliveries are delivered" wait_until 60 delivered_is bell 1800
check "(2) the webhooks are delivered" wait_until 120 delivered_is hook 5000
sleep 3
m3=$(memory_of "$pid") || die "could not read the dispatcher's memory"
grown "(2) notify + http + pull" "$m2" "$m3"
check_eq "(2) the same dispatcher served it all" "$pid" "$(dispatcher_pids "$db" | head -n 1)"
finish
