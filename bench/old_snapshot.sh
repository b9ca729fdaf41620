#!/usr/bin/env bash
# What an old snapshot costs the dispatcher (a benchmark, not a test): one
# throwaway cluster, one notify handler (fire mode), N events committed one at
# a time a few ms apart (KEYS keys, 0 = unkeyed), each claimed on its own; with
# HOLD=1 a REPEATABLE READ session holds a snapshot taken before the first
# event for the whole run (a report, pg_dump, a session idle in transaction).
#
#   bench/old_snapshot.sh [PG_CONFIG]
#   HOLD=1 bench/old_snapshot.sh [PG_CONFIG]
#
# Prints the dispatcher's CPU per event (utime + stime from /proc; noisy), and
# exact counters: index entries read per claim (pg_stat_user_indexes over the
# claim scan's calls) and the statements' mean time (pg_stat_statements).
#
# Environment: N (3000), KEYS (50), SLEEP (seconds between commits, 0.002), HOLD (0).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PG_CONFIG=${1:-${PG_CONFIG:-$(bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/pg-config.sh")}}
export PG_CONFIG
PG_BIN=$("$PG_CONFIG" --bindir)
export PATH="$PG_BIN:$PATH"
N=${N:-3000}
KEYS=${KEYS:-50}
SLEEP=${SLEEP:-0.002}
HOLD=${HOLD:-0}

dir=$(mktemp -d /tmp/rb-oldsnap.XXXXXX)
chmod 755 "$dir"
holder=
cleanup() {
    [[ -n "$holder" ]] && kill "$holder" 2>/dev/null
    bash "$ROOT/test/cluster.sh" destroy "$dir/pg" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
RELAYBUS_EXTRA_CONF=$'shared_preload_libraries = \'relaybus,pg_stat_statements\'' \
    bash test/cluster.sh start "$dir/pg" >/dev/null
# shellcheck disable=SC1091
source "$dir/pg/env"
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
q -c "CREATE EXTENSION relaybus" -c "CREATE EXTENSION pg_stat_statements"
q -c "SELECT relay_create_handler('n', 'notify', 'bench_ch', '{\"ack\": false}')" -c "SELECT relay_route('ev', 'n')" >/dev/null
for _ in $(seq 1 300); do [[ $(q -c "SELECT count(*) FROM relay.workers") == 1 ]] && break; sleep 0.1; done
if [[ $HOLD == 1 ]]; then
    psql -X -q -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT count(*) FROM relay.deliveries" \
        -c "SELECT pg_sleep(86400)" >/dev/null 2>&1 &
    holder=$!
    sleep 1
fi
sleep 2
q -c "SELECT pg_stat_reset()" -c "SELECT pg_stat_statements_reset()" >/dev/null
pid=$(q -c "SELECT pid FROM relay.workers")
c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
key="NULL"
((KEYS > 0)) && key="'k' || (i % $KEYS)"
q -c "DO \$\$ BEGIN FOR i IN 1..$N LOOP
        PERFORM relay_publish('ev', jsonb_build_object('i', i), key => $key);
        COMMIT; PERFORM pg_sleep($SLEEP);
      END LOOP; END \$\$"
for _ in $(seq 1 600); do [[ $(q -c "SELECT count(*) FROM relay.deliveries") == 0 ]] && break; sleep 0.1; done
c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
sleep 2.5  # the dispatcher flushes its statistics at most once a second
echo "# N=$N KEYS=$KEYS SLEEP=$SLEEP HOLD=$HOLD"
python3 -c "print(f'dispatcher CPU per event: {($c1 - $c0) * 1e6 / $(getconf CLK_TCK) / $N:.0f} µs')"
q -F ' ' -c "WITH s AS (SELECT sum(calls) AS c FROM pg_stat_statements
                         WHERE query LIKE '%(SELECT id, priority, key, not_before FROM relay.deliveries WHERE handler_id = \$1 AND priority >= %')
             SELECT 'index entries read per claim: ' || i.indexrelname || ' ' || round(i.idx_tup_read / greatest(s.c, 1), 1)
               FROM pg_stat_user_indexes i, s
              WHERE i.schemaname = 'relay' AND i.relname = 'deliveries' ORDER BY 1"
q -F ' ' -c "SELECT 'mean ms per call: ' || round((total_exec_time / calls)::numeric, 3) || ' x ' || calls || ' ' ||
                    left(regexp_replace(query, '\\s+', ' ', 'g'), 50)
               FROM pg_stat_statements WHERE query LIKE '%relay.deliveries%' AND calls >= $N / 2
              ORDER BY total_exec_time DESC LIMIT 4"
