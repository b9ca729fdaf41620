#!/usr/bin/env bash
# relaybus-mongo publishing through the outbox (docs/mongo.md, "The outbox"):
# concurrent publishers with two sidecars, kill -9 mid-sequencing and
# mid-delivery, a crash at every step of applying a sequencer version, the
# publishing helpers (Python and Node.js); the delivery segments are
# mongo_segments.sh's. FerretDB v1.24.2 (SQLite) and the real HTTP receiver.
# Prints "N passed, N failed".
SUITE=mongo_outbox
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
source "$INTEG/mongo_outbox_lib.sh"

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
# Every duplicate is a request A sent whose delivery A had not settled: once
# its last requests have reached the receiver, the bound is exact, whatever
# the load made of A's loop passes.
sleep 1
sent_a=$(count_path /kill)
settled_a=$((1500 - $(outbox_count $DB) - $($PYM -c "import pymongo; import mongo_deliveries as md; print(md.count(pymongo.MongoClient('$URI')['$DB']))")))
log "killed the sequencer after $sent_a requests ($settled_a settled), $left outbox documents left"
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
if ((${R[dups]} <= sent_a - settled_a)); then pass "duplicates only of what the killed sidecar sent and had not settled (${R[dups]} <= $((sent_a - settled_a)))"; else
    fail "too many duplicates: ${R[dups]}, of $((sent_a - settled_a)) sent and not settled by the killed sidecar"; fi
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
# The CLI's ObjectIds and the driver's order by time only across seconds
# (docs/mongo.md, two publishers): d:3 is published in a later second than
# d:1, so that d:1 is the first of "once" in _id order.
$PY -c "import time; time.sleep(1.05 - time.time() % 1)"
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
