#!/usr/bin/env bash
# Publish cost against the floor, with pgbench, on one throwaway cluster in one run.
#
#   bash bench/publish_pgbench.sh [seconds-per-sample]
#
# Cells: relay_publish of a ~100-byte payload with a key (1,000 distinct keys,
# one routed pull handler) against a bare single-row INSERT of the same payload
# and key into a plain table with a bigserial primary key; 1 and 8 clients;
# samples interleaved floor, relay, relay, floor. Then exact counters per
# publish from a fixed number of single-client transactions: WAL bytes
# (pg_current_wal_lsn), WAL records (pg_stat_wal), and the statements relaybus
# runs inside the call (pg_stat_statements with track = all).
# Durable settings: fsync, synchronous_commit and full_page_writes on.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-15}
TX=${TX:-5000}
dir=$(mktemp -d /tmp/relaybus-bench.XXXXXX)
trap 'bash test/cluster.sh destroy "$dir" >/dev/null 2>&1 || true' EXIT
RELAYBUS_EXTRA_CONF=$'pg_stat_statements.track = all\nshared_buffers = 512MB\nmax_wal_size = 4GB\ncheckpoint_timeout = 30min' \
    bash test/cluster.sh start "$dir" >/dev/null
# shellcheck disable=SC1091
source "$dir/env"
psql() { command psql -X -q -v ON_ERROR_STOP=1 "$@"; }
psql <<'SQL'
CREATE EXTENSION relaybus;
CREATE EXTENSION pg_stat_statements;
SELECT relay_create_handler('bench', 'pull');
SELECT relay_route('bench.event', 'bench');
CREATE TABLE floor_events (id bigserial PRIMARY KEY, key text, payload jsonb NOT NULL);
SQL
payload='{"order_id": 42, "amount": 1999, "currency": "EUR", "customer": "c-123456", "note": "abcdefghij"}'
printf '%s\n' '\set k random(1, 1000)' \
    "SELECT relay_publish('bench.event', '$payload', 'order-' || :k);" >"$dir/relay.sql"
printf '%s\n' '\set k random(1, 1000)' \
    "INSERT INTO floor_events (key, payload) VALUES ('order-' || :k, '$payload');" >"$dir/floor.sql"
chmod 644 "$dir"/*.sql
tps() { # script clients seconds
    pgbench -n -f "$dir/$1.sql" -c "$2" -j "$2" -T "$3" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
tps floor 8 3 >/dev/null; tps relay 8 3 >/dev/null   # warm-up
echo "| cell | floor tx/s | relay_publish tx/s | ratio |"
echo "| --- | ---: | ---: | ---: |"
for c in 1 8; do
    f1=$(tps floor $c "$SECS"); r1=$(tps relay $c "$SECS"); r2=$(tps relay $c "$SECS"); f2=$(tps floor $c "$SECS")
    python3 - "$c" "$f1" "$f2" "$r1" "$r2" <<'PY'
import sys
c, f1, f2, r1, r2 = sys.argv[1], *map(float, sys.argv[2:])
f, r = (f1 + f2) / 2, (r1 + r2) / 2
print(f"| {c} client(s), 1 event per transaction | {f:,.0f} ({f1:,.0f}, {f2:,.0f}) | {r:,.0f} ({r1:,.0f}, {r2:,.0f}) | {r / f:.2f}x |")
PY
done
counters() { # script -> "wal_bytes wal_records statements"
    psql -At -c "CHECKPOINT" -c "SELECT pg_stat_statements_reset()" -c "SELECT pg_stat_reset_shared('wal')" >/dev/null
    local lsn0
    lsn0=$(psql -At -c "SELECT pg_current_wal_lsn()")
    pgbench -n -f "$dir/$1.sql" -c 1 -t "$TX" >/dev/null 2>&1
    psql -At -F ' ' -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$lsn0'),
        (SELECT wal_records FROM pg_stat_wal),
        (SELECT sum(calls) FROM pg_stat_statements WHERE query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%pg_current_wal_lsn%' AND query <> 'CHECKPOINT')"
}
read -r fw fr fs <<<"$(counters floor)"
read -r rw rr rs <<<"$(counters relay)"
echo
echo "Per transaction over $TX single-client transactions (after a CHECKPOINT, so full-page images included):"
echo
echo "| counter | floor INSERT | relay_publish | ratio |"
echo "| --- | ---: | ---: | ---: |"
python3 - "$TX" "$fw" "$fr" "$fs" "$rw" "$rr" "$rs" <<'PY'
import sys
tx = int(sys.argv[1]); fw, fr, fs, rw, rr, rs = map(float, sys.argv[2:])
for name, f, r in (("WAL bytes", fw, rw), ("WAL records", fr, rr), ("statements (client + nested)", fs, rs)):
    print(f"| {name} | {f / tx:,.1f} | {r / tx:,.1f} | {r / f:.2f}x |")
PY
echo
echo "Statements run during the relay_publish counter run (calls, query):"
psql -At -F ' | ' -c "SELECT calls, left(regexp_replace(query, '\s+', ' ', 'g'), 100) FROM pg_stat_statements WHERE query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%pg_current_wal_lsn%' AND query <> 'CHECKPOINT' ORDER BY calls DESC"
