#!/usr/bin/env bash
# relaybus-mongo's kafka handlers (docs/mongo.md, "Kafka handlers"), with a
# real single-node broker and kcat as the consumer, FerretDB v1.24.2 (SQLite)
# as the store: bad targets and producer options refused as on PostgreSQL;
# events published through the outbox on several keys reach the topic once
# each, a key in one partition in seq order, with relaybus's headers, in
# the partition Kafka's Java client would choose (kafka_murmur2.py); a
# message too large for the producer is dead-lettered with librdkafka's error;
# handler alter moves a running sidecar to a new topic; librdkafka's log
# lines reach the sidecar's log; kill -9 of the sidecar
# mid-delivery loses nothing and keeps per-key order (re-sends only of what
# was in flight); a hot key of 1,000 events pipelined (key_window 32) with a
# kill -9 of the sidecar while its run is in flight (repeats only of that
# run); a message too large for its topic inside a run (dead-lettered, the
# key's later ones after the gap, counted in a log line); the broker away with
# runs in flight (the sink's own timeout, retries, resumption). Ignores the PostgreSQL cluster. Prints "N passed, N failed".
SUITE=mongo_kafka
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"
RELAYBUS_ROOT=$ROOT
source "$INTEG/kafka_lib.sh"
declare -A R

# ------------------------------------------------------------------ refused input (no broker needed)
DB=t_bad
"$BIN" init --database $DB >/dev/null
check_rc "a target without a topic (exit 2)" 2 \
    'relaybus-mongo: error: invalid target: a kafka target needs a topic: kafka://host:port/topic' \
    "$BIN" handler create k1 kafka kafka://127.0.0.1:9092 --database $DB
check_rc "a target without a port (exit 2)" 2 'relaybus-mongo: error: invalid target: ' \
    "$BIN" handler create k1 kafka kafka://127.0.0.1/t --database $DB
check_rc "an http URL as a kafka target (exit 2)" 2 'relaybus-mongo: error: invalid target: ' \
    "$BIN" handler create k1 kafka http://127.0.0.1:9092/t --database $DB
check_rc "no target (exit 2)" 2 'relaybus-mongo: error: invalid target: a kafka handler needs kafka://host:port/topic' \
    "$BIN" handler create k1 kafka --database $DB
check_rc "an unknown librdkafka property (exit 2)" 2 \
    'relaybus-mongo: error: invalid options: option "producer": unknown librdkafka property "no.such"' \
    "$BIN" handler create k1 kafka kafka://127.0.0.1:1/t --options '{"producer": {"no.such": "1"}}' --database $DB
check_rc "a bad property value (exit 2)" 2 'relaybus-mongo: error: invalid options: option "producer": property "linger.ms"' \
    "$BIN" handler create k1 kafka kafka://127.0.0.1:1/t --options '{"producer": {"linger.ms": "x"}}' --database $DB
check_rc "a pinned property (exit 2)" 2 \
    'relaybus-mongo: error: invalid options: option "producer": property "acks" is set by relaybus' \
    "$BIN" handler create k1 kafka kafka://127.0.0.1:1/t --options '{"producer": {"acks": "1"}}' --database $DB
check_rc "a command-running property (exit 2)" 2 \
    'invalid options: option "producer": property "sasl.kerberos.kinit.cmd" is not allowed' \
    "$BIN" handler create k1 kafka kafka://127.0.0.1:1/t --options '{"producer": {"sasl.kerberos.kinit.cmd": "id"}}' \
    --database $DB
check_rc "a webhook secret on a kafka handler (exit 2)" 2 \
    'invalid options: option "secret" is only valid for http handlers' \
    "$BIN" handler create k1 kafka kafka://127.0.0.1:1/t \
    --options '{"secret": "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"}' --database $DB
out=$("$BIN" handler create creds kafka kafka://127.0.0.1:1/t --database $DB \
    --options '{"producer": {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "hunter2"}}' 2>&1)
if [[ $? == 0 ]] && grep -q '"sasl.password":"\[redacted\]"' <<<"$out" && ! grep -q hunter2 <<<"$out"; then
    pass "a kafka handler is created; its output redacts the credentials"
else
    fail "kafka handler create with credentials" "$out"
fi
check_rc "altering to a pinned property (exit 2)" 2 \
    'invalid options: option "producer": property "enable.idempotence" is set by relaybus' \
    "$BIN" handler alter creds --options '{"producer": {"enable.idempotence": "false"}}' --database $DB
check_rc "altering to a target without a topic (exit 2)" 2 'invalid target: a kafka target needs a topic' \
    "$BIN" handler alter creds --target kafka://127.0.0.1:1 --database $DB
check_eq "the refused alters changed nothing; handler list redacts too" \
    'kafka kafka://127.0.0.1:1/t [redacted] SASL_PLAINTEXT' \
    "$("$BIN" handler list --database $DB | $PY -c 'import json,sys; h=json.load(sys.stdin)[0]
print(h["kind"], h["target"], h["options"]["producer"]["sasl.password"], h["options"]["producer"]["security.protocol"])')"

kafka_start || die "the broker did not start"
log "broker at $KAFKA_BOOTSTRAP"

# analyze TOPIC PUB...: what kcat read from TOPIC against the publishers'
# lines ({"payload", "key"?}, payloads distinct; mongo_preload.py), as R[...].
analyze() {
    local line topic=$1
    shift
    kafka_consume "$topic" "$TMP/$topic.json"
    timeout -k 5 10 kcat -L -b "$KAFKA_BOOTSTRAP" -t "$topic" -J >"$TMP/$topic.meta" 2>/dev/null
    R=()
    while IFS= read -r line; do R[${line%%=*}]=${line#*=}; done < <(PYTHONPATH="$INTEG" KAFKA_META="$TMP/$topic.meta" \
        $PY - "$TMP/$topic.json" "$@" <<'PY'
import json, os, sys
from kafka_murmur2 import java_partition
canon = lambda v: json.dumps(v, sort_keys=True, separators=(",", ":"))
pub = {}
for f in sys.argv[2:]:
    for l in open(f):
        if l.strip():
            p = json.loads(l)
            pub[canon(p["payload"])] = p
msgs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
msgs.sort(key=lambda m: (m["partition"], m["offset"]))
seen, parts, last, seqs, nth = {}, {}, {}, {}, {}
out_of_order = publish_order = bad_headers = 0
for m in msgs:
    h = dict(zip(m["headers"][0::2], m["headers"][1::2])) if m.get("headers") else {}
    c = canon(json.loads(m["payload"]))
    seen[c] = seen.get(c, 0) + 1
    p = pub.get(c)
    key = m.get("key")
    if p is None or key != p.get("key") or h.get("relay-key") != p.get("key"):
        bad_headers += 1
    if not h.get("relay-id") or not h.get("relay-event-id") or h.get("relay-topic") != "o.e" \
            or "relay-published-at" not in h or not h.get("relay-attempt"):
        bad_headers += 1
    if key is None:
        continue
    parts.setdefault(key, set()).add(m["partition"])
    seq = int(h["relay-seq"])
    prev, prev_n = last.get(key, (0, -1))
    if seq == prev:  # a re-send of the previous message (its completion was lost)
        continue
    if seq != prev + 1:
        out_of_order += 1
    n = json.loads(m["payload"])["n"]
    if n <= prev_n:
        publish_order += 1
    last[key] = (max(prev, seq), n)
    seqs.setdefault(key, []).append(seq)
per_key = {}
for p in pub.values():
    if "key" in p:
        per_key[p["key"]] = per_key.get(p["key"], 0) + 1
print("messages=%d" % len(msgs))
print("missing=%d" % len(set(pub) - set(seen)))
print("extra=%d" % len(set(seen) - set(pub)))
print("duplicates=%d" % sum(c - 1 for c in seen.values()))
print("keys_in_one_partition=%s" % all(len(p) == 1 for p in parts.values()))
print("partitions=%d" % len(set().union(*parts.values())) if parts else "partitions=0")
print("out_of_order=%d" % out_of_order)
print("publish_order=%d" % publish_order)
print("seq_gap_keys=%d" % sum(1 for k, n in per_key.items() if seqs.get(k) != list(range(1, n + 1))))
print("bad_headers=%d" % bad_headers)
# The Java client's partition for each key (the default partitioner).
nparts = len(json.load(open(os.environ["KAFKA_META"]))["topics"][0]["partitions"])
print("off_java=%d" % sum(1 for k, ps in parts.items() if ps != {java_partition(k, nparts)}))
PY
)
    [[ -n "${R[messages]:-}" ]]
}
report() {
    echo "missing=${R[missing]:-?} extra=${R[extra]:-?} one_partition=${R[keys_in_one_partition]:-?} order=${R[out_of_order]:-?} publish_order=${R[publish_order]:-?} gaps=${R[seq_gap_keys]:-?} headers=${R[bad_headers]:-?} off_java=${R[off_java]:-?}"
}
CLEAN="missing=0 extra=0 one_partition=True order=0 publish_order=0 gaps=0 headers=0 off_java=0"
dead_letter() {  # DB HANDLER: "attempts|last_error" of its dead letter
    $PYM -c "
import pymongo
d = pymongo.MongoClient('$URI')['$1'].relay_dead_letters.find_one({'handler': '$2'})
print('%s|%s' % (d.get('attempts'), d.get('last_error')) if d else 'none')"
}
dead_is_there() { [[ "$(dead_letter "$@")" != none ]]; }
outbox_and_pending() {
    $PYM -c "
import pymongo, mongo_deliveries as md
db = pymongo.MongoClient('$URI')['$1']
print(db.relay_outbox.count_documents({}) + md.count(db))"
}
drained() { [[ "$(outbox_and_pending "$1")" == 0 ]]; }
# drains DB STALL MAX: waits until DB is drained, as long as what is left keeps
# falling: false once nothing went for STALL seconds, or after MAX in all. A
# loaded machine's FerretDB takes seconds per delete (a key_window-1 key's
# every round waits for one), so a fixed bound on the whole drain measured
# the machine: at load 27 a drain of 600 took longer than 60 s while falling
# all along. A stall (nothing delivered for STALL s) is what is wrong.
drains() {
    local db=$1 stall=$2 max=$3 left last=-1 t0=$SECONDS since=$SECONDS
    while ((SECONDS - t0 < max)); do
        left=$(outbox_and_pending "$db")
        [[ $left == 0 ]] && return 0
        if [[ $left != "$last" ]]; then last=$left since=$SECONDS; fi
        ((SECONDS - since >= stall)) && { echo "stalled at $left for ${stall} s" >"$TMP/drain.why"; return 1; }
        sleep 1
    done
    echo "still $left after ${max} s" >"$TMP/drain.why"
    return 1
}
none_pending_of() {  # DB HANDLER
    [[ "$($PYM -c "import pymongo, mongo_deliveries as md; print(md.count(pymongo.MongoClient('$URI')['$1'], {'handler': '$2'}))")" == 0 ]]
}

# kafka_db DB TOPIC OPTIONS [HANDLER]: a fresh database DB whose kafka
# handler (k) produces into TOPIC, routed 'o.#'.
kafka_db() {
    DB=$1
    "$BIN" init --database "$DB" >/dev/null
    "$BIN" handler create "${4:-k}" kafka "kafka://$KAFKA_BOOTSTRAP/$2" --database "$DB" --options "$3" >/dev/null ||
        die "handler create ${4:-k}"
    "$BIN" route 'o.#' "${4:-k}" --database "$DB"
}

# ------------------------------------------------------------------ delivery: keys, order, headers, once each
log "110 events (100 on 5 keys, 10 unkeyed) through the outbox into a 3-partition topic"
DB=t_flow
"$BIN" init --database $DB >/dev/null
"$BIN" handler create k kafka "kafka://$KAFKA_BOOTSTRAP/mk-flow" --database $DB \
    --options '{"concurrency": 64, "backoff_base": "100ms", "backoff_max": "1s"}' >/dev/null || die "handler create k"
"$BIN" route 'o.#' k --database $DB
# Too large for the producer's message.max.bytes: dead at once, librdkafka's error.
"$BIN" handler create big kafka "kafka://$KAFKA_BOOTSTRAP/mk-big" --database $DB \
    --options '{"max_attempts": 10, "backoff_base": "100ms", "producer": {"message.max.bytes": "1000"}}' >/dev/null
"$BIN" route 'big.#' big --database $DB
# A broker nobody listens on: librdkafka's complaints go to the sidecar's log
# (a short timeout: the SIGTERM drain below waits for its attempt in flight).
"$BIN" handler create down kafka "kafka://127.0.0.1:1/mk-down" --database $DB \
    --options '{"timeout": "1s", "backoff_base": "100ms"}' >/dev/null
"$BIN" route 'down.#' down --database $DB
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 110 5 11 --tag flow >"$TMP/pub_flow" || fail "preload"
"$BIN" publish big.x "{\"blob\": \"$(head -c 3000 /dev/zero | tr '\0' x)\"}" --key b --database $DB >/dev/null
"$BIN" publish down.x '{"d": 1}' --key d --database $DB >/dev/null
start_instance flow $DB
PF=$IPID
if wait_until 40 kafka_has mk-flow 110 && wait_until 20 none_pending_of $DB k; then
    pass "110 messages in the topic, every delivery completed"
else
    fail "110 messages" "topic: $(wc -l <"$TMP/has.json"), pending: $(stats_field $DB pending)" "$(grep -v '"level":"info"' "$TMP/flow.err" | tail -n 5)"
fi
analyze mk-flow "$TMP/pub_flow" || fail "could not read the topic back"
log "flow: messages=${R[messages]} duplicates=${R[duplicates]} partitions=${R[partitions]} $(report)"
check_eq "every event once, a key in one partition (the Java client's) in seq (and publish) order, relay-* headers" \
    "$CLEAN duplicates=0" "$(report) duplicates=${R[duplicates]}"
if ((${R[partitions]:-0} > 1)); then pass "the keys spread over ${R[partitions]} partitions"; else fail "keys in ${R[partitions]} partition(s)"; fi
check_eq "the sidecar counts them delivered (/metrics)" 110 "$(metric flow 'relaybus_mongo_delivered_total{handler="k"}')"
if wait_until 20 dead_is_there $DB big; then
    check_eq "too large for the producer: dead on its first attempt with librdkafka's error" \
        "1|kafka: Broker: Message size too large (MSG_SIZE_TOO_LARGE)" "$(dead_letter $DB big)"
else
    fail "the too-large message is not dead-lettered" "$(stats_field $DB dead)"
fi
if wait_until 20 grep -q '"msg":"kafka relaybus-down' "$TMP/flow.err"; then
    pass "librdkafka's lines for the unreachable broker are in the sidecar's log"
else
    fail "no librdkafka line for the unreachable broker in the sidecar's log"
fi
# handler alter: a running sidecar produces to the new topic from its next
# catalog read (unkeyed events: the keys above would continue their seqs).
"$BIN" handler alter k --target "kafka://$KAFKA_BOOTSTRAP/mk-flow2" --database $DB >/dev/null || fail "handler alter k"
sleep 1.5  # the catalog is read every lease/3 (1 s here): publish after that
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 5 5 1 --tag altered >"$TMP/pub_altered" || fail "preload"
if wait_until 20 kafka_has mk-flow2 5; then
    analyze mk-flow2 "$TMP/pub_altered" && check_eq "after handler alter: the new topic gets the new events" \
        "$CLEAN duplicates=0" "$(report) duplicates=${R[duplicates]}"
    check_eq "and the old topic none of them" 110 "$(kafka_count mk-flow)"
else
    fail "after handler alter: no messages in the new topic" "$(grep -v '"level":"info"' "$TMP/flow.err" | tail -n 3)"
fi
t0=$(date +%s%N)
stop_instance $PF
check_eq "SIGTERM with a kafka message in flight: exit 0" 0 "$STOP_RC"
if (($(date +%s%N) - t0 < 5000000000)); then pass "it stopped within 5 s"; else fail "SIGTERM took $((($(date +%s%N) - t0) / 1000000)) ms"; fi

# ------------------------------------------------------------------ kill -9 mid-delivery
# key_window 1: a key has one message in flight. linger.ms slows each key's
# round, so the kill finds deliveries in flight and pending.
KEYS=20
log "kill -9 of the sidecar mid-delivery: 600 events on $KEYS keys"
kafka_db t_kill mk-kill \
    '{"concurrency": 64, "key_window": 1, "backoff_base": "100ms", "backoff_max": "1s", "producer": {"linger.ms": "200"}}'
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 600 $KEYS --tag kill --many >"$TMP/pub_kill" || fail "preload"
start_instance kill_a $DB
PA=$IPID
wait_until 40 kafka_has mk-kill 60 || fail "fewer than 60 messages before the kill"
kill -9 $PA
wait $PA 2>/dev/null
left=$(outbox_and_pending $DB)
at_kill=$(kafka_count mk-kill)
log "killed after $at_kill messages; $left outbox documents and deliveries left"
if ((left > 0 && at_kill < 600)); then pass "killed mid-delivery ($at_kill of 600 in the topic)"; else fail "not mid-delivery: $at_kill in the topic, $left left"; fi
start_instance kill_b $DB
PB=$IPID
t1=$SECONDS
if drains $DB 60 300 && wait_until 20 kafka_has mk-kill 600; then
    pass "the next sidecar took the lanes over and finished ($((SECONDS - t1)) s)"
else
    fail "after the kill" "$(cat "$TMP/drain.why" 2>/dev/null); left: $(outbox_and_pending $DB), topic: $(kafka_count mk-kill)" \
        "$($PYM -c "import pymongo, mongo_deliveries as md; print(md.describe_left(pymongo.MongoClient('$URI')['$DB']))")" \
        "$(grep -v '"level":"info"' "$TMP/kill_b.err" | tail -n 5)" \
        "$(grep -E '"msg":"(lanes|sequencer[^"]*)"' "$TMP/kill_b.err" | tail -n 4)"
fi
analyze mk-kill "$TMP/pub_kill" || fail "could not read the topic back"
log "kill -9: messages=${R[messages]} duplicates=${R[duplicates]} $(report)"
check_eq "kill -9: nothing lost, a key in one partition in seq order (re-sends collapsed)" "$CLEAN" "$(report)"
if ((${R[duplicates]:-999} <= KEYS)); then pass "re-sends only of what was in flight (${R[duplicates]} <= one per key)"; else fail "too many duplicates: ${R[duplicates]}"; fi
stop_instance $PB

# seq_facts TOPIC_JSON PUB...: by relay-seq, against each key's count in the
# publishers' lines (a fresh database: seqs 1..n). Line 1: missing (seqs never
# in the topic), skips (a message past its key's next seq: in partition order
# each is the next seq, or a step back from which the key goes on one by one,
# i.e. a run produced again whole), partitions per key at most 1 (one=True);
# line 2: duplicates, rewinds (such steps back), max_rewind (the longest).
seq_facts() {
    $PY - "$@" <<'PY'
import json, sys
n = {}
for f in sys.argv[2:]:
    for l in open(f):
        if l.strip() and "key" in json.loads(l):
            k = json.loads(l)["key"]
            n[k] = n.get(k, 0) + 1
msgs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
msgs.sort(key=lambda m: (m["partition"], m["offset"]))
seen, parts, nxt, top = {}, {}, {}, {}
skips = rewinds = max_rewind = 0
for m in msgs:
    k = m.get("key")
    if k is None:
        continue
    seq = int(dict(zip(m["headers"][0::2], m["headers"][1::2]))["relay-seq"])
    parts.setdefault(k, set()).add(m["partition"])
    seen[(k, seq)] = seen.get((k, seq), 0) + 1
    if seq < nxt.get(k, 1):
        rewinds += 1
        max_rewind = max(max_rewind, top.get(k, 0) - seq + 1)
    elif seq > nxt.get(k, 1):
        skips += 1
    nxt[k], top[k] = seq + 1, max(top.get(k, 0), seq)
missing = sum(1 for k, c in n.items() for s in range(1, c + 1) if (k, s) not in seen)
print("missing=%d skips=%d one=%s" % (missing, skips, all(len(p) == 1 for p in parts.values())))
print("duplicates=%d rewinds=%d max_rewind=%d" % (sum(c - 1 for c in seen.values()), rewinds, max_rewind))
PY
}

# ------------------------------------------------------------------ a hot key pipelined, and kill -9 with windows in flight
# One key, key_window 32. linger.ms 100 holds every produce request 100 ms:
# one message at a time would need 100 s for 1,000 events, a run of 32 in
# flight at once a few seconds. The kill comes while runs are in flight.
HOT=1000
log "a hot key: $HOT events in seq order with key_window 32, kill -9 of the sidecar mid-way"
kafka_db t_hot mk-hot '{"key_window": 32, "backoff_base": "100ms", "backoff_max": "1s", "producer": {"linger.ms": "100"}}'
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e $HOT 1 --tag hot --many >"$TMP/pub_hot" || fail "preload"
start_instance hot_a $DB
PA=$IPID
t0=$(date +%s%N)
wait_until 40 kafka_has mk-hot 150 || fail "fewer than 150 messages before the kill"
kill -9 $PA
wait $PA 2>/dev/null
at_kill=$(kafka_count mk-hot)
left=$(outbox_and_pending $DB)
log "killed after $at_kill messages ($((($(date +%s%N) - t0) / 1000000)) ms); $left outbox documents and deliveries left"
if ((left > 0 && at_kill < HOT)); then pass "killed mid-key ($at_kill of $HOT in the topic)"; else fail "not mid-key: $at_kill in the topic, $left left"; fi
start_instance hot_b $DB
PB=$IPID
t1=$(date +%s%N)
if drains $DB 60 300 && wait_until 20 kafka_has mk-hot $HOT; then
    log "the rest of the hot key in $((($(date +%s%N) - t1) / 1000000)) ms"
else
    fail "the hot key after the kill" "left: $(outbox_and_pending $DB), topic: $(wc -l <"$TMP/has.json")" "$(grep -v '"level":"info"' "$TMP/hot_b.err" | tail -n 5)"
fi
kafka_consume mk-hot "$TMP/mk-hot.json"
# Pipelined, a run's messages are produced together: most follow the
# previous one within 50 ms (the producer's timestamps). One at a time, each
# waits for the previous one's acknowledgement and its own 100 ms linger.
close=$($PY -c 'import json,sys
ts=[m["ts"] for m in sorted((json.loads(l) for l in open(sys.argv[1]) if l.strip()), key=lambda m: m["offset"])]
print("%d of %d" % (sum(1 for a, b in zip(ts, ts[1:]) if b - a < 50), len(ts) - 1))' "$TMP/mk-hot.json")
if (($(awk '{print int(100 * $1 / $3)}' <<<"$close") >= 50)); then
    pass "a hot key's runs are pipelined ($close messages within 50 ms of the previous one, linger.ms 100)"
else
    fail "the hot key was not pipelined: $close messages within 50 ms of the previous one"
fi
# By relay-seq (one key): every seq present; in partition order each message
# is the key's next seq, or a step back from which the key goes on one by
# one (a run produced again whole), never a skip ahead.
hot=$(seq_facts "$TMP/mk-hot.json" "$TMP/pub_hot")
log "hot key after kill -9: ${hot//$'\n'/ }"
check_eq "kill -9 with runs in flight: nothing lost, one partition, no skip ahead" "missing=0 skips=0 one=True" "$(head -n 1 <<<"$hot")"
read -r dups rew maxrew < <(sed -n 2p <<<"$hot" | sed 's/[a-z_]*=//g')
if ((rew <= 1 && maxrew <= 32 && dups <= 32)); then
    pass "repeats only of one contiguous run, at most a window ($dups duplicates, $rew rewind of $maxrew)"
else
    fail "repeats beyond one window" "$(sed -n 2p <<<"$hot")"
fi
stop_instance $PB

# ------------------------------------------------------------------ a message that fails for good inside a run
# As kafka_window.sh (b) for the extension (docs/kafka.md, "A busy key
# pipelined"): seq 5 of a run of 10 of one key is larger than the topic's
# max.message.bytes; batch.size below it keeps the broker's refusal to that
# one's batch. Published before the sidecar starts, so the ten are one run.
log "a message too large for its topic at seq 5 of a run of 10 of one key"
kafka_create_topic mk-gap 1 max.message.bytes=2000 || die "could not create topic mk-gap"
kafka_db t_gap mk-gap '{"key_window": 16, "backoff_base": "100ms", "max_attempts": 10, "producer": {"batch.size": "1500"}}' gap
for i in $(seq 1 10); do
    if ((i == 5)); then body="{\"i\": $i, \"blob\": \"$(head -c 5000 /dev/zero | tr '\0' x)\"}"; else body="{\"i\": $i}"; fi
    "$BIN" publish o.e "$body" --key g --database $DB >/dev/null || fail "publish $i"
done
start_instance gap $DB
PGAP=$IPID
check_eq "the run's ten claimed and settled: nothing pending" ok \
    "$(wait_until 60 dead_is_there $DB gap && wait_until 60 none_pending_of $DB gap && echo ok)"
check_eq "dead on its first attempt with the broker's error, seq 5" \
    "1|kafka: Broker: Message size too large (MSG_SIZE_TOO_LARGE)|5" \
    "$($PYM -c "
import pymongo
d = pymongo.MongoClient('$URI')['$DB'].relay_dead_letters.find_one({'handler': 'gap'})
print('%s|%s|%s' % (d.get('attempts'), d.get('last_error'), d.get('seq')))")"
wait_until 20 kafka_has mk-gap 9 || fail "fewer than nine messages in mk-gap" "$(wc -l <"$TMP/has.json")"
kafka_consume mk-gap "$TMP/mk-gap.json"
check_eq "the key's seqs in the partition: the gap at 5, the later ones after it" "1 2 3 4 6 7 8 9 10" \
    "$($PY -c 'import json,sys
ms=sorted((json.loads(l) for l in open(sys.argv[1]) if l.strip()), key=lambda m: m["offset"])
print(" ".join(dict(zip(m["headers"][0::2], m["headers"][1::2]))["relay-seq"] for m in ms))' "$TMP/mk-gap.json")"
gap_line() { grep -m1 '"msg":"kafka handler gap, key \\"g\\": delivery [0-9]* (seq 5) failed' "$TMP/gap.err"; }
if wait_until 20 gap_line; then
    log "$(gap_line)"
    if grep -q '; 5 later message(s) of the key in flight with it were acknowledged after it' <<<"$(gap_line)"; then
        pass "a log line names the failure and counts the later ones acknowledged after it (5: seqs 6 to 10)"
    else
        fail "the log line counts another number" "$(gap_line)"
    fi
else
    fail "no log line for the failure inside the run" "$(grep -v '"level":"info"' "$TMP/gap.err" | tail -n 3)"
fi
check_eq "the sidecar counts 9 delivered and 1 dead (/metrics)" "9 1" \
    "$(metric gap 'relaybus_mongo_delivered_total{handler="gap"}') $(metric gap 'relaybus_mongo_dead_total{handler="gap"}')"
stop_instance $PGAP

# ------------------------------------------------------------------ the broker away with runs in flight
# 1,200 events before, 200 published while the broker is away. The
# handler's timeout (2 s) is the sink's own timer with key_window above
# 1: the sidecar's wait must end at that deadline and poll the sink, which
# purges and replaces the producer; the runs are retried behind the backoff
# and the breaker (a purged run's ~100 retries recorded at once), and
# resume once the broker is back.
OUTAGE_S=${KAFKA_OUTAGE_S:-10}
log "the broker away ${OUTAGE_S}s: 4 keys, runs of 32 in flight"
kafka_create_topic mk-outage 3 || die "could not create topic mk-outage"
kafka_db t_outage mk-outage \
    '{"key_window": 32, "timeout": "2s", "backoff_base": "200ms", "backoff_max": "2s", "max_attempts": 1000, "producer": {"linger.ms": "100"}}'
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 1200 4 --tag before --many >"$TMP/pub_out1" || fail "preload"
start_instance outage $DB
PO=$IPID
wait_until 40 kafka_has mk-outage 100 || fail "fewer than 100 messages before the outage"
kafka_stop
log "broker stopped with $(outbox_and_pending $DB) outbox documents and deliveries left"
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 200 4 --tag during --many >"$TMP/pub_out2" || fail "preload"
sleep "$OUTAGE_S"
if grep -q 'purged and replaced' "$TMP/outage.err"; then
    pass "the sink's own timeout fired while the broker was away (producer purged and replaced)"
else
    fail "no purge at the handler's timeout in the sidecar's log" "$(grep -v '"level":"info"' "$TMP/outage.err" | tail -n 3)"
fi
kafka_restart || die "the broker did not restart"
t1=$(date +%s)
if drains $DB 60 300 && wait_until 20 kafka_has mk-outage 1400; then
    pass "every delivery completed $(($(date +%s) - t1)) s after the broker came back"
else
    fail "after the outage" "left: $(outbox_and_pending $DB), topic: $(wc -l <"$TMP/has.json")" "$(grep -v '"level":"info"' "$TMP/outage.err" | tail -n 5)"
fi
check_eq "nothing is dead" none "$(dead_letter $DB k)"
# On FerretDB's PostgreSQL backend a retried delivery's row moves, so an
# unsorted window can hold a key's later deliveries without it: the windows
# are sorted there, or the retried runs' keys skip ahead.
want_order=false
[[ $FDB_BACKEND == sqlite ]] && want_order=true
check_eq "the claim trusts unsorted windows only on the SQLite backend ($FDB_BACKEND)" \
    "\"insertion_order\":$want_order" "$(grep -o '"insertion_order":[a-z]*' "$TMP/outage.err" | head -n 1)"
kafka_consume mk-outage "$TMP/mk-outage.json"
out=$(seq_facts "$TMP/mk-outage.json" "$TMP/pub_out1" "$TMP/pub_out2")
log "broker outage: ${out//$'\n'/ }"
check_eq "after the outage: nothing lost, a key in one partition, no skip ahead (repeats only of whole runs)" \
    "missing=0 skips=0 one=True" "$(head -n 1 <<<"$out")"
stop_instance $PO
finish
