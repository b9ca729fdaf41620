#!/usr/bin/env bash
# Fairness between handlers (issue 27, item 5), a benchmark, not a test,
# printed as markdown:
#
#   PG_CONFIG=/path/to/pg_config bash bench/fairness.sh
#
# One throwaway cluster (one dispatcher), the test receiver
# (test/integration/http_receiver.py) on loopback, two http handlers of one
# database. QUIET events are published to the quiet handler one by one,
# RATE per second, each in its own transaction, and timed from published_at
# to their arrival: first with nothing else to do (the floor), then while
# the busy handler (concurrency 64) drains a backlog of BACKLOG events.
# BUSY_KIND=notify makes the busy handler a notify one (fire and forget, to a
# channel nobody listens on): it drains far faster, so give it a larger
# BACKLOG (e.g. 1000000).
#
# Environment: BACKLOG (100000), QUIET (100: 5 s, within the drain), RATE (20),
# BUSY_KIND (http), PG_CONFIG.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BACKLOG=${BACKLOG:-100000}
QUIET=${QUIET:-100}
RATE=${RATE:-20}
BUSY_KIND=${BUSY_KIND:-http}
PG_CONFIG=${PG_CONFIG:-$(bash scripts/pg-config.sh)}
export PG_CONFIG PATH="$("$PG_CONFIG" --bindir):$PATH"

note() { echo "# $*" >&2; }
dir=$(mktemp -d /tmp/relaybus-fairness.XXXXXX)
chmod 755 "$dir"
RPID=
cleanup() {
    [[ -n "$RPID" ]] && kill "$RPID" 2>/dev/null || true
    bash "$ROOT/test/cluster.sh" destroy "$dir/pg" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

python3 test/integration/http_receiver.py --port-file "$dir/port" --log "$dir/requests.log" 2>"$dir/receiver.err" &
RPID=$!
for _ in $(seq 1 100); do [[ -s "$dir/port" ]] && break; sleep 0.1; done
URL=http://127.0.0.1:$(cat "$dir/port")
RELAYBUS_EXTRA_CONF=$'shared_buffers = 512MB\nmax_wal_size = 4GB\nrelaybus.http_allowlist = \'127.0.0.1\'' \
    bash test/cluster.sh start "$dir/pg" >/dev/null
# shellcheck disable=SC1091
source "$dir/pg/env"
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
q -c "CREATE EXTENSION relaybus"
if [[ $BUSY_KIND == notify ]]; then
    busy="SELECT relay_create_handler('busy', 'notify', 'busy_channel', '{}')"
else
    busy="SELECT relay_create_handler('busy', 'http', '$URL/busy', '{\"concurrency\": 64}')"
fi
q -c "$busy" \
  -c "SELECT relay_route('f.busy', 'busy')" \
  -c "SELECT relay_create_handler('quiet', 'http', '$URL/quiet', '{}')" \
  -c "SELECT relay_route('f.quiet.#', 'quiet')" >/dev/null
for _ in $(seq 1 100); do
    [[ $(q -c "SELECT count(*) FROM relay.workers") == 1 ]] && break
    sleep 0.2
done

# quiet TAG: QUIET events at RATE per second to f.quiet.TAG; waits for them.
quiet() {
    local i
    for i in $(seq 1 "$QUIET"); do
        q -c "SELECT relay_publish('f.quiet.$1', jsonb_build_object('i', $i))" >/dev/null
        sleep "$(python3 -c "print(1 / $RATE)")"
    done
    for _ in $(seq 1 300); do
        [[ $(grep -c "f\\.quiet\\.$1\\\\\"" "$dir/requests.log" || true) -ge "$QUIET" ]] && return
        sleep 0.1
    done
}
# latencies TAG: p50, p99 and max (ms) of f.quiet.TAG, publish to arrival.
latencies() {
    python3 - "$dir/requests.log" "f.quiet.$1" <<'PY'
import datetime, json, sys
lat = []
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
        e = json.loads(r["body"])
    except ValueError:
        continue
    if r["path"] != "/quiet" or e["topic"] != sys.argv[2]:
        continue
    pub = datetime.datetime.strptime(e["published_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    lat.append((r["t"] - pub.timestamp()) * 1000)
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
print("%d|%.1f|%.1f|%.1f" % (len(lat), q(0.5), q(0.99), lat[-1]))
PY
}

note "floor: $QUIET quiet events at $RATE/s, nothing else pending"
quiet floor
floor=$(latencies floor)
note "backlog: $BACKLOG events of the busy handler"
q -c "SELECT relay_pause_handler('busy')" \
  -c "SELECT count(relay_publish('f.busy', jsonb_build_object('i', i), 'k' || (i % 1000))) FROM generate_series(1, $BACKLOG) i" \
  -c "SELECT relay_resume_handler('busy')" >/dev/null
sleep 1
before=$(q -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'busy'")
quiet backlog
after=$(q -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'busy'")
busy=$(latencies backlog)
echo "| case | quiet events | p50 ms | p99 ms | max ms | busy handler pending (start / end of the quiet events) |"
echo "| --- | --- | --- | --- | --- | --- |"
IFS='|' read -r n p50 p99 mx <<<"$floor"
echo "| quiet handler alone (floor) | $n | $p50 | $p99 | $mx | - |"
IFS='|' read -r n p50 p99 mx <<<"$busy"
echo "| quiet handler beside a $BUSY_KIND handler's backlog of $BACKLOG | $n | $p50 | $p99 | $mx | $before / $after |"
