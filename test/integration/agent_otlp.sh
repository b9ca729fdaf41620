#!/usr/bin/env bash
# Spans per delivery attempt from relaybus-agent (docs/tracing.md, "Spans";
# --otlp-endpoint) on the managed SQL edition, to a real OpenTelemetry
# Collector (test/otelcol): the traced event's two attempts (500, then 200)
# as two spans of the publisher's trace, each with the span id the receiver
# saw, none for an untraced event; /metrics counts
# relaybus_agent_spans_exported_total; the collector stopped, deliveries go
# on and relaybus_agent_spans_dropped_total rises; back, spans arrive again.
export PGHOST=${PGHOST:-/nonexistent} PGPORT=${PGPORT:-1}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/managed_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/otel_lib.sh"
trap 'stop_bare_cluster; cleanup' EXIT
trap 'stop_bare_cluster; cleanup; echo "$TEST_NAME: interrupted"; echo "$PASSED passed, $((FAILED + 1)) failed"; exit 1' INT TERM
DB=otlpdb
OWNER=relay_owner
TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
otel_build || die "could not build the collector (test/otelcol/build.sh)"
otel_pick_port
otel_start c1 || die "the collector did not start"
agent_database "$OWNER" "$DB"
own() { psql_q -U "$OWNER" -d "$DB" "$@"; }

receiver_at r
own -c "SELECT relay_create_handler('wh', 'http', '$URL/wh', '{\"backoff_base\": \"100ms\"}')" \
    -c "SELECT relay_route('ot.#', 'wh')" >/dev/null || die "handlers"
recv_plan "$RECV_PORT" /wh '[{"status": 500, "match": "\"n\": 1"}]'

bad_endpoint=$("$RELAYBUS_ROOT/relaybus-agent" --database x --otlp-endpoint localhost:4318 2>&1)
bad_rc=$?
check "a bad --otlp-endpoint is a usage error (exit 2) that says why" \
    test "$bad_rc" -eq 2 -a -n "$(grep 'otlp-endpoint: an OTLP endpoint is an http' <<<"$bad_endpoint")"

"$RELAYBUS_ROOT/relaybus-agent" --database "host=$PGHOST port=$PGPORT dbname=$DB user=agent_login" --http-allowlist 127.0.0.1 \
    --poll-interval 200ms --metrics-addr 127.0.0.1:0 --otlp-endpoint "$OTEL_ENDPOINT" 2>"$TMP/agent.log" &
bg_track $!
metric() {
    local port
    port=$(grep -o '"port":[0-9]*' "$TMP/agent.log" | head -1 | cut -d: -f2)
    [[ -n "$port" ]] && curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 == m { print $2 }'
}
metric_at_least() { local v; v=$(metric "$1"); [[ -n "$v" ]] && ((v >= $2)); }

own -c "SELECT relay_publish('ot.a', '{\"n\": 1}', 'k1', '{\"traceparent\": \"$TP\"}')" \
    -c "SELECT relay_publish('ot.a', '{\"n\": 2}', 'k2')" >/dev/null || die "publish"
check "the receiver gets both events (the traced one twice)" wait_requests "$LOG" /wh 3 60
check "the collector's file shows the 2 attempts' spans" wait_until 30 otel_has_spans 2 "$TMP/c1.spans.json"
check "/metrics: relaybus_agent_spans_exported_total 2" wait_until 10 metric_at_least relaybus_agent_spans_exported_total 2
sleep 1.5  # a third span (there must be none) would come within the batch delay
otel_spans "$TMP/c1.spans.json" >"$TMP/c1.spans"
otel_seen_http "$LOG" /wh >"$TMP/seen"
otel_check_attempts "$TMP/c1.spans" "$TMP/seen" "$TP" agent wh

otel_stop
t0=$(date +%s%N)
own -c "SELECT relay_publish('ot.a', '{\"n\": 3}', 'k3', '{\"traceparent\": \"$TP\"}')" >/dev/null || die "publish"
check "with the collector down, the traced event is delivered" wait_requests "$LOG" /wh 4 30
down_ms=$((($(date +%s%N) - t0) / 1000000))
log "delivered with the collector down in $down_ms ms"
check "and on time (within 10 s)" test "$down_ms" -lt 10000
check "/metrics: relaybus_agent_spans_dropped_total rises" wait_until 30 metric_at_least relaybus_agent_spans_dropped_total 1
check "the agent's log says the export failed" grep -q '"span export failed' "$TMP/agent.log"

otel_start c2 || die "the collector did not start again"
own -c "SELECT relay_publish('ot.a', '{\"n\": 4}', 'k4', '{\"traceparent\": \"$TP\"}')" >/dev/null || die "publish"
check "the collector back: the next span arrives" wait_until 30 otel_has_spans 1 "$TMP/c2.spans.json"

finish
