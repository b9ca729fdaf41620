#!/usr/bin/env bash
# Kafka delivery evidence (a benchmark, not a test), one throwaway cluster and
# one single-node broker (scripts/kafka-broker.sh), printed as markdown:
#
#   PG_CONFIG=/path/to/pg_config bash bench/kafka_bench.sh
#
# For KEYS in 1 and 1000: N events of the same payload (SIZE bytes of JSON)
# are published while the kafka handler is paused, then it is resumed and
# timed until nothing is pending (every message acknowledged with acks=all).
# The floor: kafka-producer-perf-test (org.apache.kafka.tools.ProducerPerformance
# from the same Maven artifacts) sending N records of SIZE bytes to the same
# broker with acks=all and enable.idempotence=true, as fast as it can, before
# the cases and after them; the ratios are to the higher of the two.
#
# Each case runs once per key_window in WINDOWS (default "1 32": one message
# of a key in flight at a time, then the default window) and per producer
# option in PRODUCERS, so before and after come from the same run. Each row
# also shows the handler's send times (relay.handler_stats: produce to
# acknowledgement) and the bytes the broker stored per message (its log
# segments of the topic: batching and compression show there).
#
# SIDECAR (FerretDB backends, e.g. "postgresql sqlite"; default none): the
# same cases again through relaybus-mongo against FerretDB v1.24.2 on each
# backend (postgresql: a database in the same cluster), same broker, same
# payload (PAYLOAD x), the first of PRODUCERS. The backlog is inserted into relay_outbox
# and sequenced (`relaybus-mongo sequence`) before the sidecar starts; timed
# from its first "lanes" log line (its lanes held, the backlog waiting: the
# extension's resume) until /metrics counts every delivery completed. The
# sidecar runs with --max-in-flight 4096 (the extension's pipeline bound)
# and --poll-interval 20ms, plus MONGO_ARGS (e.g. "--scan-window 64").
#
# AGENT=1: the same cases again through relaybus-agent, on a second cluster
# of the same PostgreSQL with nothing preloaded and the managed SQL edition
# (make managed agent), same broker, same payload, the first of PRODUCERS,
# timed as the extension's (resume to nothing pending); the agent runs with
# --max-in-flight 4096 (the extension's pipeline bound). A cluster of its
# own with nothing preloaded, as on a managed service.
#
# Environment: N (20000), N1 (events at 1 key, 2000), SIZE (200), PAYLOAD (x), PRODUCERS
# (the handlers' producer options to compare, separated by ';', default
# '{}'; PRODUCER sets one), WINDOWS, CONCURRENCY (the handlers' concurrency,
# 1024), SIDECAR, MONGO_ARGS, AGENT, PG_CONFIG (the build to measure, installed
# there already: make install PG_CONFIG=...).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N=${N:-20000}
N1=${N1:-2000}
SIZE=${SIZE:-200}
PRODUCERS=${PRODUCERS:-${PRODUCER:-\{\}}}
WINDOWS=${WINDOWS:-1 32}
CONCURRENCY=${CONCURRENCY:-1024}
SIDECAR=${SIDECAR:-}
MONGO_ARGS=${MONGO_ARGS:-}
AGENT=${AGENT:-}
PG_CONFIG=${PG_CONFIG:-$(bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/pg-config.sh")}
export PG_CONFIG PATH="$("$PG_CONFIG" --bindir):$PATH"

note() { echo "# $*" >&2; }
dir=$(mktemp -d /tmp/relaybus-kafkabench.XXXXXX)
chmod 755 "$dir"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    bash "$ROOT/scripts/kafka-broker.sh" stop "$dir/kafka" >/dev/null 2>&1 || true
    bash "$ROOT/test/cluster.sh" destroy "$dir/pg" >/dev/null 2>&1 || true
    bash "$ROOT/test/cluster.sh" destroy "$dir/pg2" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
free_port() { python3 "$ROOT/scripts/free-port.py"; }

KPORT=$(free_port)
note "broker on 127.0.0.1:$KPORT"
bash scripts/kafka-broker.sh start "$dir/kafka" "$KPORT"
CP=$(bash scripts/kafka-broker.sh classpath)
BOOT=127.0.0.1:$KPORT
topic() {
    java -XX:TieredStopAtLevel=1 -cp "$CP" org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOT" \
        --create --topic "$1" --partitions 3 --replication-factor 1 >/dev/null
}

note "cluster in $dir/pg"
RELAYBUS_EXTRA_CONF=$'shared_buffers = 512MB\nmax_wal_size = 4GB' bash test/cluster.sh start "$dir/pg" >/dev/null
# shellcheck disable=SC1091
source "$dir/pg/env"
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
q -c "CREATE EXTENSION relaybus"
# A payload of SIZE bytes of JSON text.
PAD=$((SIZE - 9))
# PAYLOAD=x: one character repeated (what the floor's records are: it sends
# the same bytes every time); PAYLOAD=hex: hex digits of md5 hashes, which
# compress about as much as JSON of ids and names does (for compression.type).
case ${PAYLOAD:-x} in
    x) VALUE="repeat('x', $PAD)" ;;
    hex) VALUE="substr((SELECT string_agg(md5((i * 31 + j)::text), '') FROM generate_series(1, $PAD / 32 + 1) j), 1, $PAD)" ;;
    *) echo "PAYLOAD is x or hex" >&2; exit 2 ;;
esac
for i in $(seq 1 100); do
    [[ $(q -c "SELECT count(*) FROM relay.workers") == 1 ]] && break
    sleep 0.2
done

# run KEYS COUNT WINDOW PRODUCER P: events per second from a backlog of COUNT
# events over KEYS keys, "|" the send p50 and p99 (ms), "|" bytes stored per
# message (the warm-up one included); P numbers the producer option (the
# handler's and topic's names).
run() {
    local keys=$1 count=$2 window=$3 producer=$4 t0 t1 name="k$1w$3p$5"
    topic "bench-$name"
    q -c "SELECT relay_create_handler('$name', 'kafka', 'kafka://$BOOT/bench-$name',
                                      '{\"concurrency\": $CONCURRENCY, \"key_window\": $window, \"producer\": $producer}')" \
      -c "SELECT relay_route('bench.$name', '$name')" >/dev/null
    # One event first, so that the timed drain does not include making the
    # producer and fetching the topic's metadata (hundreds of ms).
    q -c "SELECT relay_publish('bench.$name', '{}', 'warm-up')" >/dev/null
    while [[ $(q -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                    WHERE h.name = '$name'") != 0 ]]; do
        sleep 0.05
    done
    q -c "SELECT relay_pause_handler('$name')" >/dev/null
    q -c "SELECT count(relay_publish('bench.$name', jsonb_build_object('p', $VALUE), 'k-' || (i % $keys)))
            FROM generate_series(1, $count) i" >/dev/null
    t0=$(date +%s.%N)
    q -c "SELECT relay_resume_handler('$name')" >/dev/null
    while [[ $(q -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                    WHERE h.name = '$name'") != 0 ]]; do
        sleep 0.05
    done
    t1=$(date +%s.%N)
    local sends bytes
    sends=$(q -c "SELECT send_p50_ms || '|' || send_p99_ms FROM relay.handler_stats WHERE handler = '$name'")
    bytes=$(cat "$dir"/kafka/data/bench-"$name"-*/*.log | wc -c)
    python3 -c "print('%.0f|%s|%.0f' % ($count / ($t1 - $t0), '$sends', $bytes / ($count + 1)))"
}

# floor TOPIC: records/s of kafka-producer-perf-test into a new topic.
floor() {
    topic "$1"
    java -Xmx512m -cp "$CP" org.apache.kafka.tools.ProducerPerformance --topic "$1" --num-records "$N" \
        --record-size "$SIZE" --throughput -1 \
        --producer-props bootstrap.servers="$BOOT" acks=all enable.idempotence=true 2>/dev/null |
        tail -n 1 | sed -E 's/^[0-9]+ records sent, ([0-9.]+) records\/sec.*/\1/'
}

payload_bytes=$(q -c "SELECT length(jsonb_build_object('p', $VALUE)::text) FROM (SELECT 1 AS i) one")
note "payload $payload_bytes bytes, producers $PRODUCERS, concurrency $CONCURRENCY, windows $WINDOWS${SIDECAR:+, sidecar on $SIDECAR $MONGO_ARGS}"
f0=$(floor bench-floor-before)
rows=()
IFS=';' read -r -a producers <<<"$PRODUCERS"
for i in "${!producers[@]}"; do
    p=${producers[$i]}
    for w in $WINDOWS; do
        rows+=("1 key|$w|$p|$N1|$(run 1 "$N1" "$w" "$p" "$i")")
        rows+=("1000 keys|$w|$p|$N|$(run 1000 "$N" "$w" "$p" "$i")")
    done
done
# ---------------------------------------------------------------- relaybus-agent
# Rows of the deliverers beside the extension: "deliverer|case|key_window|events|events/s".
mrows=()
if [[ -n "$AGENT" ]]; then
    make -s managed agent >&2
    RELAYBUS_PRELOAD='' RELAYBUS_EXTRA_CONF=$'shared_buffers = 512MB\nmax_wal_size = 4GB' \
        bash test/cluster.sh start "$dir/pg2" >/dev/null
    ext_env=$(export -p | grep -E ' (PGHOST|PGPORT|PGUSER|PGDATABASE|RELAYBUS_CLUSTER_DIR)=')
    # shellcheck disable=SC1091
    source "$dir/pg2/env"
    q -c "CREATE DATABASE agentbench" >/dev/null
    psql -X -q -1 -v ON_ERROR_STOP=1 -d agentbench -f "$ROOT/build/relaybus-managed--$(
        sed -n "s/^default_version = '\(.*\)'/\1/p" relaybus.control).sql" >/dev/null
    q -c "CREATE ROLE agent_bench LOGIN IN ROLE relay_agent" >/dev/null
    "$ROOT/relaybus-agent" --database "host=$PGHOST port=$PGPORT dbname=agentbench user=agent_bench" \
        --max-in-flight 4096 --log-level warn 2>"$dir/agent.err" &
    PIDS+=("$!")
    for w in $WINDOWS; do
        mrows+=("relaybus-agent (managed edition)|1 key|$w|$N1|$(PGDATABASE=agentbench run 1 "$N1" "$w" "${producers[0]}" a | cut -d'|' -f1)")
        mrows+=("relaybus-agent (managed edition)|1000 keys|$w|$N|$(PGDATABASE=agentbench run 1000 "$N" "$w" "${producers[0]}" a | cut -d'|' -f1)")
    done
    eval "$ext_env"
fi

# ---------------------------------------------------------------- relaybus-mongo
MBIN=$ROOT/relaybus-mongo
PYM=python3
$PYM -c 'import pymongo' 2>/dev/null || PYM=/usr/bin/python3
if [[ -n "$SIDECAR" ]]; then
    bash test/ferretdb/build.sh >&2
    make -s -C src/mongo -j"$(nproc)" >&2
fi

# ferret_start BACKEND: a FerretDB on that backend; sets MURI.
ferret_start() {
    local store=(-dir "$dir/fdb-$1")
    if [[ $1 == postgresql ]]; then
        createdb ferretdb
        store+=(-postgresql-url "postgres://$PGUSER@127.0.0.1:$PGPORT/ferretdb")
    fi
    rm -f "$dir/uri"
    test/ferretdb/bin/ferretdb-test "${store[@]}" -uri-file "$dir/uri" >"$dir/fdb-$1.log" 2>&1 &
    FDB=$!
    PIDS+=("$FDB")
    for _ in $(seq 200); do [[ -s $dir/uri ]] && break; sleep 0.1; done
    MURI="$(cat "$dir/uri")?serverSelectionTimeoutMS=5000"
}

# mrun BACKEND KEYS COUNT WINDOW: the sidecar's events per second, as run's.
mrun() {
    local backend=$1 keys=$2 count=$3 window=$4 name="k$2w$4" db="b_k$2w$4" err pid addr t0 t1
    err=$dir/m-$backend-$name.err
    topic "bench-m$backend-$name"
    RELAYBUS_MONGO_URI=$MURI "$MBIN" init --database "$db" >/dev/null
    RELAYBUS_MONGO_URI=$MURI "$MBIN" handler create "$name" kafka "kafka://$BOOT/bench-m$backend-$name" --database "$db" \
        --options "{\"concurrency\": $CONCURRENCY, \"key_window\": $window, \"producer\": ${producers[0]}}" >/dev/null
    RELAYBUS_MONGO_URI=$MURI "$MBIN" route "bench.#" "$name" --database "$db" >/dev/null
    # 1,000 at a time: FerretDB's sequencer reads the whole outbox and its
    # delete of 20,000 outbox documents outlasted the client's socket timeout.
    for ((from = 1; from <= count; from += 1000)); do
        $PYM - "$MURI" "$db" "$keys" "$from" "$((from + 999 < count ? from + 999 : count))" "$PAD" <<'PY'
import sys, pymongo
uri, db, keys, first, last, pad = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
pymongo.MongoClient(uri)[db].relay_outbox.insert_many(
    [{"topic": "bench.e", "payload": {"p": "x" * pad}, "key": "k-%d" % (i % keys)} for i in range(first, last + 1)],
    ordered=True)
PY
        RELAYBUS_MONGO_URI=$MURI "$MBIN" sequence --database "$db" --log-level error >/dev/null
    done
    RELAYBUS_MONGO_URI=$MURI "$MBIN" run --database "$db" --instance bench --poll-interval 20ms --max-in-flight 4096 \
        --metrics-listen 127.0.0.1:0 $MONGO_ARGS 2>"$err" >/dev/null &
    pid=$!
    PIDS+=("$pid")
    addr=
    while [[ -z "$addr" ]]; do
        sleep 0.05
        addr=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    try: j = json.loads(l)
    except Exception: continue
    if j.get("metrics"): print(j["metrics"]); break' "$err")
    done
    while :; do
        n=$(curl -s "http://$addr/metrics" | awk -v m="relaybus_mongo_delivered_total{handler=\"$name\"}" '$1 == m {print $2}')
        ((${n:-0} >= count)) && break
        sleep 0.05
    done
    t1=$(date +%s.%N)
    # Where the time goes: the store commands per delivery, by operation.
    curl -s "http://$addr/metrics" | awk -v n="$count" -v c="$backend $name" '
        /^relaybus_mongo_commands_total/ { sub(/.*op="/, "", $1); sub(/".*/, "", $1); s = s sprintf(" %s %.3f", $1, $2 / n); t += $2 }
        /^relaybus_mongo_fetches_total/  { f = $2 }
        END { printf "# %s: store commands per delivery %.3f:%s; fetches %d\n", c, t / n, s, f }' >&2
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    # The sidecar's own clock for "its lanes held, the backlog waiting".
    t0=$(python3 -c 'import json,sys,datetime
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j.get("msg") == "lanes" and j.get("held"):
        print(datetime.datetime.strptime(j["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()); break' "$err")
    python3 -c "print('%.0f' % ($count / ($t1 - $t0)))"
}

for backend in $SIDECAR; do
    ferret_start "$backend"
    note "relaybus-mongo on FerretDB ($backend) at $MURI"
    for w in $WINDOWS; do
        mrows+=("relaybus-mongo, FerretDB $backend|1 key|$w|$N1|$(mrun "$backend" 1 "$N1" "$w")")
        mrows+=("relaybus-mongo, FerretDB $backend|1000 keys|$w|$N|$(mrun "$backend" 1000 "$N" "$w")")
    done
    kill "$FDB"
    wait "$FDB" 2>/dev/null || true
done

f=$(python3 -c 'import sys; print(max(float(a) for a in sys.argv[1:]))' "$f0" "$(floor bench-floor-after)")
note "floor: $f0 records/s before the cases, the higher of it and the one after: $f"
echo "| case | key_window | producer | events | events/s | floor (kafka-producer-perf-test, acks=all, idempotent) | ratio | send p50 / p99 (ms) | bytes stored per message |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
declare -A ext=()
for row in "${rows[@]}"; do
    IFS='|' read -r case w p n rate p50 p99 per <<<"$row"
    [[ "$p" == "${producers[0]}" ]] && ext["$case|$w"]=$rate
    python3 -c 'import sys; c, w, p, n, r, f, p50, p99, per = sys.argv[1:]; print("| %s | %s | `%s` | %s | %s | %.0f records/s | %.3f | %s / %s | %s |" % (c, w, p, n, r, float(f), float(r) / float(f), p50, p99, per))' \
        "$case" "$w" "$p" "$n" "$rate" "$f" "$p50" "$p99" "$per"
done
if ((${#mrows[@]})); then
    echo
    echo "| deliverer | case | key_window | events | events/s | the extension's | deliverer / extension | ratio to the floor |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
    for row in "${mrows[@]}"; do
        IFS='|' read -r who case w n rate <<<"$row"
        python3 -c 'import sys; b, c, w, n, r, e, f = sys.argv[1:]; print("| %s | %s | %s | %s | %s | %s | %.3f | %.3f |" % (b, c, w, n, r, e, float(r) / float(e), float(r) / float(f)))' \
            "$who" "$case" "$w" "$n" "$rate" "${ext[$case|$w]}" "$f"
    done
fi
