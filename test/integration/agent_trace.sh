#!/usr/bin/env bash
# W3C Trace Context in the managed SQL edition (docs/tracing.md,
# docs/managed.md) on a cluster without any relaybus library, delivered by
# relaybus-agent: relay_publish records the trace context from headers, SET
# LOCAL relaybus.traceparent or a sqlcommenter comment (current_query()); a
# malformed value is a WARNING (01000), the event still published; a real
# http receiver sees every attempt as a new span of the publisher's trace
# (the first answered 500, the retry 200); the agent's NOTIFY carries a
# traceparent field; relay_claim returns one.
export PGHOST=${PGHOST:-/nonexistent} PGPORT=${PGPORT:-1}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/managed_lib.sh"
managed_traps
DB=tracedb
OWNER=relay_owner
TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
agent_database "$OWNER" "$DB"
own() { psql_q -U "$OWNER" -d "$DB" "$@"; }

receiver_at r
SECRET=$(new_secret)
own -c "SELECT relay_create_handler('wh', 'http', '$URL/wh', '{\"secret\": \"$SECRET\", \"backoff_base\": \"100ms\"}')" \
    -c "SELECT relay_route('tr.#', 'wh')" \
    -c "SELECT relay_create_handler('nt', 'notify', 'tr_channel')" -c "SELECT relay_route('tr.#', 'nt')" \
    -c "SELECT relay_create_handler('pl', 'pull')" -c "SELECT relay_route('tr.#', 'pl')" >/dev/null || die "handlers"
recv_plan "$RECV_PORT" /wh '[{"status": 500, "match": "\"n\": 1"}]'

psql -X -q -At -v ON_ERROR_STOP=1 -U "$OWNER" -d "$DB" >"$TMP/publish.out" 2>"$TMP/publish.err" <<SQL ||
\set VERBOSITY verbose
SELECT relay_publish('tr.a', '{"n": 1}', 'k1', '{"traceparent": "$TP", "tracestate": "congo=t61rcWkgMzE"}');
BEGIN;
SET LOCAL relaybus.traceparent = '00-11111111111111111111111111111111-2222222222222222-00';
SET LOCAL relaybus.tracestate = 'v=1';
SELECT relay_publish('tr.a', '{"n": 2}', 'k2');
COMMIT;
SELECT relay_publish('tr.a', '{"n": 3}', 'k3') /*traceparent='00-33333333333333333333333333333333-4444444444444444-01',tracestate='a%3D1'*/;
SELECT relay_publish('tr.a', '{"n": 4}', 'k4');
SELECT relay_publish('tr.a', '{"n": 5}', 'k5', '{"traceparent": "00-zz"}');
SELECT relay_publish_batch('tr.b', ARRAY['{"n": 6}']::jsonb[]) /*traceparent='00-66666666666666666666666666666666-7777777777777777-01'*/;
SQL
    die "could not publish: $(cat "$TMP/publish.err")"
check "a malformed traceparent is a WARNING with SQLSTATE 01000 and its message" \
    grep -q 'WARNING:  01000: ignoring a malformed traceparent from headers' "$TMP/publish.err"
check_eq "and every event is published" 6 "$(wc -l <"$TMP/publish.out")"
check_eq "the recorded trace context: headers, SET LOCAL, sqlcommenter (URL-decoded), none, none, batch" \
    "1|$TP|congo=t61rcWkgMzE
2|00-11111111111111111111111111111111-2222222222222222-00|v=1
3|00-33333333333333333333333333333333-4444444444444444-01|a=1
4||
5||
6|00-66666666666666666666666666666666-7777777777777777-01|" \
    "$(own -c "SELECT payload->>'n', headers->>'traceparent', headers->>'tracestate' FROM relay.deliveries d
                JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'pl' ORDER BY payload->>'n'")"
check_eq "relay_claim: a traceparent of the stored trace with a span of its own; NULL without one" \
    "1|t|t
2|t|t
4|t|f" \
    "$(own -c "SELECT payload->>'n', traceparent IS NULL OR (substr(traceparent, 1, 36) = substr(headers->>'traceparent', 1, 36)
                      AND right(traceparent, 2) = right(headers->>'traceparent', 2)
                      AND substr(traceparent, 37, 16) <> substr(headers->>'traceparent', 37, 16)),
                      traceparent IS NOT NULL
                 FROM relay_claim('pl', 10) WHERE payload->>'n' IN ('1', '2', '4') ORDER BY 1")"

start_client nt "$DB" tr_channel || die "listen_client did not start"
"$RELAYBUS_ROOT/relaybus-agent" --database "host=$PGHOST port=$PGPORT dbname=$DB user=agent_login" --http-allowlist 127.0.0.1 \
    --poll-interval 200ms 2>"$TMP/agent.log" &
bg_track $!
check "the receiver gets all 6 events (one of them twice)" wait_requests "$LOG" /wh 7 60
check "the LISTEN client gets all 6" wait_lines "$TMP/nt.out" 6 30

py_facts http "$LOG" "$TP" <<'PY'
import json, sys
from http_log import records
log, tp = sys.argv[1:3]
by_n = {}
for r in records(log, "/wh"):
    by_n.setdefault(r["env"]["payload"]["n"], []).append(r)
a = by_n[1]
tps = [r["headers"].get("traceparent", "") for r in a]
d = {"attempts_1": len(a)}
d["same_trace"] = all(t[:36] == tp[:36] and t[52:] == tp[52:] for t in tps)
d["new_span_each"] = len(set(t[36:52] for t in tps)) == len(tps) and tp[36:52] not in [t[36:52] for t in tps]
d["tracestate"] = all(r["headers"].get("tracestate") == "congo=t61rcWkgMzE" for r in a)
d["by_setting"] = by_n[2][0]["headers"].get("traceparent", "")[:35] == "00-11111111111111111111111111111111"
d["untraced"] = "traceparent" not in by_n[4][0]["headers"] and "traceparent" not in by_n[5][0]["headers"]
for k, v in d.items():
    print(f"{k}={int(v) if isinstance(v, bool) else v}")
PY
check_eq "http: the traced event was tried twice (500, then 200)" 2 "${R[attempts_1]}"
check_eq "http: every attempt carries the publisher's trace-id and flags" 1 "${R[same_trace]}"
check_eq "http: each attempt is a new span" 1 "${R[new_span_each]}"
check_eq "http: the stored tracestate goes along" 1 "${R[tracestate]}"
check_eq "http: SET LOCAL's trace context arrives; none for untraced events" 1 "$((R[by_setting] && R[untraced]))"

py_facts notify "$TMP/nt.out" "$TP" <<'PY'
import json, sys
path, tp = sys.argv[1:3]
by_n = {}
for line in open(path):
    m = json.loads(line.split("\t", 1)[1])
    by_n[m["payload"]["n"]] = (m, line.split("\t", 1)[1].rstrip("\n"))
t = by_n[1][0].get("traceparent", "")
print(f"field={int(t[:36] == tp[:36] and t[52:] == tp[52:] and t[36:52] != tp[36:52] and len(t) == 55)}")
print(f"last={int(list(by_n[1][0].keys())[-1] == 'traceparent')}")
print(f"none={int('traceparent' not in by_n[4][0])}")
PY
check_eq "notify: a traced event's payload has a traceparent field, a new span, after the object's fields" 1 \
    "$((R[field] && R[last]))"
check_eq "notify: none for an untraced event" 1 "${R[none]}"

finish
