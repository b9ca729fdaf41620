#!/usr/bin/env bash
# Dispatch of relaybus-agent against the extension's workers, in one run: two
# throwaway clusters of the same PostgreSQL, one with the relaybus library
# preloaded and CREATE EXTENSION (its dispatchers deliver), one with nothing
# preloaded, the managed edition installed and relaybus-agent delivering
# (docs/managed.md). A fire-mode notify handler with a LISTEN session, and an
# http handler (concurrency 16) to a local nginx answering 200; a backlog of
# N events is published while the handler is paused, then the handler is
# resumed and the time until nothing is pending is taken.
#
#   PG_CONFIG=<a tree with relaybus installed> [AGENT_OPTS="--batch-size 500"] [ANALYZE=0] [MANAGED_SQL=FILE] \
#       bash bench/agent_dispatch.sh [N]
#
# Cells: notify unkeyed and keyed (100 keys), http unkeyed. Prints events/s
# of each and the ratio agent / workers, and for the agent per 1,000
# deliveries: its statements (each one round trip: calls of relay._agent_notify,
# _agent_claim and _agent_settle, from pg_stat_user_functions), the server
# time of those calls, and the agent's own CPU time. synchronous_commit off
# on both (CPU, not the WAL flush). MANAGED_SQL=FILE: another build of the
# edition's script (bench/two_editions.sh). Needs nginx (Debian: nginx-light).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20000}
make -s agent >/dev/null
source bench/two_editions.sh
q() { on "$1" psql -X -q -At -v ON_ERROR_STOP=1 -c "$2"; }
# nginx: one worker, 200 to every request, on a free port.
port=$(python3 "$(dirname "${BASH_SOURCE[0]}")/../scripts/free-port.py")
mkdir -p "$man/nginx"
printf 'user root; worker_processes 1; pid %s/nginx.pid; error_log %s/error.log warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000; keepalive_timeout 300s; client_body_temp_path %s/body;
       server { listen 127.0.0.1:%s; location / { return 200; } } }\n' "$man/nginx" "$man/nginx" "$man/nginx" "$port" \
    >"$man/nginx/nginx.conf"
nginx -p "$man/nginx" -c "$man/nginx/nginx.conf" -e "$man/nginx/error.log"
BENCH_PIDS+=("$(sleep 0.5; cat "$man/nginx/nginx.pid")")
setup="SELECT relay_create_handler('bench', 'notify', 'bench_chan'); SELECT relay_route('bench.#', 'bench');
       SELECT relay_create_handler('bench_http', 'http', 'http://127.0.0.1:$port/hook');
       SELECT relay_route('benchh.#', 'bench_http');"
q "$ext" "ALTER SYSTEM SET relaybus.http_allowlist = '127.0.0.1'" >/dev/null
q "$ext" "SELECT pg_reload_conf()" >/dev/null
q "$ext" 'CREATE EXTENSION relaybus' >/dev/null
q "$ext" "$setup" >/dev/null
on "$man" psql -X -q -v ON_ERROR_STOP=1 -f "$man/managed.sql" >/dev/null
q "$man" "$setup" >/dev/null
q "$man" "ALTER SYSTEM SET track_functions = 'pl'" >/dev/null
q "$man" "SELECT pg_reload_conf()" >/dev/null
q "$man" "CREATE ROLE bench_agent LOGIN IN ROLE relay_agent" >/dev/null
# A listener on each (NOTIFY's queue is written only for a database with one).
for d in "$ext" "$man"; do
    on "$d" bash -c 'exec psql -X -q -c "LISTEN bench_chan" -c "SELECT pg_sleep(100000)" >/dev/null 2>&1' &
    BENCH_PIDS+=($!)
done
source "$man/env"
./relaybus-agent --database "host=$PGHOST port=$PGPORT dbname=postgres user=bench_agent" --poll-interval 1s \
    --http-allowlist 127.0.0.1 \
    --log-level warn ${AGENT_OPTS:-} 2>"$man/agent.log" &
agent_pid=$!
BENCH_PIDS+=("$agent_pid")
# counters: "calls server_ms agent_cpu_ms" so far (the agent's statements).
counters() {
    local cpu
    cpu=$(awk '{ print ($14 + $15) * 10 }' "/proc/$agent_pid/stat")
    q "$man" "SELECT coalesce(sum(calls), 0) || ' ' || round(coalesce(sum(total_time), 0)::numeric, 1) || ' $cpu'
                FROM pg_stat_user_functions
               WHERE schemaname = 'relay' AND funcname IN ('_agent_notify', '_agent_claim', '_agent_settle')"
}

# drain DIR HANDLER TOPIC KEYS: events/s of a backlog of N events.
drain() {
    local d=$1 handler=$2 topic=$3 keys=$4 t0 t1 key_expr=NULL
    ((keys > 0)) && key_expr="'k' || (i % $keys)"
    q "$d" "SELECT relay_pause_handler('$handler')" >/dev/null
    q "$d" "SELECT count(*) FROM (SELECT relay_publish('$topic', jsonb_build_object('i', i, 'pad', repeat('x', 60)), $key_expr)
            FROM generate_series(1, $N) i) x" >/dev/null
    # As autovacuum would soon; ANALYZE=0 leaves the backlog without
    # statistics (the edition's claim must not depend on them).
    [[ ${ANALYZE:-1} == 0 ]] || q "$d" "ANALYZE relay.deliveries" >/dev/null
    [[ $d == "$man" ]] && c0=$(counters)
    t0=$(date +%s%N)
    q "$d" "SELECT relay_resume_handler('$handler')" >/dev/null
    until [[ "$(q "$d" 'SELECT count(*) FROM relay.deliveries')" == 0 ]]; do sleep 0.02; done
    t1=$(date +%s%N)
    # The statistics reach the view when the agent's session reports them (at
    # most once a second, at the end of a statement; it polls every second).
    [[ $d == "$man" ]] && sleep 2.5 && c1=$(counters) && echo "$c0 $c1" >"$man/counters"
    echo $((N * 1000000000 / (t1 - t0)))
}
printf '%-15s %12s %12s %8s %16s %16s %16s\n' cell workers agent ratio 'stmts/1k' 'server ms/1k' 'agent cpu ms/1k'
for cell in notify-unkeyed:bench:bench.e:0 notify-keyed:bench:bench.e:100 http-unkeyed:bench_http:benchh.e:0; do
    IFS=: read -r name handler topic keys <<<"$cell"
    w=$(drain "$ext" "$handler" "$topic" "$keys")
    a=$(drain "$man" "$handler" "$topic" "$keys")
    read -r n0 s0 c0 n1 s1 c1 <"$man/counters"
    printf '%-15s %10s/s %10s/s %8s %16s %16s %16s\n' "$name" "$w" "$a" \
        "$(awk -v a="$a" -v w="$w" 'BEGIN { printf "%.2f", a / w }')" \
        "$(awk -v x="$n0" -v y="$n1" -v n="$N" 'BEGIN { printf "%.1f", (y - x) * 1000 / n }')" \
        "$(awk -v x="$s0" -v y="$s1" -v n="$N" 'BEGIN { printf "%.1f", (y - x) * 1000 / n }')" \
        "$(awk -v x="$c0" -v y="$c1" -v n="$N" 'BEGIN { printf "%.1f", (y - x) * 1000 / n }')"
done
