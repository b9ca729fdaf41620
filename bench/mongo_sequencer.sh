#!/usr/bin/env bash
# The sidecar's sequencer on a preloaded outbox: how long `relaybus-mongo
# sequence` takes per event as the outbox gets deeper. Not a test: prints numbers.
#
#   RELAYBUS_FERRETDB_BACKEND=postgresql|sqlite bash bench/mongo_sequencer.sh [BACKLOG...]   (default 1000 10000 50000)
#
# Per backlog, a fresh database: one pull handler, one route, BACKLOG outbox
# documents over 50 keys (insert_many, as mongo_preload.py --many), then one
# `sequence` (batch_size 100) timed from start to exit. RELAYBUS_MONGO_BIN
# picks another build of relaybus-mongo (an A/B against an older tree).
SUITE=mongo_sequencer
source "$(dirname "${BASH_SOURCE[0]}")/../test/integration/mongo_lib.sh"

(($# > 0)) || set -- 1000 10000 50000
echo "# $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), FerretDB v1.24.2 $FDB_BACKEND, $BIN"
for n in "$@"; do
    db=seq_$n
    "$BIN" init --database "$db" >/dev/null
    "$BIN" handler create work pull --database "$db" >/dev/null
    "$BIN" route 'bench.#' work --database "$db" >/dev/null
    $PYM "$INTEG/mongo_preload.py" "$URI" "$db" bench.e "$n" 50 --many >/dev/null || die "preload of $n"
    t0=$(date +%s%N)
    out=$("$BIN" sequence --database "$db" --batch-size 100 2>"$TMP/seq_$n.err") || { cat "$TMP/seq_$n.err"; die "sequence $n"; }
    t1=$(date +%s%N)
    ms=$(((t1 - t0) / 1000000))
    printf 'backlog %6d: %7d ms, %6.1f us/event, %s\n' "$n" "$ms" "$(bc -l <<<"($t1 - $t0) / 1000 / $n")" "$out"
done
cleanup
