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
# Environment: N (20000), N1 (events at 1 key, 2000), SIZE (200), PAYLOAD (x), PRODUCERS
# (the handlers' producer options to compare, separated by ';', default
# '{}'; PRODUCER sets one), WINDOWS, CONCURRENCY (the handlers' concurrency,
# 1024), PG_CONFIG (the build to measure, installed there already: make
# install PG_CONFIG=...).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N=${N:-20000}
N1=${N1:-2000}
SIZE=${SIZE:-200}
PRODUCERS=${PRODUCERS:-${PRODUCER:-\{\}}}
WINDOWS=${WINDOWS:-1 32}
CONCURRENCY=${CONCURRENCY:-1024}
PG_CONFIG=${PG_CONFIG:-$(bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/pg-config.sh")}
export PG_CONFIG PATH="$("$PG_CONFIG" --bindir):$PATH"

note() { echo "# $*" >&2; }
dir=$(mktemp -d /tmp/relaybus-kafkabench.XXXXXX)
chmod 755 "$dir"
cleanup() {
    bash "$ROOT/scripts/kafka-broker.sh" stop "$dir/kafka" >/dev/null 2>&1 || true
    bash "$ROOT/test/cluster.sh" destroy "$dir/pg" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

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
note "payload $payload_bytes bytes, producers $PRODUCERS, concurrency $CONCURRENCY, windows $WINDOWS"
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
f=$(python3 -c 'import sys; print(max(float(a) for a in sys.argv[1:]))' "$f0" "$(floor bench-floor-after)")
note "floor: $f0 records/s before the cases, the higher of it and the one after: $f"
echo "| case | key_window | producer | events | events/s | floor (kafka-producer-perf-test, acks=all, idempotent) | ratio | send p50 / p99 (ms) | bytes stored per message |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for row in "${rows[@]}"; do
    IFS='|' read -r case w p n rate p50 p99 per <<<"$row"
    python3 -c 'import sys; c, w, p, n, r, f, p50, p99, per = sys.argv[1:]; print("| %s | %s | `%s` | %s | %s | %.0f records/s | %.3f | %s / %s | %s |" % (c, w, p, n, r, float(f), float(r) / float(f), p50, p99, per))' \
        "$case" "$w" "$p" "$n" "$rate" "$f" "$p50" "$p99" "$per"
done
