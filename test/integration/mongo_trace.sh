#!/usr/bin/env bash
# W3C Trace Context in relaybus-mongo (docs/tracing.md, docs/mongo.md "The
# outbox document"): the outbox document's headers.traceparent and
# headers.tracestate, checked by the core's validator as the sequencer turns
# the document into deliveries (a malformed value left out, with a warning in
# the log; the event delivered), reach a real receiver through FerretDB as a
# new span per attempt (the first answered 500, the retry 200): the
# publisher's trace-id and flags, a parent-id of their own, the tracestate
# unchanged; an event without trace context gets none. Ignores the
# PostgreSQL cluster. Prints "N passed, N failed".
SUITE=mongo_trace
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"
declare -A R
TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
DB=t_trace
"$BIN" init --database $DB >/dev/null
"$BIN" handler create th http "$HOOK/th" --options '{"backoff_base": "100ms"}' --database $DB >/dev/null
"$BIN" route 'tr.#' th --database $DB
"$BIN" handler create tp pull --database $DB >/dev/null
"$BIN" route 'tr.#' tp --database $DB
TOKEN=tok-0123456789abcdef
control /th '[{"status": 500, "match": "\"key\":\"k1\""}]'
"$BIN" publish tr.a '{"n":1}' --key k1 --headers "{\"traceparent\":\"$TP\",\"tracestate\":\"congo=t61rcWkgMzE\"}" \
    --database $DB >/dev/null
"$BIN" publish tr.a '{"n":2}' --key k2 --database $DB >/dev/null
"$BIN" publish tr.a '{"n":3}' --key k3 --headers '{"traceparent":"00-zz","tracestate":"a=1","x":"y"}' \
    --database $DB >/dev/null
"$BIN" publish tr.a '{"n":4}' --key k4 --headers "{\"traceparent\":\"$TP\",\"tracestate\":\"A=1\"}" \
    --database $DB >/dev/null
start_instance i1 $DB --api-token $TOKEN
wait_until 60 has_requests /th 5 || fail "the receiver got $(count_path /th) of 5 requests" "$(tail -5 "$TMP/i1.err")"
curl -s "$HOOK/_requests" >"$TMP/requests.json"
while IFS= read -r line; do R[${line%%=*}]=${line#*=}; done < <($PY - "$TMP/requests.json" "$TP" <<'PY'
import json, sys
reqs, tp = json.load(open(sys.argv[1])), sys.argv[2]
by_n = {}
for r in reqs:
    if r["path"] == "/th":
        by_n.setdefault(json.loads(r["body"])["payload"]["n"], []).append(r)
a = by_n.get(1, [])
tps = [r["headers"].get("traceparent", "") for r in a]
print(f"attempts={len(a)}")
print(f"same_trace={int(bool(tps) and all(t[:36] == tp[:36] and t[52:] == tp[52:] for t in tps))}")
print(f"new_spans={int(len(set(t[36:52] for t in tps)) == len(tps) and tp[36:52] not in [t[36:52] for t in tps])}")
print(f"tracestate={int(bool(a) and all(r['headers'].get('tracestate') == 'congo=t61rcWkgMzE' for r in a))}")
print(f"untraced={int('traceparent' not in by_n[2][0]['headers'])}")
h3 = json.loads(by_n[3][0]["body"])["headers"]
print(f"malformed={int('traceparent' not in by_n[3][0]['headers'] and h3 == {'x': 'y'})}")
h4 = by_n[4][0]["headers"]
print(f"bad_state={int(h4.get('traceparent', '')[:36] == tp[:36] and 'tracestate' not in h4)}")
PY
)
check_eq "the traced event: tried twice (500, then 200)" 2 "${R[attempts]}"
check_eq "every attempt carries the publisher's trace-id and flags" 1 "${R[same_trace]}"
check_eq "each attempt is a new span (a parent-id of its own)" 1 "${R[new_spans]}"
check_eq "the stored tracestate goes along" 1 "${R[tracestate]}"
check_eq "an event without trace context carries none" 1 "${R[untraced]}"
check_eq "a malformed traceparent is left out with its tracestate, the event delivered" 1 "${R[malformed]}"
check_eq "a malformed tracestate is left out, the traceparent kept" 1 "${R[bad_state]}"
check_eq "the sequencer logged a warning for each" 2 \
    "$(grep -c '"msg":"ignoring a malformed \(traceparent\|tracestate\) in an outbox document' "$TMP/i1.err")"
wait_metrics_addr i1 || fail "no metrics address in the log"
check_eq "... and counted them (/metrics)" 2 "$(metric i1 relaybus_mongo_trace_context_ignored_total)"
curl -s -X POST -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' --data '{"max": 10}' \
    "http://$(metrics_addr i1)/v1/handlers/tp/claim" >"$TMP/claim.json"
check_eq "a pull claim: a traceparent of the event's trace with a span of its own; none without trace context" \
    "1 1 1" "$($PY - "$TMP/claim.json" "$TP" <<'PY'
import json, sys
ds, tp = json.load(open(sys.argv[1]))["deliveries"], sys.argv[2]
by_n = {d["payload"]["n"]: d for d in ds}
t = by_n[1].get("traceparent", "")
print(int(t[:36] == tp[:36] and t[52:] == tp[52:] and t[36:52] != tp[36:52]), int("traceparent" not in by_n[2]),
      int("traceparent" not in by_n[3]))
PY
)"
finish
