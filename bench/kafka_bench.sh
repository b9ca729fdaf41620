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
# broker with acks=all and enable.idempotence=true, as fast as it can.
#
# Each case runs once per key_window in WINDOWS (default "1 32": one message
# of a key in flight at a time, then the default window), so before and after
# come from the same run.
#
# Environment: N (20000), N1 (events at 1 key, 2000), SIZE (200), PRODUCER
# (the handlers' producer option, default {}), WINDOWS, CONCURRENCY (the
# handlers' concurrency, 1024), PG_CONFIG (the build to measure, installed
# there already: make install PG_CONFIG=...).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N=${N:-20000}
N1=${N1:-2000}
SIZE=${SIZE:-200}
PRODUCER=${PRODUCER:-\{\}}
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
for i in $(seq 1 100); do
    [[ $(q -c "SELECT count(*) FROM relay.workers") == 1 ]] && break
    sleep 0.2
done

# run KEYS COUNT WINDOW: events per second from a backlog of COUNT events over KEYS keys.
run() {
    local keys=$1 count=$2 window=$3 t0 t1 name="k$1w$3"
    topic "bench-$name"
    q -c "SELECT relay_create_handler('$name', 'kafka', 'kafka://$BOOT/bench-$name',
                                      '{\"concurrency\": $CONCURRENCY, \"key_window\": $window, \"producer\": $PRODUCER}')" \
      -c "SELECT relay_route('bench.$name', '$name')" -c "SELECT relay_pause_handler('$name')" >/dev/null
    q -c "SELECT count(relay_publish('bench.$name', jsonb_build_object('p', repeat('x', $PAD)), 'k-' || (i % $keys)))
            FROM generate_series(1, $count) i" >/dev/null
    t0=$(date +%s.%N)
    q -c "SELECT relay_resume_handler('$name')" >/dev/null
    while [[ $(q -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                    WHERE h.name = '$name'") != 0 ]]; do
        sleep 0.05
    done
    t1=$(date +%s.%N)
    python3 -c "print('%.0f' % ($count / ($t1 - $t0)))"
}

floor() {
    topic bench-floor
    java -Xmx512m -cp "$CP" org.apache.kafka.tools.ProducerPerformance --topic bench-floor --num-records "$N" \
        --record-size "$SIZE" --throughput -1 \
        --producer-props bootstrap.servers="$BOOT" acks=all enable.idempotence=true 2>/dev/null |
        tail -n 1 | sed -E 's/^[0-9]+ records sent, ([0-9.]+) records\/sec.*/\1/'
}

payload_bytes=$(q -c "SELECT length(jsonb_build_object('p', repeat('x', $PAD))::text)")
note "payload $payload_bytes bytes, producer $PRODUCER, concurrency $CONCURRENCY, windows $WINDOWS"
rows=()
for w in $WINDOWS; do
    rows+=("1 key|$w|$N1|$(run 1 "$N1" "$w")")
    rows+=("1000 keys|$w|$N|$(run 1000 "$N" "$w")")
done
f=$(floor)
echo "| case | key_window | events | events/s | floor (kafka-producer-perf-test, acks=all, idempotent) | ratio |"
echo "| --- | --- | --- | --- | --- | --- |"
for row in "${rows[@]}"; do
    IFS='|' read -r case w n rate <<<"$row"
    python3 -c 'import sys; c, w, n, r, f = sys.argv[1:]; print("| %s | %s | %s | %s | %.0f records/s | %.3f |" % (c, w, n, r, float(f), float(r) / float(f)))' \
        "$case" "$w" "$n" "$rate" "$f"
done
