#!/usr/bin/env bash
# Spans per delivery attempt (docs/tracing.md, "Spans") with real parts: a
# real OpenTelemetry Collector (test/otelcol: otlp receiver, file exporter)
# receives the dispatcher's OTLP/HTTP export, a real http receiver answers a
# traced event's first attempt 500 and its retry 200. From the collector's
# file: one span per attempt, the publisher's trace-id, the publisher's span
# as parent, as span id the traceparent the receiver saw on that attempt, the
# handler, attempt, status and outcome; an untraced event makes none. A
# kafka handler's span (real broker, read back by kcat) names the topic, the
# partition and offset the message landed at, and the span id its
# traceparent header carries; a notify handler's span per traced NOTIFY, in
# fire and ack mode, the span id its payload's traceparent carries. A
# collector that never answers does not slow
# deliveries either. The
# collector stopped: deliveries go on as fast, the server log counts the
# spans dropped; the collector back: spans arrive again.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/otel_lib.sh"

TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
kafka_pick_port
kafka_start >"$TMP/kafka-start.log" 2>&1 &
KAFKA_STARTER=$!
otel_build || die "could not build the collector (test/otelcol/build.sh)"
otel_pick_port
otel_start c1 || die "the collector did not start"

http_test_db otlp
http_handler "$db" wh "$URL/wh" '{"backoff_base": "100ms"}' 'ot.#'
recv_plan "$RECV_PORT" /wh '[{"status": 500, "match": "\"n\": 1"}]'
set_conf relaybus.otlp_endpoint "$OTEL_ENDPOINT" || die "could not set relaybus.otlp_endpoint"
check "the setting is in force" wait_until 10 setting_is relaybus.otlp_endpoint "$OTEL_ENDPOINT"
check "a bad endpoint is refused with SQLSTATE 22023" \
    bash -c "psql -X -q -d postgres -v VERBOSITY=verbose -c \"ALTER SYSTEM SET relaybus.otlp_endpoint = 'localhost:4318'\" 2>&1 \
        | grep -q '22023.*invalid value for parameter'"

sql "$db" "SELECT relay_publish('ot.a', '{\"n\": 1}', 'k1', '{\"traceparent\": \"$TP\", \"tracestate\": \"congo=t61rcWkgMzE\"}')" \
    "SELECT relay_publish('ot.a', '{\"n\": 2}', 'k2')" >/dev/null
check "both events are delivered" wait_until 60 none_pending "$db" wh
check "the collector's file shows the 2 attempts' spans" wait_until 30 otel_has_spans 2 "$TMP/c1.spans.json"
sleep 1.5  # a third span (there must be none) would come within the batch delay
otel_spans "$TMP/c1.spans.json" >"$TMP/c1.spans"
otel_seen_http "$LOG" /wh >"$TMP/seen"
otel_check_attempts "$TMP/c1.spans" "$TMP/seen" "$TP" extension wh

# A kafka handler: a PRODUCER span naming where the message landed.
wait "$KAFKA_STARTER" || die "the broker did not start: $(tail -5 "$TMP/kafka-start.log")"
kafka_handler "$db" kf ot-topic '{}' 'kf.#'
sql "$db" "SELECT relay_publish('kf.a', '{\"n\": 10}', 'k10', '{\"traceparent\": \"$TP\"}')" >/dev/null
check "kafka: the traced event is delivered" wait_until 60 none_pending "$db" kf
check "kafka: its span arrives" wait_until 30 otel_has_spans 3 "$TMP/c1.spans.json"
kafka_consume ot-topic "$TMP/kafka.json" || die "kcat could not read ot-topic"
otel_spans "$TMP/c1.spans.json" >"$TMP/c1.spans"
py_facts kafka "$TMP/kafka.json" "$TMP/c1.spans" "$TP" <<'PY'
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
spans = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
tp = sys.argv[3]
k = [s for s in spans if s["attrs"].get("relaybus.handler") == "kf"]
m = msgs[0]
h = dict(zip(m["headers"][0::2], m["headers"][1::2]))
s = k[0] if k else {"attrs": {}}
a = s["attrs"]
print(f"spans={len(k)}")
print(f"kind={int(s.get('kind') in (4, 'SPAN_KIND_PRODUCER') and a.get('messaging.system') == 'kafka' and a.get('messaging.operation.type') == 'send')}")
print(f"where={int(a.get('messaging.destination.name') == 'ot-topic' and a.get('messaging.destination.partition.id') == str(m['partition']) and a.get('messaging.kafka.offset') == str(m['offset']))}")
print(f"link={int(s.get('spanId') == h.get('traceparent', '')[36:52] and s.get('traceId') == tp[3:35] and s.get('parentSpanId') == tp[36:52])}")
PY
check_eq "kafka: one span" 1 "${R[spans]}"
check_eq "kafka: kind PRODUCER, messaging.system kafka, operation send" 1 "${R[kind]}"
check_eq "kafka: the topic, partition and offset kcat read the message at" 1 "${R[where]}"
check_eq "kafka: its span id is the message's traceparent header's, in the publisher's trace" 1 "${R[link]}"

# notify handlers: a PRODUCER span per NOTIFY of a traced event, its span id
# the traceparent the payload carried; fire mode "delivered", ack mode
# "notified" (it waits for relay_ack, which is the consumer's, not a span).
notify_handler "$db" nf ot_fire '{"ack": false}' 'nf.#'
notify_handler "$db" na ot_ack '{"ack": true}' 'na.#'
start_client fire "$db" ot_fire || die "the fire LISTEN client did not start"
start_client acked "$db" ot_ack --ack || die "the ack LISTEN client did not start"
sql "$db" "SELECT relay_publish('nf.a', '{\"n\": 20}', 'k20', '{\"traceparent\": \"$TP\"}')" \
    "SELECT relay_publish('nf.a', '{\"n\": 21}', 'k21')" \
    "SELECT relay_publish('na.a', '{\"n\": 22}', 'k22', '{\"traceparent\": \"$TP\"}')" >/dev/null
check "notify: the fire client got both" wait_lines "$TMP/fire.out" 2 30
check "notify: the ack client got its event and acked it" wait_until 30 none_pending "$db" na
check "notify: the two traced NOTIFYs' spans arrive" wait_until 30 otel_has_spans 5 "$TMP/c1.spans.json"
sleep 1.5  # a span of the untraced one (there must be none) would come within the batch delay
otel_spans "$TMP/c1.spans.json" >"$TMP/c1.spans"
py_facts notify "$TMP/fire.out" "$TMP/acked.out" "$TMP/c1.spans" "$TP" <<'PY'
import json, sys
def payloads(path):
    return [json.loads(l.split("\t")[1]) for l in open(path) if l.strip()]
fire, acked = payloads(sys.argv[1]), payloads(sys.argv[2])
spans = [json.loads(l) for l in open(sys.argv[3]) if l.strip()]
tp = sys.argv[4]
def check(handler, channel, outcome, msgs):
    mine = [s for s in spans if s["attrs"].get("relaybus.handler") == handler]
    traced = [m for m in msgs if "traceparent" in m]
    if len(mine) != 1 or len(traced) != 1:
        return f"{len(mine)} spans, {len(traced)} traced payloads"
    s, a, m = mine[0], mine[0]["attrs"], traced[0]
    ok = (s.get("kind") in (4, "SPAN_KIND_PRODUCER") and a.get("messaging.system") == "postgresql"
          and a.get("messaging.destination.name") == channel and a.get("relaybus.outcome") == outcome
          and a.get("relaybus.handler.kind") == "notify" and a.get("relaybus.delivery.id") == str(m["id"])
          and s.get("spanId") == m["traceparent"][36:52] and s.get("traceId") == tp[3:35]
          and s.get("parentSpanId") == tp[36:52] and not (s.get("status") or {}).get("code"))
    return "ok" if ok else json.dumps(s)
print("fire=" + check("nf", "ot_fire", "delivered", fire))
print("ack=" + check("na", "ot_ack", "notified", acked))
print(f"untraced={sum(1 for m in fire if 'traceparent' not in m)}")
PY
check_eq "notify fire: one span, PRODUCER to the channel, delivered, its span id the payload's traceparent's" ok "${R[fire]}"
check_eq "notify ack mode: one span, notified, its span id the payload's traceparent's" ok "${R[ack]}"
check_eq "notify: the untraced event was sent, without a span" 1 "${R[untraced]}"

# The collector stopped: the next spans fail to go out and are dropped; the
# deliveries are not held back by it.
otel_stop
t0=$(date +%s%N)
for n in 3 4 5; do
    sql "$db" "SELECT relay_publish('ot.a', '{\"n\": $n}', 'k$n', '{\"traceparent\": \"$TP\"}')" >/dev/null
done
check "with the collector down, the 3 traced events are delivered" wait_until 60 none_pending "$db" wh
down_ms=$((($(date +%s%N) - t0) / 1000000))
log "delivered 3 with the collector down in $down_ms ms"
check "and on time (within 10 s, the poll interval being 1 s)" test "$down_ms" -lt 10000
export_failed() { grep -q "span export to $OTEL_ENDPOINT failed: .*" "$SERVER_LOG" && grep -A1 "span export to $OTEL_ENDPOINT failed" "$SERVER_LOG" | grep -Eq 'dropped [1-9]'; }
check "the server log names the failed export and counts dropped spans" wait_until 30 export_failed

# A collector that accepts and never answers (a listener that reads and
# says nothing): each export waits out its 2 s timeout beside the
# deliveries, which go on as fast.
python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(64); held = []
while True:
    c, _ = s.accept(); held.append(c)
' "$OTEL_PORT" 2>"$TMP/blackhole.err" &
HOLE=$!
bg_track $HOLE
wait_until 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$OTEL_PORT" || die "the silent listener did not start"
t0=$(date +%s%N)
for n in 7 8 9; do
    sql "$db" "SELECT relay_publish('ot.a', '{\"n\": $n}', 'k$n', '{\"traceparent\": \"$TP\"}')" >/dev/null
    sleep 0.5
done
check "with a collector that never answers, the 3 traced events are delivered" wait_until 60 none_pending "$db" wh
hang_ms=$((($(date +%s%N) - t0) / 1000000))
log "published 3 (0.5 s apart) and delivered them with a silent collector in $hang_ms ms"
check "and on time (within 10 s)" test "$hang_ms" -lt 10000
kill $HOLE 2>/dev/null
wait $HOLE 2>/dev/null

# The collector back on the same port: spans arrive again.
otel_start c2 || die "the collector did not start again"
sql "$db" "SELECT relay_publish('ot.a', '{\"n\": 6}', 'k6', '{\"traceparent\": \"$TP\"}')" >/dev/null
check "the event published after the collector came back is delivered" wait_until 60 none_pending "$db" wh
check "and its span arrives" wait_until 30 otel_has_spans 1 "$TMP/c2.spans.json"
finish
