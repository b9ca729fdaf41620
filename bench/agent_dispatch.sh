#!/usr/bin/env bash
# NOTIFY dispatch of relaybus-agent against the extension's workers, in one
# run: two throwaway clusters of the same PostgreSQL, one with the relaybus
# library preloaded and CREATE EXTENSION (its dispatchers deliver), one with
# nothing preloaded, the managed edition installed and relaybus-agent
# delivering (docs/managed.md). One fire-mode notify handler with a LISTEN
# session; a backlog of N events is published while the handler is paused,
# then the handler is resumed and the time until nothing is pending is taken.
#
#   PG_CONFIG=<a tree with relaybus installed> [AGENT_OPTS="--batch-size 500"] bash bench/agent_dispatch.sh [N]
#
# Cells: unkeyed, keyed (100 keys). Prints events/s of each and the ratio
# agent / workers. synchronous_commit off on both (CPU, not the WAL flush).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20000}
make -s agent >/dev/null
source bench/two_editions.sh
q() { on "$1" psql -X -q -At -v ON_ERROR_STOP=1 -c "$2"; }
setup='SELECT relay_create_handler($$bench$$, $$notify$$, $$bench_chan$$); SELECT relay_route($$bench.#$$, $$bench$$);'
q "$ext" 'CREATE EXTENSION relaybus' >/dev/null
q "$ext" "$setup" >/dev/null
on "$man" psql -X -q -v ON_ERROR_STOP=1 -f "$man/managed.sql" >/dev/null
q "$man" "$setup" >/dev/null
q "$man" "CREATE ROLE bench_agent LOGIN IN ROLE relay_agent" >/dev/null
# A listener on each (NOTIFY's queue is written only for a database with one).
for d in "$ext" "$man"; do
    on "$d" bash -c 'exec psql -X -q -c "LISTEN bench_chan" -c "SELECT pg_sleep(100000)" >/dev/null 2>&1' &
    BENCH_PIDS+=($!)
done
source "$man/env"
./relaybus-agent --database "host=$PGHOST port=$PGPORT dbname=postgres user=bench_agent" --poll-interval 1s \
    --log-level warn ${AGENT_OPTS:-} 2>"$man/agent.log" &
BENCH_PIDS+=($!)

# drain DIR KEYS: events/s of a backlog of N events.
drain() {
    local d=$1 keys=$2 t0 t1 key_expr=NULL
    ((keys > 0)) && key_expr="'k' || (i % $keys)"
    q "$d" "SELECT relay_pause_handler('bench')" >/dev/null
    q "$d" "SELECT count(*) FROM (SELECT relay_publish('bench.e', jsonb_build_object('i', i, 'pad', repeat('x', 60)), $key_expr)
            FROM generate_series(1, $N) i) x" >/dev/null
    # As autovacuum would soon: without statistics the edition's claim locks
    # each row through the wrong index (docs/managed.md, "relaybus-agent").
    q "$d" "ANALYZE relay.deliveries" >/dev/null
    t0=$(date +%s%N)
    q "$d" "SELECT relay_resume_handler('bench')" >/dev/null
    until [[ "$(q "$d" 'SELECT count(*) FROM relay.deliveries')" == 0 ]]; do sleep 0.02; done
    t1=$(date +%s%N)
    echo $((N * 1000000000 / (t1 - t0)))
}
printf '%-8s %12s %12s %8s\n' cell workers agent ratio
for cell in unkeyed:0 keyed:100; do
    name=${cell%%:*} keys=${cell##*:}
    w=$(drain "$ext" "$keys")
    a=$(drain "$man" "$keys")
    printf '%-8s %10s/s %10s/s %8s\n' "$name" "$w" "$a" "$(awk -v a="$a" -v w="$w" 'BEGIN { printf "%.2f", a / w }')"
done
