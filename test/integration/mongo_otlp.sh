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
while IFS= read -r line; do R[${line%%=*}]=${line#*=}; done < <($PY - "$TMP/requests.json" "$TMP/c1.spans" "$TP" <<'PY'
import json, sys
reqs, tp = json.load(open(sys.argv[1])), sys.argv[3]
spans = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
seen = [r["headers"].get("traceparent", "") for r in reqs
        if r["path"] == "/th" and json.loads(r["body"])["payload"]["n"] == 1]
by_attempt = {int(s["attrs"]["relaybus.attempt"]): s for s in spans}
print(f"spans={len(spans)}")
print(f"link={int(sorted(s['spanId'] for s in spans) == sorted(t[36:52] for t in seen) and all(s['traceId'] == tp[3:35] and s['parentSpanId'] == tp[36:52] for s in spans))}")
print(f"statuses={int(by_attempt.get(1, {}).get('attrs', {}).get('http.response.status_code') == '500' and by_attempt.get(2, {}).get('attrs', {}).get('relaybus.outcome') == 'delivered')}")
print(f"edition={int(all(s['resource'].get('relaybus.edition') == 'mongo' and s['attrs'].get('relaybus.handler') == 'th' for s in spans))}")
PY
)
check_eq "two spans: one per attempt of the traced event, none for the untraced one" 2 "${R[spans]}"
check_eq "in the publisher's trace, child of its span, span ids the receiver saw" 1 "${R[link]}"
check_eq "attempt 1 HTTP 500, attempt 2 delivered; resource relaybus.edition mongo, handler th" 1 \
    "$((R[statuses] && R[edition]))"
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
