#!/usr/bin/env bash
# relaybus-mongo parity with the PostgreSQL side (issue 13, item 3): handler
# create/alter/drop, `run` waiting for the server, pull handlers over the
# sidecar's HTTP API, priorities across the whole backlog, batch publish and
# the stats. Against FerretDB v1.24.2 (SQLite) and the real HTTP receiver.
# Ignores the PostgreSQL cluster. Prints "N passed, N failed".
SUITE=mongo-parity
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"

# ------------------------------------------------------------------ 1. handler create / alter / drop
test_handlers() {
log "handler create refuses an existing name; alter; drop with pending deliveries"
DB=t_admin
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/adm" --options '{"max_attempts":5,"timeout":"2s"}' --database $DB >/dev/null
check_rc "handler create refuses an existing name (exit 2)" 2 'handler "hook" already exists' \
    "$BIN" handler create hook http "$HOOK/other" --database $DB
check_eq "the refused create changed nothing" "$HOOK/adm" \
    "$("$BIN" handler list --database $DB | $PY -c 'import json,sys; print(json.load(sys.stdin)[0]["target"])')"
out=$("$BIN" handler alter hook --target "$HOOK/adm2" --options '{"max_attempts":7,"timeout":null}' --database $DB)
check_eq "handler alter changes the target and merges options (null restores the default)" "$HOOK/adm2 7 30s" \
    "$($PY -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["target"], j["options"]["max_attempts"], j["options"]["timeout"])' "$out")"
check_rc "handler alter validates the merged options (exit 2)" 2 'invalid options' \
    "$BIN" handler alter hook --options '{"max_attempts":0}' --database $DB
check_rc "handler alter of an unknown handler (exit 2)" 2 'handler "nope" does not exist' \
    "$BIN" handler alter nope --target "$HOOK/x" --database $DB
check_rc "handler alter without a change (exit 2)" 2 'needs --target and/or --options' \
    "$BIN" handler alter hook --database $DB
"$BIN" route 'adm.#' hook --database $DB
for i in 1 2 3; do "$BIN" publish adm.x "{\"n\":$i}" --key a --database $DB >/dev/null; done
"$BIN" sequence --database $DB >/dev/null  # the outbox becomes deliveries (no instance runs)
check_rc "handler drop refuses pending deliveries (exit 2)" 2 'handler "hook" has 3 pending deliveries; drop refused' \
    "$BIN" handler drop hook --database $DB
check_eq "the refused drop changed nothing" "3 1" \
    "$(stats_field $DB pending) $("$BIN" handler list --database $DB | $PY -c 'import json,sys; print(len(json.load(sys.stdin)))')"
check_rc "handler drop --force dead-letters them" 0 '"dead_lettered":3' "$BIN" handler drop hook --force --database $DB
left=$($PYM -c "
import pymongo
db=pymongo.MongoClient('$URI')['$DB']
import mongo_deliveries as md
print(md.count(db), db.relay_routes.count_documents({}),
      sorted({d['last_error'] for d in db.relay_dead_letters.find()}), db.relay_dead_letters.count_documents({'handler_dropped_at': {'\$exists': True}}))")
check_eq "no delivery left behind, routes gone, dead letters say why" "0 0 ['handler dropped'] 3" "$left"
"$BIN" handler create hook http "$HOOK/adm3" --database $DB >/dev/null
"$BIN" route 'adm.#' hook --database $DB
check_rc "replay does not revive a dropped handler's dead letters" 0 '"replayed":0' "$BIN" replay --handler hook --database $DB
check_eq "the recreated handler starts empty" "0 0" "$(stats_field $DB pending) $(stats_field $DB dead)"
start_instance admin $DB
P1=$IPID
"$BIN" publish adm.x '{"n":4}' --key a --database $DB >/dev/null
wait_until 20 has_requests /adm3 1 && wait_until 10 pending_is $DB 0
sleep 0.5  # a revived delivery would go out within a poll interval (50 ms)
check_eq "only the new event reaches the recreated handler" "1 0 0" \
    "$(count_path /adm3) $(count_path /adm) $(count_path /adm2)"
stop_instance $P1
check_rc "handler drop of an unknown handler (exit 2)" 2 'handler "nope" does not exist' "$BIN" handler drop nope --database $DB
}

# ------------------------------------------------------------------ 2. run waits for the server
test_server_wait() {
log "run waits for a server that is down at start"
FPORT=$(python3 "$ROOT/scripts/free-port.py")
LATE_URI="mongodb://127.0.0.1:$FPORT/?serverSelectionTimeoutMS=300&connectTimeoutMS=300"
start_instance early t_late --uri "$LATE_URI"
P1=$IPID
wait_metrics_addr early || fail "no metrics address logged"
healthz() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$(metrics_addr early)/healthz"; }
wait_until 10 bash -c "(( \$(grep -c 'MongoDB server not reachable' '$TMP/early.err') >= 3 ))"
local addr code ms
addr=$(metrics_addr early)
read -r code ms < <(curl -s -o /dev/null -w '%{http_code} %{time_total}' --max-time 2 "http://$addr/healthz" |
    awk '{printf "%s %d\n", $1, $2 * 1000}')
kill -0 $P1 2>/dev/null && pass "run keeps running while the server is down" || fail "run exited" "$(tail -3 "$TMP/early.err")"
check_eq "/healthz answers 503 at once while waiting" "503 fast" "$code $( ((ms < 1000)) && echo fast || echo "${ms}ms")"
steps=$($PY -c "
import json
r=[json.loads(l)['retry_in_ms'] for l in open('$TMP/early.err') if 'not reachable' in l]
print('ok' if r[:3]==[250,500,1000] and all(b>=a for a,b in zip(r,r[1:])) else r)")
check_eq "one log line per failed probe, backoff doubling from 250 ms" ok "$steps"
mapfile -t late_store < <(ferretdb_store fdb_late)
"$ROOT/test/ferretdb/bin/ferretdb-test" "${late_store[@]}" -listen "127.0.0.1:$FPORT" -uri-file "$TMP/uri_late" \
    >"$TMP/fdb_late.out" 2>"$TMP/fdb_late.err" &
PIDS+=($!)
wait_until 20 test -s "$TMP/uri_late" || fail "second FerretDB did not start"
"$BIN" init --uri "$LATE_URI" --database t_late >/dev/null
"$BIN" handler create late http "$HOOK/late" --uri "$LATE_URI" --database t_late >/dev/null
"$BIN" route 'late.#' late --uri "$LATE_URI" --database t_late
"$BIN" publish late.x '{"n":1}' --uri "$LATE_URI" --database t_late >/dev/null
if wait_until 40 has_requests /late 1; then pass "once the server is up, run delivers"; else fail "nothing delivered after the server came up" "$(tail -3 "$TMP/early.err")"; fi
wait_until 10 bash -c "[[ \$(curl -s -o /dev/null -w '%{http_code}' 'http://$(metrics_addr early)/healthz') == 200 ]]"
check_eq "/healthz answers 200 once connected" 200 "$(healthz)"
stop_instance $P1
check_eq "SIGTERM exits 0" 0 "$STOP_RC"
start_instance never t_never --uri "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300&connectTimeoutMS=300"
P1=$IPID
wait_until 10 grep -q 'not reachable' "$TMP/never.err"
stop_instance $P1
check_eq "SIGTERM while waiting for the server exits 0" 0 "$STOP_RC"
}

# ------------------------------------------------------------------ 3. pull handlers over HTTP
test_pull() {
log "pull handlers: claim, ack, nack, extend with lease receipts"
local DB=t_pull TOKEN=tok-0123456789abcdef
"$BIN" init --database $DB >/dev/null
check_rc "handler create NAME pull" 0 '"kind":"pull"' "$BIN" handler create work pull --database $DB
"$BIN" handler create hook http "$HOOK/never" --database $DB >/dev/null
"$BIN" route 'job.#' work --database $DB
"$BIN" publish job.x '{"n":"A1"}' --key A --database $DB >/dev/null
"$BIN" publish job.x '{"n":"A2"}' --key A --database $DB >/dev/null
"$BIN" publish job.x '{"n":"B1"}' --key B --database $DB >/dev/null
"$BIN" publish job.x '{"n":"U"}' --database $DB >/dev/null
"$BIN" sequence --database $DB >/dev/null
start_instance pull $DB --api-token $TOKEN
local P1=$IPID
wait_until 15 grep -q '"held":64' "$TMP/pull.err" || fail "lanes not taken"
local base="http://$(metrics_addr pull)/v1/handlers/work"
# api PATH BODY [TOKEN]: prints "STATUS BODY" (TOKEN "": no Authorization header)
api() {
    local auth=()
    [[ -n "${3-$TOKEN}" ]] && auth=(-H "Authorization: Bearer ${3-$TOKEN}")
    curl -s -o "$TMP/api.body" -w '%{http_code}' -X POST "${auth[@]}" \
        -H 'Content-Type: application/json' --data "$2" "$base/$1"
    printf ' %s' "$(cat "$TMP/api.body")"
}
check_rc "no bearer token: 401 with a JSON error" 0 '^401 \{"error":"missing or wrong bearer token"\}' api claim '{}' ""
check_rc "a wrong bearer token: 401" 0 '^401 ' api claim '{}' wrong-token-0123456789
local out
# A long lease, so that a loaded machine's pauses never end one before the
# test means it to: U's is shortened to 1 s below to see one expire.
out=$(api claim '{"max":10,"lease":"60s"}')
# leases by payload tag
declare -A L I
while read -r tag id lease; do L[$tag]=$lease; I[$tag]=$id; done < <($PY -c "
import json,sys
st,body=sys.argv[1].split(' ',1)
for d in json.loads(body)['deliveries']: print(d['payload']['n'], d['id'], d['lease'])" "$out")
check_eq "claim hands out each key's head and the unkeyed one, not A2 behind A1" "A1 B1 U" "$(printf '%s\n' "${!L[@]}" | sort | xargs)"
check_eq "a second claim gets nothing (heads leased, A2 behind its leased head)" '200 {"deliveries":[]}' "$(api claim '{}')"
check_rc "extend keeps a lease" 0 '^200 .*lease_until' api extend "{\"id\":${I[A1]},\"lease\":\"${L[A1]}\",\"by\":\"60s\"}"
check_rc "ack with a forged receipt: 409 with a JSON error" 0 '^409 .*"error":"lease of delivery [0-9]+ is not held: another holder"' \
    api ack "{\"ids\":[${I[A1]}],\"leases\":[\"00000000000000000000000000000000\"]}"
check_rc "ack of two, one receipt forged: 409, all or nothing" 0 '^409 ' \
    api ack "{\"ids\":[${I[A1]},${I[B1]}],\"leases\":[\"${L[A1]}\",\"${L[A1]}\"]}"
check_eq "the refused acks changed nothing" 4 "$(stats_field $DB pending)"
check_rc "ack with the receipt" 0 '^200 .*"acked":1' api ack "{\"ids\":[${I[A1]}],\"leases\":[\"${L[A1]}\"]}"
check_rc "nack with the receipt: retried" 0 '^200 .*"dead":false' \
    api nack "{\"id\":${I[B1]},\"lease\":\"${L[B1]}\",\"delay\":\"0s\",\"error\":\"boom\"}"
check_rc "ack with the stale receipt after the nack: 409" 0 '^409 .*not held: no lease' \
    api ack "{\"ids\":[${I[B1]}],\"leases\":[\"${L[B1]}\"]}"
local doc
doc=$($PYM -c "
import pymongo
import mongo_deliveries as md
d=md.find_one(pymongo.MongoClient('$URI')['$DB'], {'_id': ${I[B1]}})
print(d['attempt'], d['last_error'])")
check_eq "the stale ack changed nothing: B1 pending with the nack's attempt and error" "1 boom" "$doc"
# U's lease, shortened to 1 s, runs out: a failed attempt, and its receipt is stale.
check_rc "extend to a shorter lease" 0 '^200 .*lease_until' api extend "{\"id\":${I[U]},\"lease\":\"${L[U]}\",\"by\":\"1s\"}"
u_expired() { [[ "$($PYM -c "
import pymongo
import mongo_deliveries as md
d=md.find_one(pymongo.MongoClient('$URI')['$DB'], {'_id': ${I[U]}})
print(d.get('attempt'), d.get('last_error'))")" == "1 lease expired" ]]; }
if wait_until 10 u_expired; then pass "an expired lease counts as a failed attempt (lease expired)"; else fail "U's lease did not expire"; fi
check_rc "ack with an expired receipt: 409" 0 '^409 ' api ack "{\"ids\":[${I[U]}],\"leases\":[\"${L[U]}\"]}"
check_eq "3 pending after the refused completions" 3 "$(stats_field $DB pending)"
# Backoff of U (the handler's, from 1 s): claim until A2, B1 and U are handed out again.
declare -A L2 I2
all_claimed() {
    local o
    o=$(api claim '{"max":10}')
    while read -r tag id lease; do L2[$tag]=$lease; I2[$tag]=$id; done < <($PY -c "
import json,sys
st,body=sys.argv[1].split(' ',1)
for d in json.loads(body)['deliveries']: print(d['payload']['n'], d['id'], d['lease'])" "$o")
    [[ -n "${L2[A2]:-}" && -n "${L2[B1]:-}" && -n "${L2[U]:-}" ]]
}
if wait_until 15 all_claimed; then pass "after the ack, the nack and the expiry: A2, B1 and U are claimed again"; else fail "claimed again: ${!L2[*]}"; fi
check_rc "ack of all three" 0 '^200 .*"acked":3' \
    api ack "{\"ids\":[${I2[A2]},${I2[B1]},${I2[U]}],\"leases\":[\"${L2[A2]}\",\"${L2[B1]}\",\"${L2[U]}\"]}"
check_eq "nothing pending" 0 "$(stats_field $DB pending)"
check_rc "an http handler is not claimable: 404" 0 '^404 .*"handler \\"hook\\" does not exist or is not a pull handler' \
    bash -c "$(declare -f api); TMP=$TMP TOKEN=$TOKEN base=${base%/work}/hook api claim '{}'"
check_rc "bad input: 400" 0 '^400 .*max.* must be an integer 1..1000' api claim '{"max":0}'
# An http handler dropped and created again as pull (a running dispatcher
# saw it as http): its deliveries are claimed, never sent to the old URL.
"$BIN" handler drop hook --database $DB >/dev/null
"$BIN" handler create hook pull --database $DB >/dev/null
"$BIN" route 'never.#' hook --database $DB
base=${base%/*}/hook
# The catalog is read every lease/3: once the API answers 200 for hook, the
# dispatcher's catalog has it as pull too (the same read).
wait_until 10 bash -c "$(declare -f api); TMP=$TMP TOKEN=$TOKEN base=$base api claim '{}' | grep -q '^200'" ||
    fail "hook never became a pull handler"
"$BIN" publish never.x '{"n":"N"}' --database $DB >/dev/null
claimed_n() { [[ "$(api claim '{}')" == *'"n":"N"'* ]]; }
if wait_until 10 claimed_n; then pass "http handler recreated as pull: claimed"; else fail "not claimed"; fi
base=${base%/*}/work
check_eq "... and never sent to the old http target" 0 "$(count_path /never)"
check_rc "a nack without its lease: 400" 0 '^400 ' api nack "{\"id\":${I[A1]}}"
# SIGTERM with a pull lease outstanding: every lane is given back at once.
"$BIN" publish job.x '{"n":"S"}' --key S --database $DB >/dev/null
claimed_s() { [[ "$(api claim '{}')" == *'"n":"S"'* ]]; }
wait_until 10 claimed_s || fail "S not claimed"
stop_instance $P1
grep '"msg":"lanes"' "$TMP/pull.err" | tail -1 | grep -q '"held":0' && pass "SIGTERM gives back lanes with pull leases outstanding" ||
    fail "lanes kept at SIGTERM" "$(grep '"msg":"lanes"' "$TMP/pull.err" | tail -1)"
start_instance pull_off $DB
P1=$IPID
wait_metrics_addr pull_off
base="http://$(metrics_addr pull_off)/v1/handlers/work"
check_rc "without api_token the pull API is off: 403" 0 '^403 .*set api_token' api claim '{}'
stop_instance $P1
}

# ------------------------------------------------------------------ 4. priorities across the whole backlog
# 0.1.0: ten priority-3 events behind 1,000 priority-1 events went out at
# positions 608-625 (the window was the oldest rows only).
test_priorities() {
log "priorities across the whole backlog, with aging"
local DB=t_prio
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/prio" --options '{"concurrency":8}' --database $DB >/dev/null
$PYM "$INTEG/mongo_bulk_load.py" "$URI" $DB hook prio.x 1000 50 1 low >/dev/null || fail "bulk load"
$PYM "$INTEG/mongo_bulk_load.py" "$URI" $DB hook prio.x 10 0 3 high >/dev/null || fail "bulk load"
control /prio '[{"delay": 0.01, "repeat": true}]'
start_instance prio $DB --priority-aging 60s
local P1=$IPID
wait_until 60 has_requests /prio 20 || fail "requests to /prio did not flow"
local pos
pos=$(tag_positions /prio high)
log "positions of the ten priority-3 deliveries: $pos"
check_eq "ten priority-3 deliveries behind 1,000 priority-1 ones come first (within 10 + concurrency)" "10 ok" \
    "$(wc -w <<<"$pos") $(for p in $pos; do ((p <= 18)) || echo late; done | grep -q late && echo late || echo ok)"
stop_instance $P1
control /prio '[]'

# Aging: priority-0 deliveries ready for 6 aging periods (a retry's not_before,
# say, behind newer ids) outrank fresh priority-2 ones.
DB=t_aging
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/aging" --options '{"concurrency":4}' --database $DB >/dev/null
$PYM "$INTEG/mongo_bulk_load.py" "$URI" $DB hook aging.x 300 30 2 fresh >/dev/null || fail "bulk load"
$PYM "$INTEG/mongo_bulk_load.py" "$URI" $DB hook aging.x 5 0 0 aged >/dev/null || fail "bulk load"
$PYM -c "
import pymongo, datetime
db=pymongo.MongoClient('$URI')['$DB']
old=datetime.datetime.now(datetime.timezone.utc)-datetime.timedelta(seconds=60)
import mongo_deliveries as md
md.update_many(db, {'payload.tag':'aged'}, {'\$set': {'not_before': old, 'published_at': old}})
" || fail "aging setup"
start_instance aging $DB --priority-aging 10s --batch-size 20 --scan-window 64
P1=$IPID
wait_until 60 has_requests /aging 40 || fail "requests to /aging did not flow"
pos=$(tag_positions /aging aged)
log "positions of the five aged priority-0 deliveries: $pos"
check_eq "aged priority-0 deliveries are not starved by a priority-2 backlog (within 5 + concurrency)" "5 ok" \
    "$(wc -w <<<"$pos") $(for p in $pos; do ((p <= 9)) || echo late; done | grep -q late && echo late || echo ok)"
stop_instance $P1

# One key's events in two classes of a deep backlog: seq 1 at priority 0
# beyond class 0's full window, seq 2 at priority 3. The planner sees only
# seq 2; the fence read must hold it back (FerretDB too: its single window
# needs no fence, the class windows do).
DB=t_mixed
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/mixed" --options '{"concurrency":4}' --database $DB >/dev/null
$PYM -c "
import datetime, sys
sys.path.insert(0, '$INTEG')
import pymongo
from mongo_bulk_load import lane_for_key
db = pymongo.MongoClient('$URI')['$DB']
now = datetime.datetime.now(datetime.timezone.utc)
def doc(i, key, seq, prio):
    return {'_id': i, 'event_id': i, 'handler': 'hook', 'priority': prio, 'not_before': now, 'published_at': now,
            'attempt': 0, 'topic': 'mixed.x', 'payload': {'key': key, 'seq': seq}, 'key': key, 'seq': seq,
            'lane': lane_for_key(key)}
docs = [doc(i + 1, 'fill-%d' % (i % 10), i // 10 + 1, 0) for i in range(100)]
docs += [doc(101, 'K', 1, 0), doc(102, 'K', 2, 3)]
db.relay_deliveries.insert_many(docs)
db.relay_counters.update_one({'_id': 'ids'}, {'\$set': {'n': 102}}, upsert=True)
" || fail "mixed setup"
start_instance mixed $DB --scan-window 64 --batch-size 16
P1=$IPID
wait_until 60 has_requests /mixed 102 || fail "requests to /mixed did not all arrive" "$(count_path /mixed) of 102"
check_eq "a key's seq 1 (priority 0, beyond its class's window) goes before its seq 2 (priority 3)" "1 2" \
    "$(curl -s "$HOOK/_requests" | $PY -c "
import json,sys
print(' '.join(str(json.loads(r['body'])['seq']) for r in json.load(sys.stdin) if r['path']=='/mixed' and json.loads(r['body'])['key']=='K'))")"
stop_instance $P1
}

# ------------------------------------------------------------------ 4a. the pull API on a deep backlog
# The pull API claims with the dispatcher's module (src/mongo/lane_claim.*):
# class windows once the backlog is deeper than a window, remembered per
# handler, the fence only where an earlier seq may lie outside the rows read,
# malformed documents dead-lettered, logged and counted.
test_pull_deep() {
log "the pull API on a backlog deeper than a window: priorities, order per key, the fence"
local DB=t_pulldeep TOKEN=tok-0123456789abcdef
"$BIN" init --database $DB >/dev/null
"$BIN" handler create deep pull --database $DB >/dev/null
# ids 1-200 priority 1 over 10 keys, 201-300 priority 0 over 5 keys, K's seq 1
# at priority 0 beyond class 0's window (301) and its seq 2 at priority 3
# (302), 10 priority-3 over 5 keys, 8 unkeyed priority 2, then key "bad":
# seq 1 malformed (no payload), seq 2 fine.
$PYM -c "
import datetime, sys
sys.path.insert(0, '$INTEG')
import pymongo
from mongo_bulk_load import lane_for_key
db = pymongo.MongoClient('$URI')['$DB']
now = datetime.datetime.now(datetime.timezone.utc)
docs, seqs = [], {}
def add(key, prio):
    i = len(docs) + 1
    d = {'_id': i, 'event_id': i, 'handler': 'deep', 'priority': prio, 'not_before': now, 'published_at': now,
         'attempt': 0, 'topic': 'deep.x', 'payload': {'key': key, 'prio': prio}}
    if key is None:
        d.update(seq=i, lane=i % 64)
    else:
        seqs[key] = seqs.get(key, 0) + 1
        d.update(key=key, seq=seqs[key], lane=lane_for_key(key))
        d['payload']['seq'] = seqs[key]
    docs.append(d)
for i in range(200): add('one-%d' % (i % 10), 1)
for i in range(100): add('zero-%d' % (i % 5), 0)
add('K', 0); add('K', 3)
for i in range(10): add('three-%d' % (i % 5), 3)
for i in range(8): add(None, 2)
add('bad', 2); del docs[-1]['payload']
add('bad', 2)
db.relay_deliveries.insert_many(docs)
db.relay_counters.update_one({'_id': 'ids'}, {'\$set': {'n': len(docs)}}, upsert=True)
" || fail "deep pull setup"
start_instance pulldeep $DB --api-token $TOKEN --scan-window 64 --priority-aging 60s
local P1=$IPID
wait_until 15 grep -q '"held":64' "$TMP/pulldeep.err" || fail "lanes not taken"
# Claims of at most 50 (per_key 10), each acked at once, until three come back
# empty: one line per delivery, "claim-number key seq priority".
$PY - "http://$(metrics_addr pulldeep)/v1/handlers/deep" $TOKEN >"$TMP/pulldeep.claims" <<'PYEOF' || fail "claim loop"
import json, sys, time, urllib.request
base, token = sys.argv[1], sys.argv[2]
def call(op, body):
    req = urllib.request.Request(base + "/" + op, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)
empty, n, deadline = 0, 0, time.time() + 300
while empty < 3 and time.time() < deadline:
    got = call("claim", {"max": 50, "per_key": 10, "lease": "60s"})["deliveries"]
    if not got:
        empty += 1
        time.sleep(0.2)
        continue
    empty, n = 0, n + 1
    for d in got:
        p = d["payload"]
        print(n, p.get("key") or "-", p.get("seq", d["id"]), p["prio"])
    call("ack", {"ids": [d["id"] for d in got], "leases": [d["lease"] for d in got]})
PYEOF
check_eq "every delivery but the malformed one claimed exactly once (321 of 322 rows)" "321 321" \
    "$(wc -l <"$TMP/pulldeep.claims") $(awk '{print $2, $3}' "$TMP/pulldeep.claims" | sort -u | wc -l)"
check_eq "each key's deliveries handed over in seq order" ok "$(awk '$2 != "-" { if (($2 in last) && $3 != last[$2] + 1) bad = bad " " $2 ":" last[$2] "->" $3; last[$2] = $3 }
    END { print bad == "" ? "ok" : bad }' "$TMP/pulldeep.claims")"
check_eq "K's seq 1 (priority 0, beyond its class's window) before its seq 2 (priority 3): the fence held" "1 2" \
    "$(awk '$2 == "K" {printf "%s%s", sep, $3; sep = " "}' "$TMP/pulldeep.claims")"
check_eq "the first claim starts with the priority-3 heads, K's seq 2 held back" "3 3 3 3 3 no-K" \
    "$(awk '$1 == 1 && n < 5 {printf "%s ", $4; n++} $1 == 1 && $2 == "K" {k = 1} END {print k ? "K" : "no-K"}' "$TMP/pulldeep.claims")"
check_eq "the malformed document is dead-lettered and counted as dead in the metrics" "1 1" \
    "$($PYM -c "import pymongo; print(pymongo.MongoClient('$URI')['$DB'].relay_dead_letters.count_documents({'handler': 'deep'}))") $(metric pulldeep 'relaybus_mongo_dead_total{handler="deep"}')"
check_eq "the malformed document is logged once" 1 "$(grep -c '"msg":"malformed delivery document"' "$TMP/pulldeep.err")"
stop_instance $P1
}

# 4b, a store slower than the lease's slack: mongo_slow_store.sh.

# /metrics and /healthz are answered by their own thread: a store command in
# progress (seconds on a loaded FerretDB) never holds them up, and /healthz
# still turns 503 once the store has not answered for 3 leases.
test_metrics_slow_store() {
log "/metrics and /healthz answer at once while a store command takes seconds"
local DB=t_mthread
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/mthread" --database $DB >/dev/null
local fport
fport=$($PY -c "import urllib.parse as u; print(u.urlparse('$URI').port)")
echo 0 >"$TMP/mthread_delay"
$PY "$INTEG/slow_link.py" --target 127.0.0.1:$fport --delay 0 --delay-file "$TMP/mthread_delay" \
    --port-file "$TMP/mthread_port" 2>"$TMP/mthread_link.err" &
PIDS+=($!)
wait_until 10 test -s "$TMP/mthread_port" || fail "slow link did not start"
start_instance mthread $DB --uri "mongodb://127.0.0.1:$(cat "$TMP/mthread_port")/?serverSelectionTimeoutMS=5000" \
    --lease 2s
local P1=$IPID addr
wait_metrics_addr mthread || fail "no metrics address logged"
addr=$(metrics_addr mthread)
health() { curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://$addr/healthz"; }
wait_until 20 bash -c "[[ \$(curl -s -o /dev/null -w '%{http_code}' 'http://$addr/healthz') == 200 ]]" ||
    fail "/healthz never 200" "$(tail -3 "$TMP/mthread.err")"
# probe PATH N: N requests 0.4 s apart; prints each "code:ms" and, last, the slowest ms.
probe() {
    local i out slow=0 code ms
    for ((i = 0; i < $2; i++)); do
        read -r code ms < <(curl -s -o /dev/null -w '%{http_code} %{time_total}' --max-time 3 "http://$addr$1" |
            awk '{printf "%s %d\n", $1, $2 * 1000}')
        out+="$code:$ms "
        ((ms > slow)) && slow=$ms
        sleep 0.4
    done
    echo "$out$slow"
}
echo 2.5 >"$TMP/mthread_delay"  # every store reply now takes 2.5 s
sleep 0.3                         # let the loop enter a command (not an assertion)
local m h
m=$(probe /metrics 4)
h=$(probe /healthz 4)
check_eq "/metrics answers within 300 ms, 4 times while store commands take 2.5 s" fast \
    "$( ((${m##* } < 300)) && [[ $m != *000:* ]] && echo fast || echo "$m")"
check_eq "/healthz answers 200 within 300 ms, 4 times meanwhile (the store answered < 3 leases ago)" fast \
    "$( ((${h##* } < 300)) && [[ $h != *000:* && $h != *503:* ]] && echo fast || echo "$h")"
echo 600 >"$TMP/mthread_delay"  # the store stops answering
if wait_until 12 bash -c "[[ \$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 'http://$addr/healthz') == 503 ]]"; then
    pass "/healthz turns 503 while the store has not answered for 3 leases"
else fail "/healthz did not turn 503 with the store stuck" "$(probe /healthz 1)"; fi
h=$(probe /healthz 3)
m=$(probe /metrics 2)
check_eq "meanwhile /healthz (503) and /metrics (200) answer within 300 ms" fast \
    "$( ((${h##* } < 300 && ${m##* } < 300)) && [[ $h != *200:* && $h != *000:* && $m != *000:* ]] && echo fast || echo "$h / $m")"
# A pull API request waits for the loop (it calls the store) and is answered once the store is back.
curl -s -o "$TMP/mthread_api" -w '%{http_code}' --max-time 20 -X POST -H 'Authorization: Bearer wrong' \
    "http://$addr/v1/handlers/hook/claim" >"$TMP/mthread_api_code" &
local CURL=$!
sleep 0.5
echo 0 >"$TMP/mthread_delay"
if wait_until 15 bash -c "[[ \$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 'http://$addr/healthz') == 200 ]]"; then
    pass "/healthz 200 again once the store answers"
else fail "/healthz stayed unhealthy after the store came back" "$(tail -3 "$TMP/mthread.err")"; fi
wait $CURL
check_eq "a pull API request sent while the store was stuck is answered by the loop afterwards" 403 "$(cat "$TMP/mthread_api_code")"
stop_instance $P1
check_eq "SIGTERM exits 0 (the metrics thread joined)" 0 "$STOP_RC"
}

# HTTP requests in flight progress while a store command is in progress: a
# helper thread drives them (docs/mongo.md, "The loop and its threads").
# Before it, the loop gave HTTP a turn only before each command, so with every
# find taking 1.5 s a request submitted before a find was sent, or its
# response read, only after it: past its 1 s timeout, every time.
test_http_during_slow_store() {
log "HTTP requests complete while a store command takes longer than their timeout"
local DB=t_httpwin
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/httpwin" --options '{"concurrency":24,"timeout":"1s","max_attempts":3}' \
    --database $DB >/dev/null
slow_link_to httpwin 0 find,aggregate
start_instance httpwin $DB --uri "$SLOW_URI" --lease 30s --batch-size 24 --scan-window 32
local P1=$IPID
wait_until 20 bash -c "grep -q '\"held\":64' '$TMP/httpwin.err'" || fail "the instance took no lanes"
echo 1.5 >"$TMP/httpwin_delay"
$PYM "$INTEG/mongo_bulk_load.py" "$URI" $DB hook w.x 24 24 1 win >/dev/null || fail "bulk load"
if wait_until 60 pending_is $DB 0; then pass "24 deliveries done through a store whose finds take 1.5 s"; else
    fail "the backlog did not drain" "$(count_path /httpwin) requests; pending $(stats_field $DB pending)"; fi
check_eq "each delivered by its first request: no timeout, no retry, no dead letter" "24 24 0 0" \
    "$(count_path /httpwin) $(tag_positions /httpwin win | wc -w) $(metric httpwin 'relaybus_mongo_retried_total{handler="hook"}') $(stats_field $DB dead)"
kill -KILL $P1  # a graceful stop waits for more slow finds; nothing is checked after it
wait $P1 2>/dev/null
}

# A lane lease is renewed while a store command takes longer than the lease:
# renewals go over a connection of their own on a thread of their own. Before
# it, a 4 s find outlasted the 3 s lease and a second instance took the lanes
# over.
test_renewal_during_slow_store() {
log "lane leases are renewed while a store command outlasts the lease"
local DB=t_renewwin
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/renewwin" --database $DB >/dev/null
slow_link_to renewwin 0 find,aggregate
start_instance renewa $DB --uri "$SLOW_URI"
local PA=$IPID
held_is() { [[ "$(metric renewa relaybus_mongo_lanes_held)" == "$1" ]]; }
wait_until 20 held_is 64 ||
    fail "the slow instance never held the 64 lanes" "$(metric renewa relaybus_mongo_lanes_held)"
echo 4 >"$TMP/renewwin_delay"
sleep 1
start_instance renewb $DB
local PB=$IPID
sleep 12  # three 4 s finds of A against B's 1 s ticks: A's leases would lapse in each
stop_instance $PB
# Lanes B took that A had not given back: taken over after A's lease lapsed.
local unreleased
unreleased=$($PY -c "
import json, sys
def lanes(name, field):
    out = set()
    for l in open('$TMP/%s.err' % name):
        try: j = json.loads(l)
        except ValueError: continue
        if j.get('msg') == 'lanes': out.update(j[field])
    return out
print(sorted(lanes('renewb', 'taken') - lanes('renewa', 'released')))")
check_eq "the other instance took only lanes the slow one had given back (none lapsed)" "[]" "$unreleased"
check_eq "the slow instance lost no lane" 0 "$(grep -c 'lane lease lost' "$TMP/renewa.err")"
kill -KILL $PA  # a graceful stop waits for more 4 s finds; nothing is checked after it
wait $PA 2>/dev/null
}

# ------------------------------------------------------------------ 5. batch publish and stats
test_batch_stats() {
log "publish --batch and the stats of the PostgreSQL views"
local DB=t_batch
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/batch" --options '{"concurrency":2}' --database $DB >/dev/null
"$BIN" route 'b.#' hook --database $DB
cat >"$TMP/batch.jsonl" <<'JSON'
{"topic":"b.x","payload":{"n":1},"key":"k"}
{"topic":"b.x","payload":{"n":2},"key":"k","priority":3}

{"topic":"b.x","payload":{"n":3},"headers":{"h":"v"}}
{"topic":"b.x","payload":{"n":4},"not_before":"1h"}
{"topic":"b.x","payload":[1,2]}
JSON
local out
out=$("$BIN" publish --batch "$TMP/batch.jsonl" --database $DB)
check_eq "publish --batch: one line per event, in order, outbox ids growing" "5 ok" \
    "$(wc -l <<<"$out") $($PY -c "
import json,sys
ids=[json.loads(l)['outbox_id'] for l in sys.stdin.read().splitlines() if l]
print('ok' if ids==sorted(ids) and len(set(ids))==len(ids) else ids)" <<<"$out")"
check_eq "publish --batch is one insert" 1 "$(grep -c '"command":"insert"' <("$BIN" publish --batch - --database t_batch_cmds --log-level debug <<<'{"topic":"b.x","payload":1}
{"topic":"b.x","payload":2}' 2>&1))"
"$BIN" sequence --database $DB >/dev/null
check_eq "sequenced: key k's seqs 1 and 2 in line order" "1:1 2:2" "$($PYM -c "
import pymongo
db=pymongo.MongoClient('$URI')['$DB']
import mongo_deliveries as md
print(' '.join(f\"{d['payload']['n']}:{d['seq']}\" for d in sorted(md.find(db, {'key':'k'}), key=lambda d: d['seq'])))")"
printf '%s\n' '{"topic":"b.x","payload":{"n":5}}' '{"topic":"b..x","payload":{}}' >"$TMP/bad.jsonl"
check_rc "a bad line: exit 2 naming the line" 2 'line 2: invalid topic "b..x"' "$BIN" publish --batch "$TMP/bad.jsonl" --database $DB
printf '%s\n' '{"topic":"b.x","payload":{},"prio":1}' >"$TMP/bad2.jsonl"
check_rc "an unknown field: exit 2" 2 'line 1: unknown field "prio"' "$BIN" publish --batch "$TMP/bad2.jsonl" --database $DB
"$BIN" sequence --database $DB >/dev/null
check_eq "a refused batch publishes nothing" 5 "$(stats_field $DB pending)"
check_rc "publish --batch - reads stdin" 0 '"outbox_id"' bash -c "echo '{\"topic\":\"b.y\",\"payload\":{\"n\":6}}' | '$BIN' publish --batch - --database $DB"
"$BIN" sequence --database $DB >/dev/null
local st
st=$("$BIN" stats --database $DB | $PY -c "
import json,sys
h=json.load(sys.stdin)[0]
print(h['kind'], h['pending'], h['ready'], h['delayed'], h['in_flight'], h['retrying'], h['dead'], h['oldest_age_ms']>=0, len(h['latency']['buckets']), h['latency']['count'])")
check_eq "stats: kind pending ready delayed in_flight retrying dead oldest_age latency" "http 6 5 1 0 0 0 True 16 0" "$st"
control /batch '[{"delay": 1.5, "repeat": true}]'
start_instance batch $DB
local P1=$IPID
in_flight() { [[ "$("$BIN" stats --database $DB | $PY -c 'import json,sys; print(json.load(sys.stdin)[0]["in_flight"])')" == 2 ]]; }
if wait_until 15 in_flight; then pass "stats: in_flight from the live instance's heartbeat (2 = concurrency)"; else fail "in_flight never 2"; fi
wait_until 30 pending_is $DB 1
wait_until 10 bash -c "[[ \$(curl -s 'http://$(metrics_addr batch)/metrics' | awk '\$1==\"relaybus_mongo_pending{handler=\\\"hook\\\"}\" {print \$2}') != '' ]]"
local m
m=$(curl -s "http://$(metrics_addr batch)/metrics" | grep -cE '^relaybus_mongo_(pending|ready|delayed|retrying|dead|oldest_pending_seconds|handler_in_flight)\{handler="hook"\}')
check_eq "/metrics: pending, ready, delayed, retrying, dead, oldest age and in-flight per handler" 7 "$m"
lat() { [[ "$("$BIN" stats --database $DB | $PY -c 'import json,sys; h=json.load(sys.stdin)[0]; print(h["latency"]["count"], h["latency"]["buckets"][-1], h["pending"], h["delayed"])')" == "5 5 1 1" ]]; }
if wait_until 10 lat; then pass "stats: latency histogram of the 5 deliveries; the delayed one still pending"; else
    fail "stats after the drain" "$("$BIN" stats --database $DB)"; fi
stop_instance $P1
control /batch '[]'
}

# The same scenarios as settle_rules.sh runs against PostgreSQL, with the same
# outcomes: a webhook attempt is judged by the options it was sent with; a
# nack and an expired lease by the options when they happen. The sidecar reads
# the handler catalog once per lease tick (lease/3: 1 s here), so after an
# alter the pull scenarios wait two ticks before they act.
test_settle_rules() {
log "settle rules: max_attempts lowered while an attempt is out"
local DB=t_settle TOKEN=tok-0123456789abcdef
"$BIN" init --database $DB >/dev/null
"$BIN" handler create lowered http "$HOOK/lowered" \
    --options '{"max_attempts":5,"backoff_base":"100ms","backoff_max":"200ms","timeout":"60s"}' --database $DB >/dev/null
"$BIN" handler create pulled pull --options '{"max_attempts":5}' --database $DB >/dev/null
"$BIN" route 'sr.http' lowered --database $DB
"$BIN" route 'sr.pull' pulled --database $DB
control /lowered "[{\"status\": 500, \"hold\": \"$TMP/lowered.answer\"}, {\"status\": 500}]"
"$BIN" publish sr.http '{"n":1}' --key k --database $DB >/dev/null
"$BIN" publish sr.pull '{"n":2}' --key k --database $DB >/dev/null
"$BIN" publish sr.pull '{"n":3}' --key k3 --database $DB >/dev/null
"$BIN" sequence --database $DB >/dev/null
start_instance settle $DB --api-token $TOKEN
local P1=$IPID
wait_until 15 has_requests /lowered 1 || fail "(1) attempt 1 never reached the receiver"
"$BIN" handler alter lowered --options '{"max_attempts":1}' --database $DB >/dev/null
# The first attempt is answered once the sidecar has read the catalog again:
# after two heartbeats (a tick reads the handlers, then writes its heartbeat),
# not after a fixed delay that a loaded machine's slow ticks outlast.
heartbeat() { $PYM -c "
import pymongo
d=pymongo.MongoClient('$URI')['$DB'].relay_instances.find_one({'_id': 'settle'})
print(d['until'] if d else '')"; }
beat_after() { [[ "$(heartbeat)" != "$1" ]]; }
local beat
beat=$(heartbeat)
wait_until 60 beat_after "$beat" || fail "(1) no heartbeat after the alter"
beat=$(heartbeat)
wait_until 60 beat_after "$beat" || fail "(1) no second heartbeat after the alter"
touch "$TMP/lowered.answer"
dead_letter() { $PYM -c "
import pymongo
db=pymongo.MongoClient('$URI')['$DB']
for d in db.relay_dead_letters.find({'handler': '$1'}, sort=[('_id', 1)]):
    print(f\"{d['attempts']}|{d.get('last_error')}|{d.get('last_status', '')}\")"; }
has_dead_letter() { [[ -n "$(dead_letter "$1")" ]]; }
wait_until 30 has_dead_letter lowered || fail "(1) no dead letter"
check_eq "(1) two attempts: the first judged with max_attempts 5 (retry), the second with 1 (dead)" "2|HTTP 500|500" \
    "$(dead_letter lowered)"
check_eq "(1) the receiver saw both attempts" 2 "$(count_path /lowered)"

wait_metrics_addr settle || fail "no metrics address"
local base="http://$(metrics_addr settle)/v1/handlers/pulled"
api() {
    curl -s -o "$TMP/api.body" -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
        -H 'Content-Type: application/json' --data "$2" "$base/$1"
    printf ' %s' "$(cat "$TMP/api.body")"
}
local out id lease
out=$(api claim '{"max":1}')
read -r id lease <<<"$($PY -c 'import json,sys; d=json.loads(sys.argv[1].split(" ",1)[1])["deliveries"][0]; print(d["id"], d["lease"])' "$out")"
"$BIN" handler alter pulled --options '{"max_attempts":1}' --database $DB >/dev/null
sleep 2
check_rc "(2) a nack after max_attempts was lowered to 1: dead" 0 '^200 .*"dead":true' \
    api nack "{\"id\":$id,\"lease\":\"$lease\",\"error\":\"boom\"}"
check_eq "(2) the dead letter: one attempt, the nack's error" "1|boom|" "$(dead_letter pulled)"

"$BIN" handler alter pulled --options '{"max_attempts":5}' --database $DB >/dev/null
sleep 2
out=$(api claim '{"max":1,"lease":"3s"}')
check_rc "(3) claimed with a 3 s lease" 0 '"n":3' echo "$out"
"$BIN" handler alter pulled --options '{"max_attempts":1}' --database $DB >/dev/null
two_dead() { (($(dead_letter pulled | wc -l) == 2)); }
wait_until 15 two_dead || fail "(3) the expired delivery was not dead-lettered"
check_eq "(3) the expired lease was charged with max_attempts 1: one attempt, 'lease expired'" "1|lease expired|" \
    "$(dead_letter pulled | tail -1)"
check_eq "(3) nothing left to claim" '200 {"deliveries":[]}' "$(api claim '{}')"
stop_instance $P1
control /lowered '[]'
}

# ------------------------------------------------------------------ 6. routes, as the extension resolves them
# test/vectors/routes.tsv, which test/integration/routes.sh holds the extension
# to: ties broken by pattern text in byte order, never by the order the server
# returns the route documents in (it follows their creation here).
test_routes() {
log "routes: the handlers and wire names of test/vectors/routes.tsv, routes created in both orders"
source "$INTEG/routes_lib.sh"
local order DB h pattern wire t wire_opt
for order in forward reverse; do
    DB=t_routes_$order
    "$BIN" init --database $DB >/dev/null
    for h in $(routes_handlers); do "$BIN" handler create "$h" pull --database $DB >/dev/null; done
    while IFS=$'\t' read -r h pattern wire; do
        wire_opt=()
        [[ $wire != - ]] && wire_opt=(--wire "$wire")
        "$BIN" route "$pattern" "$h" "${wire_opt[@]}" --database $DB
    done < <(routes_in_order $order)
    for t in $(routes_topics); do
        printf '{"topic":"%s","payload":{"n":1}}\n{"topic":"%s","payload":{"n":2}}\n' "$t" "$t"
    done | "$BIN" publish --batch - --database $DB >/dev/null
    "$BIN" sequence --database $DB >/dev/null
    $PYM -c "
import pymongo
import mongo_deliveries as md
rows = {}
for d in md.find(pymongo.MongoClient('$URI')['$DB']):
    rows.setdefault((d['payload']['n'], d['topic']), []).append(d['handler'] + '=' + d.get('wire_topic', '-'))
for (n, t), hs in rows.items(): print(f\"{n}\\t{t}\\t{' '.join(sorted(hs))}\")" >"$TMP/routes_$order"
    routes_compare "$order" "$TMP/routes_$order"
done
}

# MONGO_PARITY_ONLY=pattern runs only the test_* functions whose name matches.
for t in test_handlers test_server_wait test_pull test_pull_deep test_priorities test_metrics_slow_store test_http_during_slow_store test_renewal_during_slow_store test_batch_stats test_settle_rules test_routes; do
    [[ -z "${MONGO_PARITY_ONLY:-}" || "$t" == *${MONGO_PARITY_ONLY}* ]] && "$t"
done
log "done"
finish
