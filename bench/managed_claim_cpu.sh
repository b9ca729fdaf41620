#!/usr/bin/env bash
# Server CPU of the managed edition's claim per delivery, counted rather than
# timed (this machine is shared: wall time follows the load, a backend's CPU
# time much less): one throwaway cluster with nothing preloaded, a fresh
# database per cell with the edition installed and autovacuum off on
# relay.deliveries. One session claims on the empty table first (its plans
# are made and cached there, as a long-running agent's are), then N events
# are published from another session (unkeyed, or over KEYS keys), then the
# session drains them, and the backend's utime + stime over the drain
# (/proc/PID/stat, 10 ms ticks) is divided by N.
#
#   [MANAGED_SQL=FILE] [N=20000] bash bench/managed_claim_cpu.sh
#
# Cells: notify (relay._agent_notify, batch 1,000, claim_scan_limit 1,000 as
# the agent sets it) and pull (relay_claim of 100 + relay_ack, defaults),
# unkeyed and 100 keys, each with and without ANALYZE before the drain.
# MANAGED_SQL: another build of the edition's script (an A/B).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-20000}
source bench/managed_script.sh
dir=$(mktemp -d /tmp/relaybus-claim-cpu.XXXXXX)
trap 'bash test/cluster.sh destroy "$dir" >/dev/null 2>&1 || true' EXIT
RELAYBUS_PRELOAD='' RELAYBUS_EXTRA_CONF=$'shared_buffers = 256MB\nsynchronous_commit = off' \
    bash test/cluster.sh start "$dir" >/dev/null
cp "$script" "$dir/managed.sql"
chmod 644 "$dir/managed.sql"
# shellcheck disable=SC1091
source "$dir/env"

# cell KIND KEYS ANALYZE: µs of backend CPU per delivery.
cell() {
    local kind=$1 keys=$2 analyze=$3 key=NULL db=cell$RANDOM warm drain before after
    ((keys > 0)) && key="'k' || (i % $keys)"
    createdb "$db"
    psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" -f "$dir/managed.sql" >/dev/null
    if [[ $kind == notify ]]; then
        psql -X -q -At -d "$db" -c "SELECT relay_create_handler('b', 'notify', 'b_chan')" >/dev/null
        warm="SET relaybus.claim_scan_limit = 1000;
              SELECT relay._agent_notify((SELECT id FROM relay.handlers WHERE name = 'b'), 1000, 7900)
                FROM generate_series(1, 8);"
        drain="DO \$\$ BEGIN
                   WHILE relay._agent_notify((SELECT id FROM relay.handlers WHERE name = 'b'), 1000, 7900) > 0 LOOP
                       COMMIT;
                   END LOOP;
               END \$\$;"
    else
        psql -X -q -At -d "$db" -c "SELECT relay_create_handler('b', 'pull')" >/dev/null
        warm="SELECT (SELECT count(*) FROM relay_claim('b', 100 + 0 * g)) FROM generate_series(1, 8) g;"
        drain="DO \$\$ DECLARE ids bigint[]; BEGIN
                   LOOP
                       SELECT array_agg(id) INTO ids FROM relay_claim('b', 100);
                       EXIT WHEN ids IS NULL;
                       PERFORM relay_ack(ids);
                       COMMIT;
                   END LOOP;
               END \$\$;"
    fi
    psql -X -q -At -d "$db" -c "ALTER TABLE relay.deliveries SET (autovacuum_enabled = false)" \
        -c "SELECT relay_route('b.#', 'b')" >/dev/null
    # One line: psql's \! ends at the line's end.
    local publish="SELECT count(*) FROM (SELECT relay_publish('b.e', jsonb_build_object('i', i, 'pad', repeat('x', 60)), $key) FROM generate_series(1, $N) i) x"
    {
        echo "$warm"
        echo "\\! psql -X -q -At -d $db -c \"$publish\" >/dev/null"
        ((analyze)) && echo "ANALYZE relay.deliveries;"
        echo "SELECT pg_backend_pid() AS pid \\gset"
        echo "\\setenv BPID :pid"
        echo "\\! echo before \$(cut -d' ' -f14,15 /proc/\$BPID/stat)"
        echo "$drain"
        echo "\\! echo after \$(cut -d' ' -f14,15 /proc/\$BPID/stat)"
        echo "SELECT 'left', count(*) FROM relay.deliveries;"
    } | psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" >"$dir/cell.out" 2>&1
    read -r _ u0 s0 < <(grep '^before' "$dir/cell.out")
    read -r _ u1 s1 < <(grep '^after' "$dir/cell.out")
    [[ "$(grep "^left" "$dir/cell.out")" == "left|0" ]] || { echo "cell $kind $keys: not drained:" >&2; cat "$dir/cell.out" >&2; exit 1; }
    dropdb "$db"
    echo $(((u1 + s1 - u0 - s0) * 10 * 1000000 / N / 1000))
}
printf '%-8s %6s %22s %22s\n' claim keys 'µs/delivery, fresh' 'µs/delivery, ANALYZE'
for kind in notify pull; do
    for keys in 0 100; do
        printf '%-8s %6s %22s %22s\n' "$kind" "$keys" "$(cell "$kind" "$keys" 0)" "$(cell "$kind" "$keys" 1)"
    done
done
