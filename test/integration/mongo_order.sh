#!/usr/bin/env bash
# relaybus-mongo keeps every publisher's order (docs/mongo.md, "Order"): four
# publishers on 50 shared keys, two through `relaybus-mongo publish --batch`
# (consecutive runs of the CLI) and two through pymongo's insert_one (the
# documented helper), while two sidecars sequence and deliver; one of them is
# killed with -9 mid-way. Per publisher and key the seqs must follow publish
# order; nothing lost, seqs gapless. On FerretDB's PostgreSQL backend
# (RELAYBUS_FERRETDB_BACKEND=postgresql) the outbox's physical order is not
# its insertion order (freed space is reused): a sequencer that trusts the
# order of an unsorted read breaks publishers' order there.
# MONGO_ORDER_EVENTS: events per publisher (default 1000).
SUITE=mongo_order
# Unless RELAYBUS_FERRETDB_BACKEND says otherwise: PostgreSQL, the backend whose
# physical order is not the insertion order.
MONGO_BACKEND_DEFAULT=postgresql
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"
N=${MONGO_ORDER_EVENTS:-1000}
declare -A R

# ------------------------------------------------------------------ a driver's ObjectId counter that wraps
# A driver's ObjectId: 4 bytes of seconds, 5 random bytes per process, a
# 3-byte counter from a random start, wrapping after 2^24 ids. One process's
# ids in one second across the wrap: ...fffffe, ...ffffff, ...000000, ...000001.
# Sequenced in publish order, with and without a snapshot cut by the cap
# (6 documents: 4 of an earlier second, then the cut falls inside the group).
wrap_seqs() {  # DB [env...]: publishes, sequences, prints "n:seq" of key w in publish order
    local db=$1
    shift
    "$BIN" init --database "$db" >/dev/null
    "$BIN" handler create work pull --database "$db" >/dev/null
    "$BIN" route 'o.#' work --database "$db" >/dev/null
    $PYM -c "
import time, pymongo
from bson import ObjectId
db = pymongo.MongoClient('$URI')['$db']
now = int(time.time())
proc = bytes.fromhex('a1b2c3d4e5')
for i in range(4):
    db.relay_outbox.insert_one({'_id': ObjectId((now - 10).to_bytes(4, 'big') + proc + (100 + i).to_bytes(3, 'big')),
                                'topic': 'o.e', 'payload': {'e': i}, 'key': 'e'})
for n, c in enumerate([0xfffffe, 0xffffff, 0, 1]):
    db.relay_outbox.insert_one({'_id': ObjectId(now.to_bytes(4, 'big') + proc + c.to_bytes(3, 'big')),
                                'topic': 'o.e', 'payload': {'n': n}, 'key': 'w'})"
    env "$@" "$BIN" sequence --database "$db" --batch-size 2 >/dev/null 2>"$TMP/$db.err" || cat "$TMP/$db.err"
    $PYM -c "
import pymongo, mongo_deliveries as md
db = pymongo.MongoClient('$URI')['$db']
ds = sorted((d['payload']['n'], d['seq']) for d in md.find(db) if d.get('key') == 'w')
print(' '.join(f'{n}:{s}' for n, s in ds))"
}
check_eq "a driver's wrapped ObjectId counter: sequenced in publish order" "0:1 1:2 2:3 3:4" "$(wrap_seqs t_wrap)"
check_eq "a wrapped counter across the snapshot's cap: sequenced in publish order" "0:1 1:2 2:3 3:4" \
    "$(wrap_seqs t_wrap_cap RELAYBUS_MONGO_OUTBOX_SNAPSHOT_DOCS=6)"

# ------------------------------------------------------------------ four publishers, two sidecars, kill -9
DB=t_order
"$BIN" init --database $DB >/dev/null
"$BIN" handler create hook http "$HOOK/order" --options '{"concurrency":16}' --database $DB >/dev/null
"$BIN" route 'o.#' hook --database $DB >/dev/null
# order_a sequences first, with its snapshot of the outbox cut at 300
# documents (the cap of a deep outbox, lowered by a test hook), and is killed
# with -9 mid-way; order_b (started second) or order_c takes the role over
# with the whole outbox in each snapshot.
RELAYBUS_MONGO_OUTBOX_SNAPSHOT_DOCS=300 start_instance order_a $DB --lease 3s
PA=$IPID
role_taken() { grep -q '"msg":"sequencer role taken"' "$TMP/$1.err"; }
wait_until 60 role_taken order_a || fail "order_a did not take the sequencer role"
start_instance order_b $DB --lease 3s
PB=$IPID

log "4 publishers x $N events on 50 keys: 2 x publish --batch (runs of 25 lines), 2 x insert_one"
# batch_publisher TAG: consecutive `publish --batch` runs, each line recorded
# once its run has exited (it was acknowledged before the next run started).
batch_publisher() {
    local tag=$1 i j lines
    : >"$TMP/pub_$tag"
    for ((i = 0; i < N; i += 25)); do
        lines=$(for ((j = i; j < i + 25 && j < N; j++)); do
            printf '{"topic":"o.e","payload":{"t":"%s","n":%d},"key":"k%d"}\n' "$tag" "$j" $((j % 50))
        done)
        "$BIN" publish --batch - --database $DB <<<"$lines" >/dev/null || return 1
        $PY -c '
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print(json.dumps({"payload": d["payload"], "key": d["key"]}))' <<<"$lines" >>"$TMP/pub_$tag"
    done
}
pubs=()
batch_publisher b1 & pubs+=($!)
batch_publisher b2 & pubs+=($!)
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e "$N" 50 --tag p1 >"$TMP/pub_p1" & pubs+=($!)
$PYM "$INTEG/mongo_preload.py" "$URI" $DB o.e "$N" 50 --tag p2 >"$TMP/pub_p2" & pubs+=($!)

# kill -9 of the sequencing sidecar once a quarter of the events were delivered.
wait_until 300 has_requests /order $((N)) || fail "no deliveries before the kill"
kill -9 $PA
wait $PA 2>/dev/null
log "killed order_a after $(count_path /order) requests"
start_instance order_c $DB --lease 3s
PC=$IPID

prc=0
for p in "${pubs[@]}"; do wait "$p" || prc=1; done
check_eq "4 publishers published $((4 * N)) events" "0 $((4 * N))" "$prc $(cat "$TMP"/pub_b1 "$TMP"/pub_b2 "$TMP"/pub_p1 "$TMP"/pub_p2 | wc -l)"
if wait_until 600 has_requests /order $((4 * N)) && wait_until 30 pending_is $DB 0; then
    pass "$((4 * N)) events delivered"
else
    fail "got $(count_path /order) of $((4 * N)); pending $(stats_field $DB pending)" \
        "$($PYM -c "import pymongo, mongo_deliveries as md; print(md.describe_left(pymongo.MongoClient('$URI')['$DB']))")"
    # What the two live instances were doing: their message counts and last lines.
    for i in b c; do
        echo "    order_$i: $(grep -o '"msg":"[^"]*"' "$TMP/order_$i.err" | sort | uniq -c | sort -rn | head -8 | tr -s ' ' | tr '\n' ';')"
        tail -n 5 "$TMP/order_$i.err" | sed 's/^/      /'
    done
fi
while IFS= read -r line; do R[${line%%=*}]=${line#*=}; done < <($PY "$INTEG/mongo_check.py" --receiver "$RPORT" \
    --path /order --published "$TMP/pub_b1" --published "$TMP/pub_b2" --published "$TMP/pub_p1" --published "$TMP/pub_p2")
log "requests=${R[requests]:-} dups=${R[dups]:-} publish_order=${R[publish_order]:-}"
check_eq "each publisher's order kept per key (events sequenced below an earlier event of their publisher)" 0 "${R[publish_order]:-?}"
check_eq "nothing lost, nothing sequenced twice, seqs gapless and delivered in seq order" \
    "missing=0 extra=0 reissued=0 seq_reuse=0 gaps=0 order=0" \
    "missing=${R[missing]:-?} extra=${R[extra]:-?} reissued=${R[reissued]:-?} seq_reuse=${R[seq_reuse]:-?} gaps=${R[seq_gap_keys]:-?} order=${R[order_violations]:-?}"
if [[ "${R[order_violations]:-?}" != 0 ]]; then
    # Which deliveries came back out of order, and what the instances said
    # about their leases and results meanwhile.
    echo "    out of order: ${R[order_sample]:-}"
    for i in a b c; do
        echo "    order_$i: $(grep -o '"msg":"[^"]*"' "$TMP/order_$i.err" | sort | uniq -c | sort -rn | head -12 | tr -s ' ' | tr '\n' ';')"
        grep -E 'lease|dropped|given back|lanes"' "$TMP/order_$i.err" | head -n 20 | sed 's/^/      /'
    done
fi
roles=$(for i in a b c; do printf 'order_%s:%s ' $i "$(grep -c '"msg":"sequencer role taken"' "$TMP/order_$i.err")"; done)
log "sequencer role taken (times per instance): $roles"
stop_instance $PB
stop_instance $PC
log "done"
finish
