#!/usr/bin/env bash
# Webhook delivery to a real HTTP receiver on loopback (http_receiver.py):
#  (1) outbound safety: without relaybus.http_allowlist a handler to 127.0.0.1
#      (or to localhost) sends nothing and is dead-lettered at once with
#      "not allowed"; with the allow-list the replayed delivery arrives;
#  (2) every delivery arrives: 500 events over 20 keys from 2 concurrent
#      publishers; every event at least once, webhook-id = the envelope's id,
#      per key the seqs in increasing order without duplicates, nothing left,
#      relay.handler_stats counts them (http_2xx, delivered);
#  (3) Standard Webhooks signatures verify with an independent implementation
#      (PyPI standardwebhooks), with one secret and during rotation (two
#      secrets: two signatures, each verifies with its own secret alone); a
#      tampered body, timestamp or id, or the wrong secret, fails;
#  (4) "envelope": false sends exactly the payload's JSON text.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

python3 -c 'import standardwebhooks' 2>/dev/null ||
    die "the PyPI package standardwebhooks is needed (scripts/install-deps.sh installs it)"

FAST='"backoff_base": "100ms", "backoff_max": "1s", "timeout": "5s", "max_attempts": 4'
start_receiver r || die "the receiver did not start"
URL=http://127.0.0.1:$RECV_PORT
LOG=$TMP/r.log
log "receiver on port $RECV_PORT"

# ================================================================ (1) outbound safety
log "(1) outbound safety"
set_allowlist '' || die "could not clear relaybus.http_allowlist"
new_db db http_delivery || die "could not create a database"
check "a dispatcher serves the new database" wait_workers "$db" 1 20
http_handler "$db" guarded "$URL/guard" "{$FAST}" 'hd.guard' || die "could not create handler guarded"
http_handler "$db" guarded-name "http://localhost:$RECV_PORT/guard" "{$FAST}" 'hd.guard' ||
    die "could not create handler guarded-name"
sql "$db" "SELECT relay_publish('hd.guard', '{\"guarded\": true}', 'g')" >/dev/null
check "(1) without the allow-list: the delivery to 127.0.0.1 is dead-lettered" \
    wait_until 20 dead_is "$db" guarded 1
check "(1) without the allow-list: the delivery to localhost is dead-lettered" \
    wait_until 20 dead_is "$db" guarded-name 1
dl=$(sql "$db" "SELECT attempts, coalesce(last_status::text, 'null'), last_error ~ 'not allowed'
                  FROM relay.dead_letters WHERE handler = 'guarded'")
check_eq "(1) dead at once (1 attempt), no HTTP status, the error says 'not allowed'" "1|null|t" "$dl"
log "(1) error: $(sql "$db" "SELECT last_error FROM relay.dead_letters WHERE handler = 'guarded'")"
check_eq "(1) localhost: the error says 'not allowed' too" "t" \
    "$(sql "$db" "SELECT last_error ~ 'not allowed' FROM relay.dead_letters WHERE handler = 'guarded-name'")"
check_eq "(1) the receiver got no request" 0 "$(recv_count "$LOG" /guard)"
check_eq "(1) nothing left pending" "0 0" "$(pending_of "$db" guarded) $(pending_of "$db" guarded-name)"
sql "$db" "SELECT relay_drop_handler('guarded-name', true)" >/dev/null

allow_loopback || die "could not set relaybus.http_allowlist"
check_eq "(1) relay_replay() moves the dead letter back" 1 "$(sql "$db" "SELECT relay_replay('guarded')")"
check "(1) with the allow-list 127.0.0.1: the replayed delivery arrives" wait_requests "$LOG" /guard 1 20
check "(1) ... and is completed (no dead letter, nothing pending)" \
    wait_until 10 bash -c "[[ \$(psql -X -At -d '$db' -c \"SELECT (SELECT count(*) FROM relay.dead_letters WHERE handler = 'guarded')
        + (SELECT count(*) FROM relay.deliveries)\") == 0 ]]"

# ================================================================ (2) every delivery arrives
log "(2) 500 events, 20 keys, 2 publishers"
create_pub_log "$db"
http_handler "$db" bulk "$URL/bulk" "{$FAST, \"headers\": {\"x-relay-test\": \"bulk\"}}" 'hd.bulk' ||
    die "could not create handler bulk"
cat >"$TMP/bulk.sql" <<'EOF'
\set k random(1, 20)
\set r random(1, 1000000000)
INSERT INTO pub_log
SELECT relay_publish('hd.bulk', jsonb_build_object('r', :r, 'c', :client_id), 'k-' || :k), 'k-' || :k;
EOF
pgbench -n -c 2 -j 2 -t 250 -f "$TMP/bulk.sql" "$db" >"$TMP/pgbench.out" 2>&1
check_eq "pgbench (2 clients x 250 publishes) ran without errors" 0 "$?"
published=$(sql "$db" "SELECT count(*) FROM pub_log")
check_eq "(2) 500 events committed" 500 "$published"
check "(2) the receiver gets $published requests" wait_requests "$LOG" /bulk "$published" 60
check "(2) relay.deliveries is empty" wait_until 20 none_pending "$db" bulk
sleep 0.5  # a late duplicate would show up now
dump_pub_log "$db" "$TMP/pub.txt"
# webhook-id: "msg_<system identifier>_<database oid>_<delivery id>" (docs/webhooks.md).
ID_PREFIX=$(sql "$db" "SELECT 'msg_' || system_identifier || '_' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '_' FROM pg_control_system()")
py_facts bulk "$LOG" "$TMP/pub.txt" "$ID_PREFIX" "relaybus/$RELAYBUS_VERSION" <<'EOF'
import sys, datetime, http_log
recs = http_log.records(sys.argv[1], "/bulk")
prefix = sys.argv[3]
def published_ok(text, t):
    # RFC 3339 UTC with milliseconds, no later than the request and not long before it.
    try:
        ts = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return False
    return len(text) == 24 and t - 120 < ts <= t + 1
pub = {}
for line in open(sys.argv[2]):
    eid, _, key = line.rstrip("\n").partition("|")
    pub[int(eid)] = key
ids, events, bad, per_key = set(), set(), 0, {}
order = dups = sig = 0
for r in recs:
    e, h = r["env"], r["headers"]
    ok = (isinstance(e, dict)
          and set(e) == {"id", "event_id", "topic", "key", "seq", "published_at", "attempt", "headers", "payload"}
          and prefix + str(e["id"]) == h.get("webhook-id") and e["topic"] == "hd.bulk" and e["attempt"] == 1
          and published_ok(e["published_at"], r["t"])
          and h.get("content-type") == "application/json" and h.get("user-agent") == sys.argv[4]
          and h.get("x-relay-test") == "bulk" and abs(int(h.get("webhook-timestamp", 0)) - r["t"]) < 60
          and pub.get(e["event_id"]) == e["key"] and isinstance(e["payload"], dict))
    bad += not ok
    sig += "webhook-signature" in h
    if not isinstance(e, dict):
        continue
    ids.add(h.get("webhook-id"))
    events.add(e["event_id"])
    seqs = per_key.setdefault(e["key"], [])
    if seqs and e["seq"] == seqs[-1]:
        dups += 1
    elif seqs and e["seq"] < seqs[-1]:
        order += 1
    seqs.append(e["seq"])
counts = {}
for k in pub.values():
    counts[k] = counts.get(k, 0) + 1
gaps = sum(1 for k, n in counts.items() if sorted(per_key.get(k, [])) != list(range(1, n + 1)))
http_log.facts(dict(requests=len(recs), distinct_ids=len(ids), missing=len(set(pub) - events),
                    extra=len(events - set(pub)), bad=bad, order=order, dups=dups, gaps=gaps,
                    keys=len(per_key), sig=sig))
EOF
check_eq "(2) requests / distinct webhook-ids" "$published $published" "$(r requests) $(r distinct_ids)"
check_eq "(2) every published event was received" 0 "$(r missing)"
check_eq "(2) nothing received that was not published" 0 "$(r extra)"
check_eq "(2) every request is well formed (envelope fields, published_at, webhook-id = prefix + id, content-type, user-agent, custom header, timestamp, key)" \
    0 "$(r bad)"
check_eq "(2) per key: seqs increase in arrival order, no duplicates" "0 0" "$(r order) $(r dups)"
check_eq "(2) per key: the received seqs are exactly 1..n (20 keys)" "0 20" "$(r gaps) $(r keys)"
check_eq "(2) no secret, no webhook-signature header" 0 "$(r sig)"
check_eq "(2) relay.handler_stats: http_2xx, delivered, other codes, pending" \
    "$(r requests)|$published|0|0|0|0" \
    "$(handler_stat "$db" bulk "http_2xx, delivered, http_4xx, http_5xx, http_errors, pending")"

# ================================================================ (3) signatures
log "(3) signatures"
S_OLD=$(new_secret)
S_NEW=$(new_secret)
http_handler "$db" signed "$URL/signed" "{$FAST, \"secret\": \"$S_OLD\"}" 'hd.sig' || die "handler signed"
http_handler "$db" rotating "$URL/rotating" "{$FAST, \"secret\": [\"$S_NEW\", \"$S_OLD\"]}" 'hd.sig' ||
    die "handler rotating"
sql "$db" "SELECT relay_publish('hd.sig', p, 'sig') FROM (VALUES
    ('{\"n\": 1, \"text\": \"plain\"}'::jsonb),
    ('{\"n\": 2, \"text\": \"héllo wörld € 🚀\", \"quote\": \"\\\"q\\\"\", \"bs\": \"a\\\\b\", \"nl\": \"x\\ny\"}'),
    ('{\"n\": 3, \"nested\": {\"list\": [1, 2.5, -3e10, null, true], \"empty\": {}}}'),
    ('{\"n\": 4, \"big\": 123456789012345678901234567890}'),
    ('{\"n\": 5}')) AS v(p)" >/dev/null
check "(3) the 5 events reach the handler with one secret" wait_requests "$LOG" /signed 5 20
check "(3) the 5 events reach the handler with two secrets" wait_requests "$LOG" /rotating 5 20
py_facts sig "$LOG" "$S_OLD" "$S_NEW" <<'EOF'
import sys, http_log
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
log, s_old, s_new = sys.argv[1:4]
old, new = Webhook(s_old), Webhook(s_new)

def verifies(wh, body, headers):
    try:
        wh.verify(body.encode("utf-8"), headers)
        return True
    except WebhookVerificationError:
        return False

f = dict(single_ok=0, single_wrong_secret=0, single_nsigs=0, tampered=0, n_single=0,
         rot_both=0, rot_nsigs=0, rot_first_new_only=0, rot_second_old_only=0, n_rot=0, unicode=0)
for r in http_log.records(log, "/signed"):
    h, body = r["headers"], r["body"]
    f["n_single"] += 1
    f["single_ok"] += verifies(old, body, h)
    f["single_wrong_secret"] += verifies(new, body, h)
    f["single_nsigs"] += len(h["webhook-signature"].split(" ")) == 1
    f["unicode"] += "€ 🚀" in body
    # Tampering with the body, the timestamp or the id breaks the signature.
    t_body = body.replace('"n": ', '"n": 1', 1)
    t_ts = dict(h, **{"webhook-timestamp": str(int(h["webhook-timestamp"]) - 1)})
    t_id = dict(h, **{"webhook-id": h["webhook-id"] + "0"})
    f["tampered"] += verifies(old, t_body, h) + verifies(old, body, t_ts) + verifies(old, body, t_id)
for r in http_log.records(log, "/rotating"):
    h, body = r["headers"], r["body"]
    f["n_rot"] += 1
    sigs = h["webhook-signature"].split(" ")
    f["rot_nsigs"] += len(sigs) == 2 and all(s.startswith("v1,") for s in sigs)
    f["rot_both"] += verifies(old, body, h) and verifies(new, body, h)
    first, second = dict(h, **{"webhook-signature": sigs[0]}), dict(h, **{"webhook-signature": sigs[-1]})
    f["rot_first_new_only"] += verifies(new, body, first) and not verifies(old, body, first)
    f["rot_second_old_only"] += verifies(old, body, second) and not verifies(new, body, second)
http_log.facts(f)
EOF
check_eq "(3) one secret: 5 requests, each with one signature" "5 5" "$(r n_single) $(r single_nsigs)"
check_eq "(3) one secret: every signature verifies with standardwebhooks" 5 "$(r single_ok)"
check_eq "(3) the unicode payload arrived intact (and verified)" 1 "$(r unicode)"
check_eq "(3) ... and none verifies with another secret" 0 "$(r single_wrong_secret)"
check_eq "(3) a tampered body, timestamp or id never verifies" 0 "$(r tampered)"
check_eq "(3) rotation: 5 requests, each with two v1 signatures" "5 5" "$(r n_rot) $(r rot_nsigs)"
check_eq "(3) rotation: each request verifies with the new and with the old secret" 5 "$(r rot_both)"
check_eq "(3) rotation: the first signature is the new secret's alone, the second the old one's" \
    "5 5" "$(r rot_first_new_only) $(r rot_second_old_only)"

# ================================================================ (4) envelope false
log "(4) envelope false"
http_handler "$db" bare "$URL/bare" "{$FAST, \"envelope\": false, \"secret\": \"$S_OLD\"}" 'hd.bare' ||
    die "handler bare"
sql "$db" "CREATE TABLE bare_src (n int PRIMARY KEY, p jsonb NOT NULL)" \
    "INSERT INTO bare_src VALUES
        (1, '{\"a\": [1, 2.5, \"x\"], \"b\": {\"c\": null}, \"long key name\": \"v\"}'),
        (2, '[1, \"two\", {\"three\": 3}]'),
        (3, '\"just a string with ü and \\\"quotes\\\"\"'),
        (4, '42'),
        (5, 'true'),
        (6, '{\"id\": 999, \"payload\": \"looks like an envelope\"}')" \
    "SELECT relay_publish('hd.bare', p, 'bare') FROM bare_src ORDER BY n" >/dev/null
sql "$db" "SELECT p::text FROM bare_src ORDER BY n" >"$TMP/bare.expected"
check "(4) the 6 payloads arrive" wait_requests "$LOG" /bare 6 20
py_facts bare "$LOG" "$TMP/bare.expected" "$S_OLD" <<'EOF'
import json, sys, http_log
from standardwebhooks.webhooks import Webhook
recs = http_log.records(sys.argv[1], "/bare")
expected = open(sys.argv[2], encoding="utf-8").read().rstrip("\n").split("\n")
wh = Webhook(sys.argv[3])
exact = parsed = headers = signed = 0
for r, want in zip(recs, expected):
    exact += r["body"] == want
    parsed += r["env"] == json.loads(want)
    h = r["headers"]
    headers += h.get("content-type") == "application/json" and h.get("webhook-id", "").startswith("msg_")
    try:
        wh.verify(r["body"].encode("utf-8"), h)
        signed += 1
    except Exception:
        pass
http_log.facts(dict(n=len(recs), exact=exact, parsed=parsed, headers=headers, signed=signed,
                    ids=len({r["headers"].get("webhook-id") for r in recs})))
EOF
check_eq "(4) 6 requests with 6 distinct webhook-ids" "6 6" "$(r n) $(r ids)"
check_eq "(4) each body is exactly the payload's JSON text (in key order)" 6 "$(r exact)"
check_eq "(4) ... and parses to the payload" 6 "$(r parsed)"
check_eq "(4) content-type and webhook-id headers are there" 6 "$(r headers)"
check_eq "(4) the bare body is signed too" 6 "$(r signed)"
check "(4) relay.deliveries is empty at the end" wait_until 10 none_pending "$db" bare
check_eq "(4) no dead letters (but the one kept from the dropped handler guarded-name)" 0 \
    "$(sql "$db" "SELECT count(*) FROM relay.dead_letters WHERE handler <> 'guarded-name'")"

finish
