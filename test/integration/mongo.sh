#!/usr/bin/env bash
# relaybus-mongo against a real MongoDB-wire server (FerretDB v1.24.2, SQLite
# backend, built from the Go module proxy by test/ferretdb/build.sh) and the
# real HTTP receiver. Ignores the PostgreSQL cluster. Prints "N passed, N failed".
# pymongo (Debian's python3-pymongo) serves the application-side publishing path and raw documents.
SUITE=mongo
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/prometheus_lib.sh"
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw

# ------------------------------------------------------------------ init, vectors
log "init"
check_rc "init creates collections and indexes" 0 'relay_deliveries.key_seq' "$BIN" init --database t_init
check_rc "init again is a no-op" 0 '"created":\[\]' "$BIN" init --database t_init

log "lane hash vectors"
tail -n +2 "$ROOT/test/vectors/lane_hash.tsv" | sed '/^$/d' >"$TMP/vectors.tsv"
cut -f1 "$TMP/vectors.tsv" | "$BIN" lane >"$TMP/lanes.tsv"
if diff -u "$TMP/vectors.tsv" "$TMP/lanes.tsv" >"$TMP/lanes.diff"; then
    pass "relaybus-mongo lane == test/vectors/lane_hash.tsv ($(wc -l <"$TMP/vectors.tsv") keys)"
else
    fail "lane vectors differ" "$(head -20 "$TMP/lanes.diff")"
fi
"$BIN" init --database t_vec >/dev/null
"$BIN" handler create vec http "$HOOK/vec" --database t_vec >/dev/null
"$BIN" route 'vec.#' vec --database t_vec
bad=0
n=0
while IFS= read -r line; do
    key=${line%%$'\t'*}
    lane=${line##*$'\t'}
    [[ -z "$key" ]] && continue  # the empty key: publish refuses it (an unkeyed event has no key)
    got=$("$BIN" publish vec.k '{}' --key "$key" --database t_vec | $PY -c 'import json,sys; print(json.load(sys.stdin)["lane"])')
    n=$((n + 1))
    [[ "$got" == "$lane" ]] || { bad=$((bad + 1)); echo "    key $key: stored lane $got, vector $lane"; }
done <"$TMP/vectors.tsv"
"$BIN" sequence --database t_vec >/dev/null  # the outbox becomes deliveries (no instance runs)
stored=$($PYM -c "
import pymongo,sys
db=pymongo.MongoClient('$URI')['t_vec']
rows={}
for l in open('$TMP/vectors.tsv'):
    k,h,lane=l.rstrip('\n').split('\t'); rows[k]=int(lane)
import mongo_deliveries as md
bad=[d['key'] for d in md.find(db) if rows.get(d['key'])!=d['lane']]
assert md.count(db)==$n
print(len(bad))")
check_eq "stored lanes of $n published keys equal the vectors" "0 0" "$bad $stored"

# ------------------------------------------------------------------ publish -> key order
log "publish and key order"
DB=t_order
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/a" --options "{\"secret\":\"$SECRET\",\"concurrency\":8}" --database $DB >/dev/null
out=$("$BIN" handler create shortkey http "$HOOK/a" --options '{"secret":"whsec_dGVzdA=="}' --database $DB 2>&1)
rc=$?
check_eq "handler create refuses a secret key shorter than 24 bytes (exit 2)" "2 1" \
    "$rc $(grep -c 'at least 24 bytes' <<<"$out")"
"$BIN" route 'order.*' hook --database $DB
"$BIN" route 'order.created' hook --wire orders.v1.created --database $DB
# CloudEvents from the same builder as the extension's, with the sidecar's source.
"$BIN" handler create ce http "$HOOK/ce" --options '{"cloudevents":"binary"}' --database $DB >/dev/null
"$BIN" route 'ce.x' ce --database $DB
"$BIN" publish ce.x '{"c":1}' --key ck --database $DB >/dev/null || fail "publish ce.x"
: >"$TMP/pub_a"
for i in $(seq 1 120); do
    if ((i % 10 == 0)); then
        "$BIN" publish order.created "{\"n\":$i}" --database $DB >/dev/null || fail "publish $i"
        echo "{\"payload\":{\"n\":$i}}" >>"$TMP/pub_a"
    else
        "$BIN" publish order.created "{\"n\":$i}" --key "order-$((i % 7))" --priority $((i % 4)) --database $DB \
            >/dev/null || fail "publish $i"
        echo "{\"payload\":{\"n\":$i},\"key\":\"order-$((i % 7))\"}" >>"$TMP/pub_a"
    fi
done
start_instance one $DB
P1=$IPID
if wait_until 60 has_requests /a 120; then pass "receiver got 120 requests"; else fail "receiver got $(count_path /a) of 120"; fi
wait_until 10 pending_is $DB 0
analyze --path /a --published "$TMP/pub_a" --secret "$SECRET"
check_eq "every delivery once, in key order, seqs in publish order, signatures verify" \
    "missing=0 dups=0 extra=0 order=0 seq_mismatch=0 gaps=0 publish_order=0 badsig=0 env=0" \
    "missing=${R[missing]} dups=${R[dups]} extra=${R[extra]} order=${R[order_violations]} seq_mismatch=${R[seq_mismatch]} gaps=${R[seq_gap_keys]} publish_order=${R[publish_order]} badsig=${R[bad_signature]} env=${R[envelope_errors]}"
topic=$(curl -s "$HOOK/_requests" | $PY -c "import json,sys; print(sorted({json.loads(r['body'])['topic'] for r in json.load(sys.stdin) if r['path']=='/a'}))")
check_eq "the most specific route's wire name is the topic" "['orders.v1.created']" "$topic"
ce=$(curl -s "$HOOK/_requests" | $PY -c "
import json,sys
for r in json.load(sys.stdin):
    if r['path']=='/ce':
        h=r['headers']; print(h.get('ce-source'), h.get('ce-type'), h.get('ce-subject'), h.get('ce-relaybusseq'), json.loads(r['body']))")
check_eq "cloudevents binary: source /relaybus-mongo/<database>, type, subject, seq, the payload as body" \
    "/relaybus-mongo/t_order ce.x ck 1 {'c': 1}" "$ce"
check_eq "metrics: delivered_total" 120 "$(metric one 'relaybus_mongo_delivered_total{handler="hook"}')"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://$(metrics_addr one)/healthz")
check_eq "/healthz answers 200" 200 "$code"
# SIGHUP reloads settings; SIGTERM drains and releases the lanes.
kill -HUP "$P1"
wait_until 5 grep -q '"configuration reloaded"' "$TMP/one.err" && pass "SIGHUP reloads the configuration" || fail "no reload log line"
stop_instance "$P1"
check_eq "SIGTERM exits 0" 0 "$STOP_RC"
grep -q '"released":\[' "$TMP/one.err" && grep '"msg":"lanes"' "$TMP/one.err" | tail -1 | grep -q '"held":0' &&
    pass "SIGTERM released every lane" || fail "lanes not released" "$(grep '"lanes"' "$TMP/one.err" | tail -2)"
start_instance one_again $DB
wait_until 5 grep -q '"held":64' "$TMP/one_again.err" && pass "a new instance takes the released lanes at once" ||
    fail "released lanes not taken at once"
stop_instance "$IPID"
grep -c '"level"' "$TMP/one.err" >/dev/null && ! grep -v '^{' "$TMP/one.err" | grep -q . &&
    pass "logs are JSON lines" || fail "non-JSON log lines" "$(grep -v '^{' "$TMP/one.err" | head -3)"

# ------------------------------------------------------------------ two instances share a backlog
log "two instances, preloaded backlog"
DB=t_two
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/b" --options '{"concurrency":16}' --database $DB >/dev/null
"$BIN" route 'job.*' hook --database $DB
$PYM "$INTEG/mongo_preload.py" "$URI" $DB job.run 400 40 15 >"$TMP/pub_b" || fail "preload"
control /b '[{"delay": 0.02, "repeat": true}]'
start_instance two_x $DB
PX=$IPID
start_instance two_y $DB
PY_=$IPID
if wait_until 90 has_requests /b 400; then pass "400 deliveries with two instances"; else fail "got $(count_path /b) of 400"; fi
wait_until 10 pending_is $DB 0
analyze --path /b --published "$TMP/pub_b"
check_eq "two instances: none lost, none twice, key order kept" \
    "missing=0 dups=0 extra=0 order=0 gaps=0" \
    "missing=${R[missing]} dups=${R[dups]} extra=${R[extra]} order=${R[order_violations]} gaps=${R[seq_gap_keys]}"
dx=$(metric two_x 'relaybus_mongo_delivered_total{handler="hook"}')
dy=$(metric two_y 'relaybus_mongo_delivered_total{handler="hook"}')
if ((${dx:-0} > 0 && ${dy:-0} > 0 && dx + dy == 400)); then pass "both instances delivered ($dx + $dy)"; else fail "delivered by x=$dx y=$dy"; fi
stop_instance $PX
stop_instance $PY_
control /b '[]'

# ------------------------------------------------------------------ kill -9 mid-run
log "kill -9 of one instance mid-run"
DB=t_kill
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/c" --options '{"concurrency":16}' --database $DB >/dev/null
"$BIN" route 'job.*' hook --database $DB
$PYM "$INTEG/mongo_preload.py" "$URI" $DB job.run 400 30 20 >"$TMP/pub_c" || fail "preload"
control /c '[{"delay": 0.05, "repeat": true}]'
start_instance kill_x $DB
PX=$IPID
start_instance kill_y $DB
PY_=$IPID
wait_until 60 has_requests /c 100
kill -9 $PX
wait $PX 2>/dev/null
log "killed instance x after $(count_path /c) requests"
if wait_until 90 pending_is $DB 0; then pass "the survivor finished the backlog"; else fail "pending left: $(stats_field $DB pending)"; fi
analyze --path /c --published "$TMP/pub_c"
# Key order of first deliveries: a run the killed instance sent and did not
# settle is sent again by the survivor, so its seqs may arrive a second time
# after later ones (at least once); a seq arriving for the first time below
# its key's last one would break the order.
check_eq "kill -9: nothing lost, key order kept (duplicates allowed after the lease loss)" \
    "missing=0 extra=0 first_order=0 gaps=0" \
    "missing=${R[missing]} extra=${R[extra]} first_order=${R[first_order_violations]} gaps=${R[seq_gap_keys]}"
log "kill -9 duplicates: ${R[dups]}; repeats arriving after later seqs: ${R[order_violations]} (${R[order_sample]})"
grep -q '"taken":\[' "$TMP/kill_y.err" && pass "the survivor took over the dead instance's lanes" || fail "no takeover"
stop_instance $PY_
control /c '[]'

# ------------------------------------------------------------------ retries, dead letters, replay
log "retries, dead letters, replay"
DB=t_retry
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/d" --database $DB \
    --options '{"max_attempts":3,"backoff_base":"100ms","backoff_max":"200ms"}' >/dev/null
"$BIN" handler create gone http "$HOOK/e" --database $DB >/dev/null
"$BIN" handler create slow http "$HOOK/f" --database $DB >/dev/null
"$BIN" route 'r.#' hook --database $DB
"$BIN" route 'g.#' gone --database $DB
"$BIN" route 's.#' slow --database $DB
control /d '[{"status":500},{"status":503},{"status":500}]'
control /e '[{"status":404}]'
control /f '[{"status":429,"retry_after":"1"}]'
: >"$TMP/pub_d"
"$BIN" publish r.one '{"v":1}' --key k1 --database $DB >>"$TMP/pub_d"
"$BIN" publish r.one '{"v":2}' --key k1 --database $DB >>"$TMP/pub_d"
"$BIN" publish g.one '{"v":3}' --key k2 --database $DB >/dev/null
"$BIN" publish s.one '{"v":4}' --key k3 --database $DB >/dev/null
start_instance retry $DB
P1=$IPID
# A real Prometheus scrapes this instance: docs/grafana/relaybus-mongo.json's
# panels are checked against it below.
wait_metrics_addr retry && start_prometheus "$(metrics_addr retry)"
check_eq "a Prometheus server scrapes the instance" 0 "$?"
wait_until 30 has_requests /d 4
wait_until 30 has_requests /f 2
wait_until 10 pending_is $DB 0
attempts=$(curl -s "$HOOK/_requests" | $PY -c "
import json,sys
rs=[json.loads(r['body']) for r in json.load(sys.stdin) if r['path']=='/d']
print(' '.join(f\"{b['seq']}:{b['attempt']}\" for b in rs))")
check_eq "5xx retried up to max_attempts, then the key's next delivery" "1:1 1:2 1:3 2:1" "$attempts"
gap=$(curl -s "$HOOK/_requests" | $PY -c "
import json,sys
ts=[r['t'] for r in json.load(sys.stdin) if r['path']=='/f']
print('ok' if len(ts)==2 and ts[1]-ts[0] >= 0.9 else ts)")
check_eq "429 honours Retry-After" ok "$gap"
check_eq "stats: two dead letters (3 x 5xx, a 404)" 2 "$(stats_field $DB dead)"
dl=$($PYM -c "
import pymongo
db=pymongo.MongoClient('$URI')['$DB']
print(sorted((d['handler'], d['attempts'], d.get('last_status'), d['last_error']) for d in db.relay_dead_letters.find()))")
check_eq "dead letters keep attempts, status and error" "[('gone', 1, 404, 'HTTP 404'), ('hook', 3, 500, 'HTTP 500')]" "$dl"
check_rc "replay --handler of an unknown handler fails" 2 'handler "nope" does not exist' "$BIN" replay --handler nope --database $DB
check_rc "replay moves the dead letters back" 0 '"replayed":2' "$BIN" replay --database $DB
wait_until 20 has_requests /e 2
wait_until 10 pending_is $DB 0
check_eq "replayed deliveries are delivered" "0 0" "$(stats_field $DB dead) $(stats_field $DB pending)"
check_eq "metrics: dead_total for hook" 1 "$(metric retry 'relaybus_mongo_dead_total{handler="hook"}')"
prom_value() {
    curl -sf "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/query" --data-urlencode "query=$1" -G |
        $PY -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'
}
scraped() { [[ $(prom_value 'relaybus_mongo_dead_total{handler="hook"}') == 1 && $(prom_value 'count_over_time(up[1m])') -ge 5 ]]; }
wait_until 30 scraped && pass "Prometheus scraped the final counts (5 scrapes or more)" || fail "Prometheus did not scrape the final counts"
dashboard_queries "$ROOT/docs/grafana/relaybus-mongo.json" >"$TMP/queries.txt"
while IFS='|' read -r n title expr; do
    check_eq "dashboard panel \"$title\": $expr returns series" yes "$( ((n > 0)) && echo yes || echo "no ($n)")"
done <"$TMP/queries.txt"
check_eq "dashboard: every panel's query was run" \
    "$($PY -c 'import json, sys; print(sum(len(p["targets"]) for p in json.load(open(sys.argv[1]))["panels"]))' "$ROOT/docs/grafana/relaybus-mongo.json")" \
    "$(wc -l <"$TMP/queries.txt")"
stop_instance $P1

# Outbound policy: without the allow-list, loopback is refused and dead-lettered at once.
DB=t_policy
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/p" --database $DB >/dev/null
"$BIN" route 'p.#' hook --database $DB
"$BIN" publish p.x '{}' --database $DB >/dev/null
"$BIN" run --database $DB --instance policy --lease 3s --poll-interval 50ms --metrics-listen '' \
    >"$TMP/policy.out" 2>"$TMP/policy.err" &
P1=$!
PIDS+=($P1)
wait_until 15 bash -c "[[ \$('$BIN' stats --database $DB) == *'\"dead\":1'* ]]"
err=$($PYM -c "
import pymongo
print(pymongo.MongoClient('$URI')['$DB'].relay_dead_letters.find_one()['last_error'])")
[[ "$err" == *"not allowed (loopback)"* && "$(count_path /p)" == 0 ]] && pass "loopback refused without http_allowlist" ||
    fail "outbound policy" "$err"
stop_instance $P1

# ------------------------------------------------------------------ bad configuration and input
log "bad configuration, input and documents"
echo '{"lease": "3s", "bogus": 1}' >"$TMP/bad.json"
echo '{"lease": ' >"$TMP/broken.json"
check_rc "bad duration flag" 2 'option --lease: setting "lease": not a duration' "$BIN" stats --lease 5parsecs
check_rc "unknown flag" 2 'unknown option --frobnicate' "$BIN" stats --frobnicate 1
check_rc "config file: unknown setting" 2 "config file .*bad.json: unknown setting \"bogus\"" "$BIN" stats --config "$TMP/bad.json"
check_rc "config file: invalid JSON" 2 "config file .*broken.json: .*parse error" "$BIN" stats --config "$TMP/broken.json"
check_rc "config file missing" 2 "cannot be read" "$BIN" stats --config "$TMP/nope.json"
check_rc "environment variable out of range" 2 'RELAYBUS_MONGO_BATCH_SIZE: setting "batch_size": must be an integer between 1 and 10000' \
    env RELAYBUS_MONGO_BATCH_SIZE=0 "$BIN" stats
check_rc "bad allow-list" 2 'setting "http_allowlist"' "$BIN" run --http-allowlist '10.0.0.0/99'
check_rc "unknown command" 2 'unknown command "frob"' "$BIN" frob
check_rc "server unreachable" 1 'error: .*(No suitable servers|connection|Failed)' \
    "$BIN" stats --uri 'mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300&connectTimeoutMS=300'
DB=t_order
check_rc "publish: invalid JSON payload" 2 'payload is not valid JSON' "$BIN" publish order.x '{"a":' --database $DB
check_rc "publish: invalid topic" 2 'invalid topic "order..x": segment 2 is empty' "$BIN" publish order..x '{}' --database $DB
check_rc "publish: priority out of range" 2 'priority must be 0, 1, 2 or 3' "$BIN" publish order.x '{}' --priority 7 --database $DB
check_rc "publish: empty key" 2 'key must not be empty' "$BIN" publish order.x '{}' --key '' --database $DB
check_rc "publish: headers not an object" 2 'headers must be a JSON object' "$BIN" publish order.x '{}' --headers '[1]' --database $DB
check_rc "publish: bad --not-before" 2 'neither a duration' "$BIN" publish order.x '{}' --not-before yesterday --database $DB
check_rc "publish: payload too large" 2 'payload is too large' "$BIN" publish order.x '"xxxxxxxxxxxxxxxxxxxx"' --max-payload-bytes 10 --database $DB
check_rc "handler: bad URL" 2 'invalid target' "$BIN" handler create h2 http 'ftp://x/' --database $DB
check_rc "handler: bad options" 2 'invalid options' "$BIN" handler create h2 http "$HOOK/x" --options '{"max_attempts":0}' --database $DB
check_rc "handler: notify is PostgreSQL-only" 2 'not served by relaybus-mongo' "$BIN" handler create h2 notify chan --database $DB
check_rc "route to an unknown handler" 2 'handler "nope" does not exist' "$BIN" route 'x.*' nope --database $DB
check_rc "route: bad pattern" 2 'invalid pattern' "$BIN" route 'x..*' hook --database $DB

# Bad documents written straight into relay_deliveries (an application bug):
# dead-lettered with the reason, and the good delivery behind them still flows.
DB=t_baddoc
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/g" --database $DB >/dev/null
"$BIN" route 'b.#' hook --database $DB
$PYM -c "
import pymongo, datetime
db=pymongo.MongoClient('$URI')['$DB']
now=datetime.datetime.now(datetime.timezone.utc)
base={'event_id':1,'handler':'hook','priority':1,'not_before':now,'published_at':now,'attempt':0,'topic':'b.x','payload':{}}
db.relay_deliveries.insert_many([
  dict(base, _id=900001, key='kx', lane=5, seq=1),                      # wrong lane for the key
  dict({k:v for k,v in base.items() if k!='payload'}, _id=900002, key='order-42', lane=$("$BIN" lane order-42 | cut -f3), seq=0),  # no payload; before the sequencer's seq 1
  dict(base, _id=900003, lane=7, seq=900003, priority=9),               # priority out of range
])"
"$BIN" publish b.ok '{"fine":true}' --key order-42 --database $DB >/dev/null
start_instance baddoc $DB
P1=$IPID
wait_until 20 has_requests /g 1
wait_until 10 pending_is $DB 0
errs=$($PYM -c "
import pymongo
db=pymongo.MongoClient('$URI')['$DB']
for d in db.relay_dead_letters.find().sort('_id'): print(d['_id'], d['last_error'])")
grep -q "900001 malformed delivery document: lane 5 is not the key's lane" <<<"$errs" &&
    grep -q '900002 malformed delivery document: payload is missing' <<<"$errs" &&
    grep -q '900003 malformed delivery document: priority must be an integer 0..3' <<<"$errs" &&
    pass "malformed documents are dead-lettered with the reason" || fail "malformed documents" "$errs"
check_eq "the good delivery behind them was delivered" 1 "$(count_path /g)"
kill -0 $P1 2>/dev/null && pass "the dispatcher survived bad documents" || fail "dispatcher died"
stop_instance $P1

# ------------------------------------------------------------------ allow-list narrowed under load
# A reloaded http_allowlist applies at once, with requests in flight and on
# kept-alive connections: nothing reaches 127.0.0.1 a second after SIGHUP.
log "allow-list narrowed under load"
DB=t_allow
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/al" --options '{"concurrency":4,"max_attempts":2}' --database $DB >/dev/null
"$BIN" route 'al.#' hook --database $DB
# The first delivery is answered after 6 s: a request is in flight all along.
control /al '[{"delay": 6, "match": "{\"id\":1,"}, {"delay": 0.2, "repeat": true}]'
$PYM "$INTEG/mongo_preload.py" "$URI" $DB al.x 300 8 >/dev/null || fail "preload"
echo '{"http_allowlist": "127.0.0.1"}' >"$TMP/allow.json"
"$BIN" run --database $DB --instance allow --lease 3s --poll-interval 50ms --metrics-listen '' \
    --config "$TMP/allow.json" >"$TMP/allow.out" 2>"$TMP/allow.err" &
P1=$!
PIDS+=($P1)
wait_until 20 has_requests /al 12 || fail "requests to /al did not flow"
echo '{"http_allowlist": "127.0.0.2"}' >"$TMP/allow.json"
kill -HUP $P1
wait_until 5 grep -q '"configuration reloaded"' "$TMP/allow.err" || fail "no reload log line"
t_reload=$(date +%s.%N)
sleep 2.5  # a window in which no request may arrive (the slow one is still in flight)
read -r total late < <(curl -s "$HOOK/_requests" | $PY -c "import json,sys
rs = [r for r in json.load(sys.stdin) if r['path'] == '/al']
print(len(rs), sum(1 for r in rs if r['t'] > $t_reload + 1.0))")
log "requests to /al: $total, $late of them more than 1 s after the reload"
check_eq "no request reaches 127.0.0.1 later than 1 s after the reload narrowed the allow-list" 0 "$late"
stop_instance $P1

# ------------------------------------------------------------------ fencing: a lane lost and taken again
# An instance frozen past its lease loses its lanes to another; once that one
# gave them back, the frozen one wakes and takes them again. The result of the
# request it had in flight before must not be completed: its receipt is the
# lane under the old tenure (before, any lane held at flush time counted).
# fence_setup DB PATH: one event for a handler at PATH whose first request
# is answered after 4 s (in flight while its sender is frozen), the others at once.
fence_setup() {
    "$BIN" init --database "$1" >/dev/null
    "$BIN" handler create hook http "$HOOK$2" --database "$1" >/dev/null
    "$BIN" route 'fence.*' hook --database "$1"
    control "$2" '[{"delay": 4}, {"repeat": true}]'
    "$BIN" publish fence.x '{"n":1}' --key f1 --database "$1" >/dev/null
}
# fence_check NAME WHAT: the woken instance NAME dropped the result of before,
# took the lanes again and completed nothing.
fence_check() {
    wait_until 15 grep -q '"msg":"result dropped: lane lease not held"' "$TMP/$1.err" ||
        fail "no 'result dropped' log line" "$(tail -5 "$TMP/$1.err")"
    wait_until 10 took_lanes_again "$1" || fail "the woken instance did not take the lanes again"
    check_eq "$2 (dropped 1, delivered 0)" "1 0" \
        "$(metric "$1" 'relaybus_mongo_dropped_total{handler="hook"}') $(metric "$1" 'relaybus_mongo_delivered_total{handler="hook"}' | grep . || echo 0)"
}
log "a lane lost and taken again completes nothing claimed before"
DB=t_fence
fence_setup $DB /fence
start_instance fence_a $DB
PA=$IPID
wait_until 15 has_requests /fence 1 || fail "no first request to /fence"
kill -STOP "$PA"
start_instance fence_b $DB  # takes the lanes once fence_a's lease ran out, sends it again
PB=$IPID
wait_until 20 has_requests /fence 2 && wait_until 10 pending_is $DB 0 ||
    fail "the second instance did not deliver" "$(tail -3 "$TMP/fence_b.err")"
stop_instance "$PB"  # gives the lanes back
kill -CONT "$PA"
fence_check fence_a "the woken instance took the lanes again and completed nothing of before"
stop_instance "$PA"

# ------------------------------------------------------------------ fencing: a lease renewed after it ran out
# The same loss, with the instance frozen inside its lease tick, between the
# read of the lane documents and its lease insert (as a loaded machine's slow
# store can leave it). It wakes with the lane documents as they were before
# the other instance came, and renews into epochs that instance used and
# deleted as it went (each tick deletes the three below its new epoch): the
# inserts succeed. A renewal acknowledged after the lease ran out must not
# continue the tenure: the result of before is still dropped.
log "a lease renewed after it ran out, from lane documents read before, completes nothing claimed before"
DB=t_fence_stale
fence_setup $DB /fence_stale
slow_link_to fstale 0 find:relay_lanes  # only the reads of the lane documents, and only once told
start_instance fstale_a $DB --uri "$SLOW_URI"
PA=$IPID
wait_until 15 has_requests /fence_stale 1 || fail "no first request to /fence_stale"
echo 1000 >"$TMP/fstale_delay"  # the next tick's read of the lanes is answered once this is 0 again
held_reply() { (($(cat "$TMP/fstale_held" 2>/dev/null || echo 0) > 0)); }
wait_until 15 held_reply || fail "the instance read no lane documents through the link"
kill -STOP "$PA"
start_instance fstale_b $DB  # takes the lanes once fstale_a's lease ran out, sends it again
PB=$IPID
wait_until 20 has_requests /fence_stale 2 && wait_until 10 pending_is $DB 0 ||
    fail "the second instance did not deliver" "$(tail -3 "$TMP/fstale_b.err")"
sleep 3.5  # three more ticks: the epochs fstale_a renews into next are deleted
stop_instance "$PB"
echo 0 >"$TMP/fstale_delay"
no_held_reply() { ! held_reply; }
wait_until 10 no_held_reply  # the old reply now waits in the stopped instance's socket
kill -CONT "$PA"
fence_check fstale_a "the instance woken inside its tick took the lanes again and completed nothing of before"
grep -q '"msg":"lease renewed too late' "$TMP/fstale_a.err" && pass "the late renewal was logged as such" ||
    fail "no 'lease renewed too late' log line" "$(grep -c . "$TMP/fstale_a.err") lines"
stop_instance "$PA"

log "done"
finish
