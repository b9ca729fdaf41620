#!/usr/bin/env bash
# relaybus-mongo drain rate from a preloaded backlog, against FerretDB v1.24.2
# (SQLite backend) on this machine: one instance, then two, each on a fresh
# database with the same backlog. Not a test: prints numbers.
#
#   bash bench/mongo_backlog.sh [EVENTS=1000] [KEYS=100]
#
# The backlog is published through the outbox (insert_many of the documented
# fields) and sequenced by `relaybus-mongo sequence` before the dispatchers
# start (sequenced/s is printed), so the drain measures delivery alone.
# Per run: deliveries/s (first delivery to last), MongoDB commands per delivery
# (relaybus_mongo_commands_total / delivered, from /metrics: the sidecar counts
# every command it sends), /metrics latency during the drain (the polling
# loop's own requests: median and max), and the sidecar's peak RSS (VmHWM).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
N=${1:-1000}
KEYS=${2:-100}
BIN=$ROOT/relaybus-mongo
TMP=$(mktemp -d /tmp/relaybus-mongo-bench.XXXXXX)
PYM=python3; $PYM -c 'import pymongo' 2>/dev/null || PYM=/usr/bin/python3
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT
bash "$ROOT/test/ferretdb/build.sh" && make -s -C "$ROOT/src/mongo" >/dev/null || exit 1
"$ROOT/test/ferretdb/bin/ferretdb-test" -dir "$TMP/fdb" -uri-file "$TMP/uri" >/dev/null 2>&1 & PIDS+=($!)
python3 "$ROOT/test/integration/http_receiver.py" --port-file "$TMP/rport" 2>/dev/null & PIDS+=($!)
for _ in $(seq 100); do [[ -s $TMP/uri && -s $TMP/rport ]] && break; sleep 0.1; done
export RELAYBUS_MONGO_URI=$(cat "$TMP/uri")
RPORT=$(cat "$TMP/rport")
echo "# $(nproc) CPUs, FerretDB v1.24.2 SQLite, backlog $N events over $KEYS keys, handler concurrency 64, batch_size 100"

run() {  # INSTANCES
    local k=$1 db=bench_$1 i
    "$BIN" init --database $db >/dev/null
    "$BIN" handler create hook http "http://127.0.0.1:$RPORT/$db" --options '{"concurrency":64}' --database $db >/dev/null
    "$BIN" route 'bench.#' hook --database $db
    $PYM "$ROOT/test/integration/mongo_preload.py" "$RELAYBUS_MONGO_URI" $db bench.e "$N" "$KEYS" --many >/dev/null
    local s0 s1
    s0=$(date +%s.%N)
    local said
    said=$("$BIN" sequence --database $db --log-level warn)
    s1=$(date +%s.%N)
    # What the command says it did: a drain that also sequences would not measure delivery alone.
    python3 -c "
import json; r = json.loads('$said'); n = r['sequenced']
print(f'sequenced={n} outbox_left={r[\"outbox_left\"]} seconds={$s1-$s0:.2f} sequenced_per_s={n/($s1-$s0):.0f}')"
    local pids=() t0 t1
    for i in $(seq "$k"); do
        "$BIN" run --database $db --instance "b$i" --lease 10s --poll-interval 20ms --batch-size 100 \
            --http-allowlist 127.0.0.1 --metrics-listen 127.0.0.1:0 --log-level warn 2>"$TMP/b$k-$i.err" &
        pids+=($!)
    done
    sleep 0.3
    local addrs=()
    for i in $(seq "$k"); do
        addrs+=("$(ss -ltnp 2>/dev/null | awk -v p="pid=${pids[$((i - 1))]}," '$0 ~ p {print $4}' | head -1)")
    done
    t0=$(date +%s.%N)
    local delivered=0 commands=0
    : >"$TMP/lat$k"
    while :; do
        delivered=0; commands=0
        for a in "${addrs[@]}"; do
            m=$(curl -s -w '\n#time %{time_total}\n' "http://$a/metrics")
            awk '/^#time/ {print $2}' <<<"$m" >>"$TMP/lat$k"
            delivered=$((delivered + $(awk '/^relaybus_mongo_delivered_total/ {s+=$2} END {print s+0}' <<<"$m")))
            commands=$((commands + $(awk '/^relaybus_mongo_commands_total/ {s+=$2} END {print s+0}' <<<"$m")))
        done
        ((delivered >= N)) && break
        sleep 0.1
    done
    t1=$(date +%s.%N)
    local rss=""
    for p in "${pids[@]}"; do rss+="$(awk '/VmHWM/ {print $2}' /proc/$p/status)kB "; kill -TERM $p; done
    wait "${pids[@]}" 2>/dev/null
    python3 -c "
n=$delivered; dt=$t1-$t0
lat=sorted(float(x) for x in open('$TMP/lat$k') if x.strip())
print(f'instances=$k delivered={n} seconds={dt:.2f} deliveries_per_s={n/dt:.0f} commands={$commands} commands_per_delivery={$commands/n:.3f} metrics_ms_median={lat[len(lat)//2]*1000:.0f} metrics_ms_max={lat[-1]*1000:.0f} peak_rss=$rss')"
}
run 1
run 2
