#!/usr/bin/env bash
# relaybus-mongo's delivery segments (docs/mongo.md): priorities across them and
# their rotation, a crash between the segments of one completion batch, a
# window read across a version's inserts, and `sequence` outlasting its lease.
# FerretDB v1.24.2 (SQLite) and the real HTTP receiver. Prints "N passed, N failed".
SUITE=mongo_segments
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"
source "$INTEG/mongo_outbox_lib.sh"

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
# About 30 s on a quiet machine; at load 30 (other suites side by side) 493
# had gone in 180 s. The wait ends at the last one.
if wait_until 900 has_requests /seg 2510; then pass "the backlog drains"; else fail "the backlog drains"; fi
rotated() { [[ "$(seg_state)" == "2304 | 1 | 2304 | 0" ]]; }
if wait_until 120 rotated; then pass "drained segments are dropped; the last one, not yet fully assigned, stays"
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

log "done"
finish
