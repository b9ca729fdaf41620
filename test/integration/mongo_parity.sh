#!/usr/bin/env bash
# relaybus-mongo parity with the PostgreSQL side (issue 13, item 3): handler
# create/alter/drop, `run` waiting for the server, pull handlers over the
# sidecar's HTTP API, priorities across the whole backlog, batch publish and
# the stats. Against FerretDB v1.24.2 (SQLite) and the real HTTP receiver.
# Ignores the PostgreSQL cluster. Prints "N passed, N failed".
SUITE=mongo-parity
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"

# ------------------------------------------------------------------ 1. handler create / alter / drop
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
check_rc "handler drop refuses pending deliveries (exit 2)" 2 'handler "hook" has 3 pending deliveries; drop refused' \
    "$BIN" handler drop hook --database $DB
check_eq "the refused drop changed nothing" "3 1" \
    "$(stats_field $DB pending) $("$BIN" handler list --database $DB | $PY -c 'import json,sys; print(len(json.load(sys.stdin)))')"
check_rc "handler drop --force dead-letters them" 0 '"dead_lettered":3' "$BIN" handler drop hook --force --database $DB
left=$($PYM -c "
import pymongo
db=pymongo.MongoClient('$URI')['$DB']
print(db.relay_deliveries.count_documents({}), db.relay_routes.count_documents({}),
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

log "done"
finish
