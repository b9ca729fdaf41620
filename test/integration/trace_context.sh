#!/usr/bin/env bash
# W3C Trace Context through the bus (docs/tracing.md) with real parts: an
# event published with a traceparent (in headers, by SET LOCAL, by a
# sqlcommenter comment) reaches a real http receiver (signed; the first
# attempt answered 500, the retry 200), a real Kafka broker (read back by
# kcat) and a real LISTEN client, each attempt a new span of the publisher's
# trace: same trace-id and flags, a parent-id of its own, the stored
# tracestate; an event without trace context goes out without one, its
# NOTIFY payload byte for byte as before. A malformed value is a WARNING
# (SQLSTATE 01000) and the event is still delivered.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
kafka_pick_port
kafka_start >"$TMP/kafka-start.log" 2>&1 &
KAFKA_STARTER=$!
build_client || die "could not build the LISTEN client"

http_test_db trace
SECRET=$(new_secret)
http_handler "$db" wh "$URL/wh" "{\"secret\": \"$SECRET\", \"backoff_base\": \"100ms\"}" 'tr.#'
recv_plan "$RECV_PORT" /wh '[{"status": 500, "match": "\"n\": 1"}]'
notify_handler "$db" nt tr_channel '{}' 'tr.#'
sql "$db" "SELECT relay_pause_handler('nt')" >/dev/null
wait "$KAFKA_STARTER" || die "the broker did not start: $(tail -5 "$TMP/kafka-start.log")"
kafka_handler "$db" kf tr-topic '{"backoff_base": "100ms"}' 'tr.#'

# n=1 by headers (with a tracestate), n=2 by SET LOCAL, n=3 by a sqlcommenter
# comment, n=4 without trace context, n=5 with a malformed one.
psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" >"$TMP/publish.out" 2>"$TMP/publish.err" <<SQL || die "could not publish: $(cat "$TMP/publish.err")"
\set VERBOSITY verbose
SELECT relay_publish('tr.a', '{"n": 1}', 'k1', '{"traceparent": "$TP", "tracestate": "congo=t61rcWkgMzE"}');
BEGIN;
SET LOCAL relaybus.traceparent = '00-11111111111111111111111111111111-2222222222222222-00';
SELECT relay_publish('tr.a', '{"n": 2}', 'k2');
COMMIT;
SELECT relay_publish('tr.a', '{"n": 3}', 'k3') /*traceparent='00-33333333333333333333333333333333-4444444444444444-01'*/;
SELECT relay_publish('tr.a', '{"n": 4}', 'k4');
SELECT relay_publish('tr.a', '{"n": 5}', 'k5', '{"traceparent": "00-zz"}');
SQL
check "a malformed traceparent is a WARNING with SQLSTATE 01000 and its message" \
    grep -q 'WARNING:  01000: ignoring a malformed traceparent from headers' "$TMP/publish.err"
check_eq "and the event is published all the same" 5 "$(wc -l <"$TMP/publish.out")"

for h in wh kf; do check "handler $h delivers everything" wait_until 90 none_pending "$db" $h; done
if ! none_pending "$db" kf; then kafka_diag "$db" kf tr-topic; fi

py_facts http "$LOG" "$SECRET" "$TP" <<'PY'
import json, sys
from http_log import records
log, secret, tp = sys.argv[1:4]
by_n = {}
for r in records(log, "/wh"):
    by_n.setdefault(r["env"]["payload"]["n"], []).append(r)
a = by_n[1]
d = {"attempts_1": len(a)}
tps = [r["headers"].get("traceparent", "") for r in a]
d["same_trace"] = all(t[:36] == tp[:36] and t[52:] == tp[52:] for t in tps)
d["new_span_each"] = len(set(t[36:52] for t in tps)) == len(tps) and tp[36:52] not in [t[36:52] for t in tps]
d["tracestate"] = all(r["headers"].get("tracestate") == "congo=t61rcWkgMzE" for r in a)
d["signed"] = all("webhook-signature" in r["headers"] for r in a)
d["bodies_same"] = len(set(json.dumps(r["env"]["headers"]) for r in a)) == 1
d["by_setting"] = by_n[2][0]["headers"].get("traceparent", "")[:35] == "00-11111111111111111111111111111111"
d["by_setting_flags"] = by_n[2][0]["headers"].get("traceparent", "")[53:] == "00"
d["by_comment"] = by_n[3][0]["headers"].get("traceparent", "")[:35] == "00-33333333333333333333333333333333"
d["untraced"] = "traceparent" not in by_n[4][0]["headers"] and "tracestate" not in by_n[4][0]["headers"]
d["malformed_untraced"] = "traceparent" not in by_n[5][0]["headers"]
for k, v in d.items():
    print(f"{k}={int(v) if isinstance(v, bool) else v}")
PY
check_eq "http: the event published with headers was tried twice (500, then 200)" 2 "${R[attempts_1]}"
check_eq "http: every attempt carries the publisher's trace-id and flags" 1 "${R[same_trace]}"
check_eq "http: each attempt is a new span (a parent-id of its own, not the publisher's)" 1 "${R[new_span_each]}"
check_eq "http: the stored tracestate goes along unchanged" 1 "${R[tracestate]}"
check_eq "http: signed requests, their bodies unchanged between attempts" 1 "$((R[signed] && R[bodies_same]))"
check_eq "http: SET LOCAL relaybus.traceparent reaches the receiver (flags 00 kept)" 1 "$((R[by_setting] && R[by_setting_flags]))"
check_eq "http: a sqlcommenter comment reaches the receiver" 1 "${R[by_comment]}"
check_eq "http: an event without trace context carries none" 1 "$((R[untraced] && R[malformed_untraced]))"

check "kafka: the 5 messages are in the topic" kafka_has tr-topic 5
kafka_consume tr-topic "$TMP/kafka.json" || die "kcat could not read tr-topic"
py_facts kafka "$TMP/kafka.json" "$TP" <<'PY'
import json, sys
path, tp = sys.argv[1:3]
by_n = {}
for line in open(path):
    if line.strip():
        m = json.loads(line)
        h = m.get("headers") or []
        hs = list(zip(h[0::2], h[1::2]))
        by_n[json.loads(m["payload"])["payload"]["n"] if "payload" in json.loads(m["payload"]) else json.loads(m["payload"])["n"]] = hs
one = [v for k, v in by_n[1] if k == "traceparent"]
print(f"one_traceparent={int(len(one) == 1)}")
print(f"same_trace={int(bool(one) and one[0][:36] == tp[:36] and one[0][52:] == tp[52:] and one[0][36:52] != tp[36:52])}")
print(f"tracestate={int([v for k, v in by_n[1] if k == 'tracestate'] == ['congo=t61rcWkgMzE'])}")
print(f"untraced={int(not any(k in ('traceparent', 'tracestate') for k, v in by_n[4]))}")
PY
check_eq "kafka: one traceparent header, a new span of the publisher's trace" 1 "$((R[one_traceparent] && R[same_trace]))"
check_eq "kafka: the tracestate header" 1 "${R[tracestate]}"
check_eq "kafka: no trace headers for an event without trace context" 1 "${R[untraced]}"

# NOTIFY's size limit counts the traceparent field: n=6 (traced) and n=7
# (untraced) with payloads padded so that the message without the field is 40
# bytes under relaybus.notify_payload_limit (7900): n=6 goes by reference,
# n=7 inline.
sql "$db" "SELECT relay_publish('tr.a', '{\"n\": 6}', 'k6', '{\"traceparent\": \"$TP\"}')" \
    "SELECT relay_publish('tr.a', '{\"n\": 7}', 'k7')" >/dev/null
sql "$db" "UPDATE relay.deliveries d SET payload = jsonb_build_object('n', d.payload->'n', 'pad', repeat('x',
               7860 - length(jsonb_build_object('id', d.id, 'event_id', d.event_id, 'topic', d.topic, 'key', d.key,
                   'seq', d.seq, 'attempt', d.attempt + 1, 'headers', d.headers,
                   'payload', jsonb_build_object('n', d.payload->'n', 'pad', ''))::text)))
             FROM relay.handlers h WHERE h.id = d.handler_id AND h.name = 'nt' AND d.payload->>'n' IN ('6', '7')" \
    >/dev/null
# NOTIFY: the expected payloads of the untraced events, as before this change.
sql "$db" "SELECT jsonb_build_object('id', d.id, 'event_id', d.event_id, 'topic', d.topic, 'key', d.key, 'seq', d.seq,
                  'attempt', d.attempt + 1, 'headers', d.headers, 'payload', d.payload)::text
             FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
            WHERE h.name = 'nt' AND d.payload->>'n' IN ('4', '5', '7') ORDER BY d.id" >"$TMP/untraced.expected"
start_client nt "$db" tr_channel || die "the LISTEN client did not start"
sql "$db" "SELECT relay_resume_handler('nt')" >/dev/null
check "notify: all 7 arrive" wait_lines "$TMP/nt.out" 7 30
cut -f2 "$TMP/nt.out" >"$TMP/nt.payloads"
grep -E '"n": (4|5)\}|"n": 7, ' "$TMP/nt.payloads" >"$TMP/untraced.got"
check "notify: payloads of events without trace context are byte for byte as before" \
    cmp "$TMP/untraced.expected" "$TMP/untraced.got"
py_facts notify "$TMP/nt.payloads" "$TP" <<'PY'
import json, sys
path, tp = sys.argv[1:3]
by_n = {}
for line in open(path):
    m = json.loads(line)
    if m.get("ref"):
        m["payload"] = {"n": 6 if "traceparent" in m else -1}
    by_n[m["payload"]["n"]] = m
t = by_n[1].get("traceparent", "")
print(f"limit={int(6 in by_n and by_n[6].get('ref') is True and by_n[6]['traceparent'][:36] == tp[:36] and 7 in by_n)}")
print(f"field={int(t[:36] == tp[:36] and t[52:] == tp[52:] and t[36:52] != tp[36:52] and len(t) == 55)}")
print(f"last={int(list(by_n[1].keys())[-1] == 'traceparent')}")
print(f"setting={int(by_n[2].get('traceparent', '')[:35] == '00-11111111111111111111111111111111')}")
print(f"none={int('traceparent' not in by_n[4])}")
PY
check_eq "notify: a traced event's payload has a traceparent field, a new span of its trace" 1 "${R[field]}"
check_eq "notify: appended after the object's fields" 1 "${R[last]}"
check_eq "notify: the SET LOCAL one too; none for an untraced event" 1 "$((R[setting] && R[none]))"
check_eq "notify: the traceparent counts against the payload limit (by reference, with the field; its untraced twin inline)" \
    1 "${R[limit]}"

finish
