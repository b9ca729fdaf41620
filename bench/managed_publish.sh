#!/usr/bin/env bash
# Publish cost of the managed SQL edition against the extension, with pgbench,
# in one run: two throwaway clusters of the same PostgreSQL, one with the
# relaybus library preloaded and CREATE EXTENSION, one with nothing preloaded
# and `make managed`'s script installed (docs/managed.md). One routed pull
# handler in each; a ~100-byte payload.
#
#   bash bench/managed_publish.sh [seconds-per-sample]
#
# Cells: relay_publish unkeyed, keyed (1,000 keys), and relay_publish_batch of
# 100 unkeyed events; one client; synchronous_commit off, so the ratio is of
# CPU per call, not of the WAL flush that a durable commit adds to both.
# Samples are interleaved extension, managed, managed, extension; the ratio is
# managed / extension of the two sums. Needs the extension installed in the
# PostgreSQL of scripts/pg-config.sh (make install).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
source bench/two_editions.sh
setup='SELECT relay_create_handler($$bench$$, $$pull$$); SELECT relay_route($$bench.event$$, $$bench$$);'
on "$ext" psql -X -q -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION relaybus' -c "$setup" >/dev/null
on "$man" psql -X -q -v ON_ERROR_STOP=1 -f "$man/managed.sql" -c "$setup" >/dev/null

payload='{"order_id": 42, "amount": 1999, "currency": "EUR", "customer": "c-123456", "note": "abcdefghij"}'
work=$(mktemp -d /tmp/relaybus-bench-sql.XXXXXX)
trap 'bash test/cluster.sh destroy "$ext" >/dev/null 2>&1 || true; bash test/cluster.sh destroy "$man" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
printf '%s\n' "SELECT relay_publish('bench.event', '$payload');" >"$work/unkeyed.sql"
printf '%s\n' '\set k random(1, 1000)' "SELECT relay_publish('bench.event', '$payload', 'order-' || :k);" >"$work/keyed.sql"
printf '%s\n' "SELECT relay_publish_batch('bench.event', array_fill('$payload'::jsonb, ARRAY[100]));" >"$work/batch.sql"
chmod -R a+rX "$work"

tps() { # cluster-dir script
    on "$1" pgbench -n -f "$work/$2.sql" -c 1 -j 1 -T "$SECS" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
printf '%-8s %12s %12s %8s\n' cell "extension" "managed" ratio
for cell in unkeyed keyed batch; do
    e1=$(tps "$ext" $cell) m1=$(tps "$man" $cell) m2=$(tps "$man" $cell) e2=$(tps "$ext" $cell)
    awk -v c=$cell -v e1="$e1" -v e2="$e2" -v m1="$m1" -v m2="$m2" \
        'BEGIN { printf "%-8s %12.0f %12.0f %8.2f\n", c, (e1 + e2) / 2, (m1 + m2) / 2, (m1 + m2) / (e1 + e2) }'
done
