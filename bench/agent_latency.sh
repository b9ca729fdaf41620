#!/usr/bin/env bash
# Publish-to-handler latency, relaybus-agent beside the extension's workers
# (docs/managed.md, "relaybus-agent"): two clusters of the same PostgreSQL
# (bench/two_editions.sh), in each a fire-mode notify handler (received by
# listen_client) and an http handler (received by
# test/integration/http_receiver.py) routed from one topic; pgbench publishes
# at RATE events/s for SECS seconds, each payload carrying its
# clock_timestamp(); the latency is the receipt time minus that.
#
#   PG_CONFIG=<a tree with relaybus installed> bash bench/agent_latency.sh [RATE] [SECS]
#
# Prints p50, p99 and max per edition and handler. The receivers are on the
# same machine (one clock); the http receiver is Python, its own time included.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-200}
SECS=${2:-10}
make -s agent >/dev/null
source bench/two_editions.sh
bash test/integration/lib.sh --build-client >/dev/null

# measure DIR: sets up the handlers and receivers of DIR's cluster, publishes,
# prints the latencies.
measure() {
    local d=$1
    (
        # shellcheck disable=SC1091
        source "$d/env"
        q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
        python3 test/integration/http_receiver.py --port-file "$d/recv.port" --log "$d/recv.log" 2>/dev/null &
        echo $! >>"$d/pids"
        until [[ -s "$d/recv.port" ]]; do sleep 0.1; done
        q -c "SELECT relay_create_handler('lat_n', 'notify', 'lat_chan')" -c "SELECT relay_route('lat.#', 'lat_n')" \
          -c "SELECT relay_create_handler('lat_h', 'http', 'http://127.0.0.1:$(cat "$d/recv.port")/lat')" \
          -c "SELECT relay_route('lat.#', 'lat_h')" >/dev/null
        test/integration/build/listen_client --channel lat_chan --timestamps "dbname=postgres" >"$d/listen.out" 2>/dev/null &
        echo $! >>"$d/pids"
        sleep 2
        echo "SELECT relay_publish('lat.e', jsonb_build_object('t', extract(epoch FROM clock_timestamp())));" >"$d/pub.sql"
        pgbench -n -f "$d/pub.sql" -R "$RATE" -T "$SECS" -c 1 postgres >/dev/null 2>&1
        sleep 3
        kill $(cat "$d/pids") 2>/dev/null || true
    )
    python3 - "$d/listen.out" "$d/recv.log" "$2" <<'PY'
import json, sys
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] if v else float("nan")
notify = []
for line in open(sys.argv[1]):
    parts = line.rstrip("\n").split("\t")
    notify.append((float(parts[2].split("=")[1]) - json.loads(parts[1])["payload"]["t"]) * 1000)
http = []
for line in open(sys.argv[2]):
    r = json.loads(line)
    http.append((r["t"] - json.loads(r["body"])["payload"]["t"]) * 1000)
for name, v in (("notify", notify), ("http", http)):
    print(f"{sys.argv[3]:8s} {name:7s} n={len(v):5d}  p50={pct(v, .5):7.2f} ms  p99={pct(v, .99):7.2f} ms  max={max(v or [0]):7.2f} ms")
PY
}

on "$ext" psql -X -q -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION relaybus' \
    -c "ALTER SYSTEM SET relaybus.http_allowlist = '127.0.0.1'" -c 'SELECT pg_reload_conf()' >/dev/null
on "$man" psql -X -q -v ON_ERROR_STOP=1 -f "$man/managed.sql" \
    -c "CREATE ROLE bench_agent LOGIN IN ROLE relay_agent" >/dev/null
source "$man/env"
./relaybus-agent --database "host=$PGHOST port=$PGPORT dbname=postgres user=bench_agent" --http-allowlist 127.0.0.1 \
    2>"$man/agent.log" &
BENCH_PIDS+=($!)
measure "$ext" workers
measure "$man" agent
