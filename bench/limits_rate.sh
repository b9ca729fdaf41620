#!/usr/bin/env bash
# A handler's `rate` held over a long drain (issue 27, tests and evidence:
# arrivals per second within 10 % of the limit over 30 s), a benchmark, not
# a test, printed as markdown:
#
#   PG_CONFIG=/path/to/pg_config bash bench/limits_rate.sh
#
# One throwaway cluster with DISPATCHERS dispatchers (relaybus.
# workers_per_database), the test receiver (test/integration/http_receiver.py)
# on loopback, one http handler with `rate` RATE and `burst` BURST (and
# `concurrency` 16, so the rate is what limits it), a backlog of RATE x SECS
# events on 64 keys published while the handler is paused, then resumed.
# From the receiver's log: arrivals per second over the whole drain after the
# burst, the busiest and the quietest whole second, and per key order.
#
# Environment: RATE (50), BURST (5), SECS (30), DISPATCHERS (2), PG_CONFIG.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RATE=${RATE:-50}
BURST=${BURST:-5}
SECS=${SECS:-30}
DISPATCHERS=${DISPATCHERS:-2}
PG_CONFIG=${PG_CONFIG:-$(bash scripts/pg-config.sh)}
export PG_CONFIG PATH="$("$PG_CONFIG" --bindir):$PATH"
N=$((RATE * SECS))

dir=$(mktemp -d /tmp/relaybus-limits-rate.XXXXXX)
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
RELAYBUS_EXTRA_CONF="relaybus.http_allowlist = '127.0.0.1'
relaybus.workers_per_database = $DISPATCHERS" bash test/cluster.sh start "$dir/pg" >/dev/null
# shellcheck disable=SC1091
source "$dir/pg/env"
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
q -c "CREATE EXTENSION relaybus" \
  -c "SELECT relay_create_handler('paced', 'http', '$URL/paced',
        '{\"concurrency\": 16, \"rate\": $RATE, \"burst\": $BURST}')" \
  -c "SELECT relay_route('paced.#', 'paced')" \
  -c "SELECT relay_pause_handler('paced')" >/dev/null
for _ in $(seq 1 100); do
    [[ $(q -c "SELECT count(*) FROM relay.workers") == "$DISPATCHERS" ]] && break
    sleep 0.2
done
q -c "SELECT count(*) FROM (SELECT relay_publish('paced.t', jsonb_build_object('i', i), 'k' || (i % 64))
        FROM generate_series(1, $N) i) s" >/dev/null
q -c "SELECT relay_resume_handler('paced')" >/dev/null
for _ in $(seq 1 $((SECS * 40))); do
    [[ $(q -c "SELECT count(*) FROM relay.deliveries") == 0 ]] && break
    sleep 0.1
done
sleep 1
PYTHONPATH=test/integration python3 - "$dir/requests.log" "$RATE" "$BURST" "$SECS" "$DISPATCHERS" "$N" <<'PY'
import sys, http_log
log, rate, burst, secs, disp, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
recs = http_log.records(log, "/paced")
t = sorted(r["t"] for r in recs)
after = [x for x in t if x >= t[0] + 1.0]  # the burst's second left out
mean = (len(after) - 1) / (after[-1] - after[0])
whole = [sum(1 for x in t if s <= x < s + 1) for s in [t[0] + 1 + k for k in range(int(after[-1] - t[0]) - 1)]]
print(f"| rate | burst | dispatchers | events | arrived | drain | arrivals/s after the first second | vs rate | busiest / quietest whole second | out of key order |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
print(f"| {rate:g} | {burst} | {disp} | {n} | {len(t)} | {t[-1] - t[0]:.1f} s | {mean:.2f} | {mean / rate:.3f} | "
      f"{max(whole)} / {min(whole)} | {http_log.disorder(recs)} |")
PY
