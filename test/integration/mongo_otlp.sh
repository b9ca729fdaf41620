#!/usr/bin/env bash
# Spans per delivery attempt from relaybus-mongo (docs/tracing.md, "Spans";
# the otlp_endpoint setting) to a real OpenTelemetry Collector (test/otelcol),
# through FerretDB: an outbox event with headers.traceparent, answered 500
# then 200 by the real receiver, shows as two spans of the publisher's trace
# whose span ids are the traceparents the receiver saw; none for an untraced
# event; /metrics relaybus_mongo_spans_exported_total; the collector stopped,
# the next event is delivered all the same and
# relaybus_mongo_spans_dropped_total rises. Ignores the PostgreSQL cluster.
SUITE=mongo_otlp
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/otel_lib.sh"
declare -A R
TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
DB=t_otlp
otel_build || die "could not build the collector (test/otelcol/build.sh)"
otel_pick_port
otel_start c1 || die "the collector did not start"
"$BIN" init --database $DB >/dev/null
"$BIN" handler create th http "$HOOK/th" --options '{"backoff_base": "100ms"}' --database $DB >/dev/null
"$BIN" route 'tr.#' th --database $DB
control /th '[{"status": 500, "match": "\"key\":\"k1\""}]'
"$BIN" publish tr.a '{"n":1}' --key k1 --headers "{\"traceparent\":\"$TP\"}" --database $DB >/dev/null
"$BIN" publish tr.a '{"n":2}' --key k2 --database $DB >/dev/null
start_instance i1 $DB --otlp-endpoint "$OTEL_ENDPOINT"
wait_until 60 has_requests /th 3 || fail "the receiver got $(count_path /th) of 3 requests" "$(tail -5 "$TMP/i1.err")"
wait_until 30 otel_has_spans 2 "$TMP/c1.spans.json" || fail "the collector got no 2 spans" "$(tail -5 "$TMP/c1.otelcol.log")"
sleep 1.5  # a third span (there must be none) would come within the batch delay
curl -s "$HOOK/_requests" >"$TMP/requests.json"
otel_spans "$TMP/c1.spans.json" >"$TMP/c1.spans"
$PY -c '
import json, sys
for r in json.load(open(sys.argv[1])):
    if r["path"] == "/th" and json.loads(r["body"])["payload"]["n"] == 1:
        print(r["headers"]["traceparent"])' "$TMP/requests.json" >"$TMP/seen"
otel_check_attempts "$TMP/c1.spans" "$TMP/seen" "$TP" mongo th
wait_metrics_addr i1 || fail "no metrics address in the log"
check_eq "/metrics: relaybus_mongo_spans_exported_total" 2 "$(metric i1 relaybus_mongo_spans_exported_total)"

otel_stop
"$BIN" publish tr.a '{"n":3}' --key k3 --headers "{\"traceparent\":\"$TP\"}" --database $DB >/dev/null
wait_until 30 has_requests /th 4 || fail "with the collector down, the traced event was not delivered"
dropped() { (($(metric i1 relaybus_mongo_spans_dropped_total) >= 1)); }
wait_until 30 dropped || fail "relaybus_mongo_spans_dropped_total did not rise"
check_eq "with the collector down: delivered, its span dropped and counted" 1 "$(dropped && echo 1)"
check_eq "the sidecar's log says the export failed" 1 "$(grep -c '"msg":"span export failed' "$TMP/i1.err")"
finish
