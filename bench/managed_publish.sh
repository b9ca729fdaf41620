#!/usr/bin/env bash
# Publish cost of the managed SQL edition against the extension, with pgbench,
# in one run: two throwaway clusters of the same PostgreSQL, one with the
# relaybus library preloaded and CREATE EXTENSION, one with nothing preloaded
# and `make managed`'s script installed (docs/managed.md). One routed pull
# handler in each; a ~100-byte payload.
#
#   bash bench/managed_publish.sh [seconds-per-sample]
#   bash bench/managed_publish.sh --instructions [calls]
#
# --instructions counts instead of timing: each cell's statement run CALLS
# (default 300) more times than a warm-up of 50 in a single-user backend
# (postgres --single, on a copy of the cluster's data, each statement its own
# transaction) under valgrind's callgrind; the difference of the two runs'
# instruction totals over CALLS is the instructions per call, exact and the
# same from run to run whatever else the machine does. It leaves out what
# pgbench sees besides the server's CPU (the client, the protocol, the
# commit's flush), so its ratios are lower than the timed ones.
#
# Cells: relay_publish unkeyed, keyed (1,000 keys), and relay_publish_batch of
# 100 unkeyed events; one client; synchronous_commit off, so the ratio is of
# CPU per call, not of the WAL flush that a durable commit adds to both.
# Samples are interleaved extension, managed, managed, extension; the ratio is
# managed / extension of the two sums. Needs the extension installed in the
# PostgreSQL of scripts/pg-config.sh (make install).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=time
if [[ "${1:-}" == --instructions ]]; then
    MODE=instructions
    shift
    command -v valgrind >/dev/null || { echo "managed_publish: --instructions needs valgrind" >&2; exit 2; }
fi
SECS=${1:-10}
CALLS=${1:-300}
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

# instructions cluster-dir preload script: instructions per statement (above)
instructions() {
    local d=$1 preload=$2 stmt n total=()
    stmt=$(cat "$work/$3.sql" | grep -v '^\\')
    bash test/cluster.sh stop "$d" >/dev/null
    for n in 50 $((50 + CALLS)); do
        rm -rf "$work/single"
        cp -a "$d/data" "$work/single"
        rm -f "$work/single/postmaster.pid"
        for _ in $(seq "$n"); do printf '%s\n' "$stmt"; done >"$work/in"
        chown -R "$(stat -c %U "$d/data")" "$work/single"
        chmod 644 "$work/in"
        runuser -u "$(stat -c %U "$d/data")" -- valgrind --tool=callgrind --callgrind-out-file="$work/cg.$n" \
            "$("$(bash scripts/pg-config.sh)" --bindir)/postgres" --single -D "$work/single" \
            -c shared_preload_libraries="$preload" postgres <"$work/in" >/dev/null 2>"$work/err.$n" ||
            { cat "$work/err.$n" >&2; exit 1; }
        total+=("$(sed -n 's/^summary: //p' "$work/cg.$n")")
    done
    bash test/cluster.sh start "$d" >/dev/null
    echo $(((total[1] - total[0]) / CALLS))
}
if [[ $MODE == instructions ]]; then
    # The keyed cell's keys are drawn with random() here (pgbench's \set is not SQL).
    printf '%s\n' "SELECT relay_publish('bench.event', '$payload', 'order-' || (random() * 1000)::int);" >"$work/keyed.sql"
    chmod -R a+rwX "$work"
    printf '%-8s %12s %12s %8s\n' cell "extension" "managed" "ext/man"
    for cell in unkeyed keyed batch; do
        e=$(instructions "$ext" relaybus $cell) m=$(instructions "$man" '' $cell)
        awk -v c=$cell -v e="$e" -v m="$m" 'BEGIN { printf "%-8s %12d %12d %8.2f\n", c, e, m, e / m }'
    done
    exit 0
fi

tps() { # cluster-dir script
    on "$1" pgbench -n -f "$work/$2.sql" -c 1 -j 1 -T "$SECS" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
printf '%-8s %12s %12s %8s\n' cell "extension" "managed" ratio
for cell in unkeyed keyed batch; do
    e1=$(tps "$ext" $cell) m1=$(tps "$man" $cell) m2=$(tps "$man" $cell) e2=$(tps "$ext" $cell)
    awk -v c=$cell -v e1="$e1" -v e2="$e2" -v m1="$m1" -v m2="$m2" \
        'BEGIN { printf "%-8s %12.0f %12.0f %8.2f\n", c, (e1 + e2) / 2, (m1 + m2) / 2, (m1 + m2) / (e1 + e2) }'
done
