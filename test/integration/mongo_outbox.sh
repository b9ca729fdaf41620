#!/usr/bin/env bash
# relaybus-mongo publishing through the outbox (docs/mongo.md, "The outbox"):
# concurrent publishers with two sidecars, kill -9 mid-sequencing and
# mid-delivery, a crash at every step of applying a sequencer version, the
# publishing helpers (Python and Node.js). FerretDB
# v1.24.2 (SQLite) and the real HTTP receiver. Prints "N passed, N failed".
SUITE=mongo_outbox
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
declare -A R
analyze() {
    local line
    R=()
    while IFS= read -r line; do R[${line%%=*}]=${line#*=}; done \
        < <($PY "$INTEG/mongo_check.py" --receiver "$RPORT" "$@")
    [[ -n "${R[requests]:-}" ]]
}

outbox_count() { $PYM -c "import pymongo; print(pymongo.MongoClient('$URI')['$1'].relay_outbox.count_documents({}))"; }
setup_db() {  # DB PATH [handler options]
    "$BIN" init --database "$1" >/dev/null
    local opts=${3:-}
    [[ -n "$opts" ]] || opts='{}'
    "$BIN" handler create hook http "$HOOK$2" --options "$opts" --database "$1" >/dev/null
    "$BIN" route 'o.#' hook --database "$1"
}
report() {  # the checker's main counts, as one line
    echo "missing=${R[missing]} extra=${R[extra]} reissued=${R[reissued]} id_reuse=${R[id_reuse]} seq_reuse=${R[seq_reuse]} order=${R[order_violations]} gaps=${R[seq_gap_keys]} publish_order=${R[publish_order]} key=${R[seq_mismatch]}"
}
CLEAN="missing=0 extra=0 reissued=0 id_reuse=0 seq_reuse=0 order=0 gaps=0 publish_order=0 key=0"

# ------------------------------------------------------------------ concurrent publishers, two sidecars
# 0.1.0 drew ids and key seqs with findAndModify increments, which FerretDB
# does not make atomic: concurrent publishers reused both. Now publishers only
# insert into relay_outbox and one fenced sequencer assigns them.
log "4 concurrent publishers x 500 events on 50 keys, two sidecars draining"
DB=t_conc
setup_db $DB /conc '{"concurrency":16}'
start_instance conc_x $DB --lease 10s
PX=$IPID
start_instance conc_y $DB --lease 10s
PY_=$IPID
pubs=()
for p in 1 2 3 4; do
    $PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 500 50 --tag "p$p" >"$TMP/pub_conc_$p" &
    pubs+=($!)
done
prc=0
for p in "${pubs[@]}"; do wait "$p" || prc=1; done
check_eq "4 publishers inserted 2000 outbox documents" "0 2000" "$prc $(cat "$TMP"/pub_conc_* | wc -l)"
if wait_until 240 has_requests /conc 2000 && wait_until 10 pending_is $DB 0; then
    pass "2000 deliveries with two sidecars"
else
    fail "got $(count_path /conc) of 2000; outbox $(outbox_count $DB), pending $(stats_field $DB pending)"
fi
analyze --path /conc --published "$TMP/pub_conc_1" --published "$TMP/pub_conc_2" --published "$TMP/pub_conc_3" \
    --published "$TMP/pub_conc_4"
log "concurrent publishers: requests=${R[requests]} distinct=${R[distinct]} dups=${R[dups]} $(report)"
check_eq "every event delivered, none sequenced twice, no id or seq reused, per-key order by seq, each publisher's order kept" \
    "$CLEAN" "$(report)"
check_eq "the outbox is empty" 0 "$(outbox_count $DB)"
log "sequencer role taken: $(cat "$TMP"/conc_[xy].err | grep -c '"msg":"sequencer role taken"') times; lanes lost: $(cat "$TMP"/conc_[xy].err | grep -c '"msg":"lane lease lost"')"
dx=$(metric conc_x 'relaybus_mongo_delivered_total{handler="hook"}')
dy=$(metric conc_y 'relaybus_mongo_delivered_total{handler="hook"}')
if ((${dx:-0} > 0 && ${dy:-0} > 0)); then pass "both sidecars delivered ($dx + $dy)"; else fail "delivered by x=$dx y=$dy"; fi
stop_instance $PX
stop_instance $PY_

# ------------------------------------------------------------------ kill -9 mid-sequencing and mid-delivery
log "kill -9 of the sequencing sidecar mid-sequencing and mid-delivery"
DB=t_kill
setup_db $DB /kill '{"concurrency":16}'
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 1500 40 --tag k --many >"$TMP/pub_kill" || fail "preload"
control /kill '[{"delay": 0.02, "repeat": true}]'
# Small batches: the sequencer takes the outbox 20 documents at a time.
start_instance kill_a $DB --batch-size 20
PA=$IPID
wait_until 30 has_requests /kill 40 || fail "no deliveries before the kill"
left=$(outbox_count $DB)
kill -9 $PA
wait $PA 2>/dev/null
log "killed the sequencer after $(count_path /kill) requests, $left outbox documents left"
if ((left > 0 && left < 1500)); then pass "killed mid-sequencing ($left of 1500 left in the outbox)"; else fail "not mid-sequencing: $left left"; fi
start_instance kill_b $DB --lease 10s
PB=$IPID
start_instance kill_c $DB --lease 10s
PC=$IPID
if wait_until 240 has_requests /kill 1500 && wait_until 30 bash -c "[[ \$($PYM -c \"import pymongo; db=pymongo.MongoClient('$URI')['$DB']; import mongo_deliveries as md; print(db.relay_outbox.count_documents({})+md.count(db))\") == 0 ]]"; then
    pass "the survivors finished the outbox and the deliveries"
else
    fail "outbox $(outbox_count $DB), pending $(stats_field $DB pending), requests $(count_path /kill)"
fi
analyze --path /kill --published "$TMP/pub_kill"
log "kill -9: requests=${R[requests]} dups=${R[dups]} $(report)"
check_eq "kill -9: nothing lost, no event sequenced twice, no id or seq reused, order kept" "$CLEAN" "$(report)"
if ((${R[dups]} <= 32)); then pass "duplicates only for what was in flight (${R[dups]} <= 2 x concurrency)"; else fail "too many duplicates: ${R[dups]}"; fi
grep -q '"msg":"sequencer recovering"' "$TMP/kill_b.err" "$TMP/kill_c.err" && pass "the next sequencer recovered the last version" ||
    fail "no recovery log line"
stop_instance $PB
stop_instance $PC
control /kill '[]'

# ------------------------------------------------------------------ a crash at every step of a version
# RELAYBUS_MONGO_CRASH_POINT (a test hook) exits right after one step of
# applying a version; the next `sequence` recovers it. Per point 30 events on 3 keys.
log "a crash after every step of applying a version"
DB=t_points
setup_db $DB /points
: >"$TMP/pub_points"
for point in after_version after_key_seqs after_deliveries after_outbox; do
    $PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 30 3 --tag "$point" >>"$TMP/pub_points"
    RELAYBUS_MONGO_CRASH_POINT=$point "$BIN" sequence --database $DB --lease 1s >/dev/null 2>"$TMP/crash_$point.err"
    rc=$?
    wait_until 10 "$BIN" sequence --database $DB --lease 1s
    check_eq "crash $point: exit 99, then the outbox is sequenced" "99 0" "$rc $(outbox_count $DB)"
done
res=$($PYM -c "
import json, pymongo
db = pymongo.MongoClient('$URI')['$DB']
pub = [json.loads(l) for l in open('$TMP/pub_points')]
import mongo_deliveries as md
ds = md.find(db)
by_payload = {}
for d in ds: by_payload.setdefault(json.dumps(d['payload'], sort_keys=True), []).append(d)
missing = sum(1 for p in pub if json.dumps(p['payload'], sort_keys=True) not in by_payload)
twice = sum(1 for v in by_payload.values() if len(v) > 1)
seqs = {}
for d in ds: seqs.setdefault(d['key'], []).append(d['seq'])
gaps = sum(1 for k, s in seqs.items() if sorted(s) != list(range(1, len(s) + 1)))
ids = len({d['_id'] for d in ds}) == len(ds)
print(f'deliveries={len(ds)} missing={missing} twice={twice} gaps={gaps} ids_unique={ids}')")
check_eq "after the crashes: every event once, key seqs 1..n, ids unique" \
    "deliveries=120 missing=0 twice=0 gaps=0 ids_unique=True" "$res"

# ------------------------------------------------------------------ delivery segments
# The sequencer writes delivery ids into segments of 256 (relay_deliveries_<first
# id>, listed in relay_segments with their priority classes), so that no delete or
# update on FerretDB scans more than one segment; drained segments are dropped.
log "delivery segments: priorities across them, and their rotation"
DB=t_segments
setup_db $DB /seg '{"concurrency":8}'
$PYM -c "
import pymongo
db = pymongo.MongoClient('$URI')['$DB']
docs = [{'topic': 'o.e', 'payload': {'n': i, 'tag': 'low'}, 'key': 'k%d' % (i % 50)} for i in range(2500)]
docs += [{'topic': 'o.e', 'payload': {'n': i, 'tag': 'high'}, 'priority': 3} for i in range(10)]
for j in range(0, len(docs), 500): db.relay_outbox.insert_many(docs[j:j + 500])"
"$BIN" sequence --database $DB >/dev/null 2>"$TMP/seg.err"
seg_state() { $PYM -c "
import pymongo
db = pymongo.MongoClient('$URI')['$DB']
segs = sorted(d['_id'] for d in db.relay_segments.find())
colls = sorted(n for n in db.list_collection_names() if n.startswith('relay_deliveries_'))
print(' '.join(map(str, segs)), '|', len(colls), '|', ' '.join(str(d['_id']) for d in db.relay_segments.find({'c3': True})), '|',
      db.relay_deliveries.count_documents({}))"; }
check_eq "2,510 deliveries (ids 1..2510) in 10 segments, priority 3 only in the last; none in relay_deliveries" \
    "0 256 512 768 1024 1280 1536 1792 2048 2304 | 10 | 2304 | 0" "$(seg_state)"
control /seg '[{"delay": 0.01, "repeat": true}]'
start_instance seg $DB --priority-aging 60s
SEGPID=$IPID
wait_until 60 has_requests /seg 30 || fail "requests to /seg did not flow"
pos=$(tag_positions /seg high)
log "positions of the ten priority-3 deliveries (in the last segment): $pos"
check_eq "priority-3 deliveries in the last segment go before 2,500 older priority-1 ones (within 10 + concurrency)" \
    "10 ok" "$(wc -w <<<"$pos") $(for p in $pos; do ((p <= 18)) || echo late; done | grep -q late && echo late || echo ok)"
control /seg '[]'
if wait_until 180 has_requests /seg 2510; then pass "the backlog drains"; else fail "the backlog drains"; fi
rotated() { [[ "$(seg_state)" == "2304 | 1 | 2304 | 0" ]]; }
if wait_until 20 rotated; then pass "drained segments are dropped; the last one, not yet fully assigned, stays"
else fail "drained segments are dropped; the last one, not yet fully assigned, stays" "state: $(seg_state)"; fi
log "segments after the drain: $(seg_state)"
n=$(curl -s "$HOOK/_requests" | $PY -c "
import json,sys
rs=[json.loads(r['body']) for r in json.load(sys.stdin) if r['path']=='/seg']
print(len(rs), len({(r['event_id'], r['id']) for r in rs}))")
check_eq "every delivery once" "2510 2510" "$n"
stop_instance $SEGPID

# ------------------------------------------------------------------ a crash between a batch's segments
# A completion batch can span two segments: one deleteMany each. The older
# segment's goes first, so a crash between the two leaves a key's newer delivery
# pending (sent again after the older one: a duplicate, in order), never an older
# one behind a newer one already completed (sent again after it: out of order).
# The kill -9 test above caught that order violation when the deletes ran in an
# arbitrary order; this crash point makes the crash land between the two deletes,
# though not always with one key on both sides.
log "a crash between the segments of one completion batch"
DB=t_split
setup_db $DB /split '{"concurrency":16}'
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 1200 40 --tag s --many >"$TMP/pub_split" || fail "preload"
"$BIN" sequence --database $DB >/dev/null 2>&1
control /split '[{"delay": 0.02, "repeat": true}]'
RELAYBUS_MONGO_CRASH_POINT=between_segment_completes start_instance split_a $DB
SPA=$IPID
split_gone() { ! kill -0 $SPA 2>/dev/null; }
wait_until 90 split_gone
wait $SPA 2>/dev/null
rc=$?
log "stopped at the crash point after $(count_path /split) requests"
check_eq "the instance stopped between the segments of a completion batch (exit 99)" 99 "$rc"
start_instance split_b $DB
SPB=$IPID
if wait_until 120 has_requests /split 1200 && wait_until 30 pending_is $DB 0; then pass "the next instance finished the backlog"
else fail "the next instance finished the backlog" "requests $(count_path /split), pending $(stats_field $DB pending)"; fi
analyze --path /split --published "$TMP/pub_split"
log "crash between segments: requests=${R[requests]} dups=${R[dups]} $(report)"
check_eq "after the crash: nothing lost, per-key order kept (the duplicates are in order)" "$CLEAN" "$(report)"
stop_instance $SPB
control /split '[]'

# ------------------------------------------------------------------ a window read across a version's inserts
# One version's deliveries can go into two segments, one insertMany each, the
# older first. A reader in another sidecar that read the older segment before
# its insert and the newer one after saw a key's later deliveries without the
# earlier ones and sent them first (the two-sidecar tests above failed now and
# then with order=1..11). Readers now read no id above the last version marked
# wholly inserted. Here the reader pauses after each segment read (a test
# hook) and the events are published while it pauses after the older segment.
log "a window read while a version's deliveries go into two segments"
DB=t_segrace
setup_db $DB /segrace '{"concurrency":16}'
$PYM -c "import pymongo; pymongo.MongoClient('$URI')['$DB'].relay_counters.insert_one({'_id': 'ids', 'n': 250})"
RELAYBUS_MONGO_PAUSE_POINT=before_deliveries RELAYBUS_MONGO_PAUSE_FILE="$TMP/segrace_seq_pause" \
    RELAYBUS_MONGO_PAUSE_MS=2000 start_instance segrace_a $DB
SRA=$IPID
wait_until 20 grep -q '"sequencer role taken"' "$TMP/segrace_a.err" || fail "the first instance never took the sequencer role"
"$BIN" publish o.warm '{"n":-1}' --database $DB >/dev/null  # id 251: segment 0 exists, read by both
wait_until 20 has_requests /segrace 1 || fail "the warm-up event was not delivered"
RELAYBUS_MONGO_PAUSE_POINT=after_segment_read RELAYBUS_MONGO_PAUSE_AT=relay_deliveries_0000000000000000000 \
    RELAYBUS_MONGO_PAUSE_FILE="$TMP/segrace_pause" RELAYBUS_MONGO_PAUSE_MS=4000 start_instance segrace_b $DB
SRB=$IPID
held_by() { [[ "$(metric "$1" relaybus_mongo_lanes_held)" == 32 ]]; }
wait_until 30 held_by segrace_a && wait_until 30 held_by segrace_b || fail "the lanes were not shared 32/32"
# A key in a lane the pausing instance holds (the top epoch of each lane names its holder).
key=$($PYM -c "
import pymongo, sys
sys.path.insert(0, '$INTEG')
from mongo_bulk_load import lane_for_key
db = pymongo.MongoClient('$URI')['$DB']
top = {}
for d in db.relay_lanes.find({'lane': {'\$gte': 0}}):
    if d['lane'] not in top or d['epoch'] > top[d['lane']]['epoch']: top[d['lane']] = d
mine = {l for l, d in top.items() if d['owner'] == 'segrace_b'}
print(next(f'k{i}' for i in range(10000) if lane_for_key(f'k{i}') in mine))")
# The sequencer pauses 2 s with the version committed (its events' not_before
# is now past) and its deliveries not inserted; meanwhile the reader starts a
# window, reads segment 0 and pauses 4 s after it; then it reads segment 256.
touch "$TMP/segrace_seq_pause"
for i in $(seq 1 10); do echo "{\"topic\":\"o.k\",\"payload\":{\"n\":$i},\"key\":\"$key\"}"; done |
    "$BIN" publish --batch - --database $DB >/dev/null  # ids 252..261: seqs 1-4 in segment 0, 5-10 in segment 256
wait_until 20 grep -q '"test pause point reached' "$TMP/segrace_a.err" || fail "the sequencer never paused"
touch "$TMP/segrace_pause"
wait_until 20 grep -q '"test pause point reached' "$TMP/segrace_b.err" || fail "the reader never paused after segment 0"
if wait_until 60 has_requests /segrace 11; then pass "the ten events of one version delivered across two segments"
else fail "the ten events were not delivered" "$(count_path /segrace) requests"; fi
check_eq "the key's events arrived in seq order although the reader read segment 0 before they were inserted" \
    "1 2 3 4 5 6 7 8 9 10" "$(curl -s "$HOOK/_requests" | $PY -c "
import json, sys
ns = [json.loads(r['body'])['payload']['n'] for r in json.load(sys.stdin) if r['path'] == '/segrace']
print(' '.join(str(n) for n in ns if n > 0))")"
kill -KILL $SRB $SRA 2>/dev/null
wait $SRB $SRA 2>/dev/null

# ------------------------------------------------------------------ sequence outlasting its lease
# `relaybus-mongo sequence` renews its role as it goes; a batch cut short by the
# lease's margin must not end the command with the outbox half done.
log "sequence: a backlog that takes several leases"
DB=t_seq_lease
setup_db $DB /seql
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 2000 50 --many >/dev/null
out=$("$BIN" sequence --database $DB --lease 1s --batch-size 50 2>"$TMP/seql.err")
log "sequence said: $out"
check_eq "sequence with a 1 s lease sequences the whole outbox" '{"outbox_left":0,"sequenced":2000}' "$out"

# ------------------------------------------------------------------ 100 keys in one batch
# FerretDB v1.24 hung on an update command of 100 statements (one key seq
# upsert per key of the batch): each statement holds a SQLite connection until
# the command ends. The sequencer sends at most 25 per command.
log "a batch of 100 new keys"
DB=t_keys
setup_db $DB /keys
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e 100 100 --many >/dev/null
timeout 30 "$BIN" sequence --database $DB >/dev/null 2>"$TMP/keys.err"
rc=$?
n=$($PYM -c "import pymongo; print(pymongo.MongoClient('$URI', serverSelectionTimeoutMS=3000)['$DB'].relay_key_seqs.count_documents({}))" 2>&1 | tail -1)
check_eq "100 keys in one batch: sequenced, the server still answers" "0 100" "$rc $n"

# ------------------------------------------------------------------ outbox input
log "outbox documents the sequencer refuses or folds"
DB=t_input
setup_db $DB /input
$PYM -c "
import pymongo
db = pymongo.MongoClient('$URI')['$DB']
db.relay_outbox.insert_many([
  {'topic': 'o..x', 'payload': 1},
  {'topic': 'o.x'},
  {'topic': 'o.x', 'payload': 1, 'priority': 7, 'key': ''},
  {'topic': 'o.x', 'payload': {'d': 1}, 'dedupe_key': 'once'},
  {'topic': 'o.x', 'payload': {'d': 2}, 'dedupe_key': 'once'},
])"
"$BIN" publish o.x '{"d":3}' --dedupe-key once --database $DB >/dev/null
"$BIN" sequence --database $DB >/dev/null 2>"$TMP/input.err"
"$BIN" publish o.x '{"d":4}' --dedupe-key once --database $DB >/dev/null
"$BIN" sequence --database $DB >/dev/null 2>>"$TMP/input.err"
res=$($PYM -c "
import pymongo
db = pymongo.MongoClient('$URI')['$DB']
print(sorted(d['error'] for d in db.relay_outbox_rejects.find()))
import mongo_deliveries as md
print([d['payload'] for d in md.find(db)], db.relay_outbox.count_documents({}))")
check_eq "malformed outbox documents are moved to relay_outbox_rejects with the reason; a repeated dedupe_key is folded" \
    "['malformed outbox document: key must be a non-empty string or absent; priority must be an integer 0..3', 'malformed outbox document: payload is missing', 'malformed outbox document: topic must be a valid topic']
[{'d': 1}] 0" "$res"
check_rc "publish: empty dedupe key" 2 'dedupe key must not be empty' "$BIN" publish o.x '{}' --dedupe-key '' --database $DB
start_instance input_run $DB
PI=$IPID
wait_until 10 grep -q '"msg":"sequencer role taken"' "$TMP/input_run.err"
check_rc "sequence refuses while a running instance holds the role" 1 'the sequencer role is held by "input_run"' \
    "$BIN" sequence --database $DB
stop_instance $PI

# ------------------------------------------------------------------ the publishing helpers touch only relay_outbox
log "publishing helpers: one insert into relay_outbox, nothing else"
res=$($PYM -c "
import sys
sys.path.insert(0, '$ROOT/docs/examples')
import pymongo
from pymongo import monitoring
from publish_pymongo import publish
seen = []
class L(monitoring.CommandListener):
    def started(self, e):
        if e.command_name not in ('isMaster', 'hello', 'ismaster', 'endSessions'):
            seen.append((e.command_name, e.command.get(e.command_name)))
    def succeeded(self, e): pass
    def failed(self, e): pass
c = pymongo.MongoClient('$URI', event_listeners=[L()])
publish(c['t_helpers'], 'o.x', {'py': 1}, key='k1', priority=2)
print(seen)")
check_eq "the Python helper sends one insert into relay_outbox (no read of relay_handlers, no counter)" \
    "[('insert', 'relay_outbox')]" "$res"
# The Node.js helper runs on the mongodb driver from the npm registry, pinned,
# installed once under build/ (scripts/install-deps.sh installs node and npm).
NODE_DRIVER=mongodb@6.22.0
NODE_MODULES=${RELAYBUS_NODE_MODULES:-$ROOT/build/node-mongo/node_modules}
if command -v node >/dev/null && command -v npm >/dev/null && [[ ! -d "$NODE_MODULES/mongodb" ]]; then
    log "installing $NODE_DRIVER from the npm registry into ${NODE_MODULES%/node_modules}"
    timeout 300 npm install --prefix "${NODE_MODULES%/node_modules}" --no-audit --no-fund --loglevel=error \
        "$NODE_DRIVER" >"$TMP/npm.log" 2>&1 || log "npm install failed: $(tail -3 "$TMP/npm.log")"
fi
if ! command -v node >/dev/null || [[ ! -d "$NODE_MODULES/mongodb" ]]; then
    fail "the Node.js helper's test needs node and the $NODE_DRIVER driver (scripts/install-deps.sh installs node and npm)" \
        "node: $(command -v node || echo missing), driver: $NODE_MODULES/mongodb"
else
    res=$(NODE_PATH=$NODE_MODULES node -e "
const { MongoClient } = require('mongodb');
const { publish } = require('$ROOT/docs/examples/publish_node.js');
(async () => {
  const seen = [];
  const c = new MongoClient('$URI', { monitorCommands: true });
  c.on('commandStarted', (e) => { if (!['hello', 'isMaster', 'ismaster', 'endSessions'].includes(e.commandName)) seen.push(e.commandName + ':' + e.command[e.commandName]); });
  await c.connect();
  await publish(c.db('t_helpers'), 'o.x', { node: 1 }, { key: 'k1', priority: 2 });
  await c.close();
  console.log(seen.join(','));
})().catch((e) => { console.log('error ' + e); process.exit(1); });")
    check_eq "the Node.js helper sends one insert into relay_outbox" "insert:relay_outbox" "$res"
    "$BIN" init --database t_helpers >/dev/null
    "$BIN" sequence --database t_helpers >/dev/null
    res=$($PYM -c "
import pymongo
db = pymongo.MongoClient('$URI')['t_helpers']
import mongo_deliveries as md
print(sorted((str(d['payload']), d['key'], d['seq']) for d in md.find(db)), sorted(d['_id'] for d in db.relay_key_seqs.find()))")
    # No handler: the events take ids and seqs but have no deliveries.
    check_eq "both helpers' events were sequenced (key k1 at seq 2)" "[] ['k1']" "$res"
fi

log "done"
finish
