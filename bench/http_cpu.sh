#!/usr/bin/env bash
# The dispatcher's cost per webhook delivery (a benchmark, not a test): one
# throwaway cluster, one http handler (signed requests, envelope body) at
# concurrency C, a preloaded backlog of N unkeyed deliveries committed at once,
# delivered to a local nginx (one worker, `return 200;`, keep-alive, no log).
#
#   bench/http_cpu.sh [PG_CONFIG]            # wall clock: deliveries/s, dispatcher CPU µs per delivery
#   MODE=callgrind bench/http_cpu.sh [...]   # instructions (callgrind Ir) per delivery
#   MODE=syscalls bench/http_cpu.sh [...]    # time mode, and system calls per delivery (perf stat on tracepoints)
#
# time mode: D dispatchers (workers_per_database) are started once the backlog
# is loaded; the rate is N over the time from their start to an empty
# relay.deliveries, the CPU their utime + stime from /proc over N; then wrk
# with the same request and C x D connections against the same nginx (WRK_SECS).
# Repeated REPS times (the median and every sample are printed).
#
# callgrind mode: the whole cluster runs under valgrind --tool=callgrind with
# instrumentation off; the one dispatcher's is switched on (callgrind_control
# vgdb instrumentation on) while it is idle, the backlog is committed, and its counts are dumped
# once it is drained: Ir per delivery is the dump's total over N (its idle
# polls before the commit are in it too, a few thousand Ir). Stable to ~1 %
# on a busy machine, unlike the wall clock. CG_OUT keeps the dump.
#
# Environment: N (20000; callgrind 4000), C (64), D (1), REPS (3), WRK_SECS (5),
# MODE (time|callgrind|syscalls), CG_OUT (a file to copy the callgrind dump to),
# HANDLER_OPTS (more handler options, a JSON object's members: e.g.
# '"max_concurrency": 100000' for the cost of a limit that never holds back),
# TRACED=1 (every event published with a traceparent: each attempt carries a
# new span id), OTLP=1 (relaybus.otlp_endpoint at the same nginx: with TRACED,
# a span per delivery exported; docs/tracing.md, "Spans").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PG_CONFIG=${1:-${PG_CONFIG:-$(bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/pg-config.sh")}}
export PG_CONFIG
MODE=${MODE:-time}
if [[ $MODE == callgrind ]]; then N=${N:-4000}; else N=${N:-20000}; fi
C=${C:-64}
D=${D:-1}
REPS=${REPS:-3}
WRK_SECS=${WRK_SECS:-5}
PG_BIN=$("$PG_CONFIG" --bindir)
export PATH="$PG_BIN:$PATH"
note() { echo "# $*" >&2; }

dir=$(mktemp -d /tmp/rb-httpcpu.XXXXXX)
chmod 755 "$dir"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
cleanup() {
    [[ -f "$dir/nginx/nginx.pid" ]] && kill "$(cat "$dir/nginx/nginx.pid")" 2>/dev/null || true
    if [[ $MODE == callgrind && -f "$dir/pg/data/postmaster.pid" ]]; then
        runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$dir/pg/data" -m immediate stop >/dev/null 2>&1 || true
    fi
    bash "$ROOT/test/cluster.sh" destroy "$dir/pg" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
free_port() { python3 "$ROOT/scripts/free-port.py"; }

# ---- receiver
PORT=$(free_port)
mkdir -p "$dir/nginx/logs"
cat >"$dir/nginx/nginx.conf" <<EOF
user root;
worker_processes 1;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
    client_body_temp_path $dir/nginx/body;
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_buffer_size 64k;
    server { listen 127.0.0.1:$PORT reuseport; location / { return 200; } }
}
EOF
"$NGINX" -p "$dir/nginx" -c "$dir/nginx/nginx.conf" -e "$dir/nginx/logs/error.log"

# ---- cluster
EXTRA=$'shared_buffers = 256MB\nmax_wal_size = 4GB\ncheckpoint_timeout = 30min\nrelaybus.enabled = off\nrelaybus.http_allowlist = \'127.0.0.1\''
[[ ${OTLP:-0} == 1 ]] && EXTRA+=$'\n'"relaybus.otlp_endpoint = 'http://127.0.0.1:$PORT'"
TRACE_ARGS=
[[ ${TRACED:-0} == 1 ]] && TRACE_ARGS=", NULL::text[], '{\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}'::jsonb"
RELAYBUS_EXTRA_CONF=$EXTRA bash test/cluster.sh start "$dir/pg" >/dev/null
# shellcheck disable=SC1091
source "$dir/pg/env"
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
if [[ $MODE == callgrind ]]; then
    # The same cluster again, under callgrind, instrumentation off until asked.
    bash test/cluster.sh stop "$dir/pg" >/dev/null
    (cd "$dir/pg" && runuser -u postgres -- env -u LOGNAME -u USER valgrind --tool=callgrind --trace-children=yes --instr-atstart=no \
        --callgrind-out-file="$dir/pg/cg.%p" "$PG_BIN/postgres" -D "$dir/pg/data" >"$dir/pg/log/valgrind.log" 2>&1 &)
    for _ in $(seq 1 600); do pg_isready -q -t 1 && break; sleep 0.5; done
fi
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
q -c "CREATE EXTENSION relaybus"
q -c "SELECT relay_create_handler('bench', 'http', 'http://127.0.0.1:$PORT/hook',
                                  '{\"secret\": \"$SECRET\", \"concurrency\": $C${HANDLER_OPTS:+, $HANDLER_OPTS}}')" \
  -c "SELECT relay_route('bench.ev', 'bench')" >/dev/null
PAYLOAD='{"order_id": 123456, "customer": "c-000042", "amount": 129.95, "currency": "EUR", "items": 3, "note": "bench"}'

set_dispatchers() {  # on|off COUNT: waits until COUNT hold all lanes (or none runs)
    q -c "ALTER SYSTEM SET relaybus.enabled = $1" -c "ALTER SYSTEM SET relaybus.workers_per_database = $2" \
      -c "SELECT pg_reload_conf()" >/dev/null
    local want=$2 i
    [[ $1 == off ]] && want=0
    for i in $(seq 1 1200); do
        [[ $(q -c "SELECT count(*) || ',' || coalesce(sum(lanes_held), 0) FROM relay.workers") == \
           "$want,$(( want > 0 ? 64 : 0 ))" ]] &&
           [[ $(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'") == "$want" ]] && return 0
        sleep 0.1
    done
    echo "dispatchers did not reach $1 x $2" >&2
    return 1
}
preload_sql() {
    local left=$N b
    echo "BEGIN;"
    while ((left > 0)); do
        b=$((left > 10000 ? 10000 : left))
        echo "SELECT count(*) FROM unnest(relay_publish_batch('bench.ev', array_fill('$PAYLOAD'::jsonb, ARRAY[$b])$TRACE_ARGS));"
        left=$((left - b))
    done
    echo "COMMIT;"
}
drained() { [[ $(q -c "SELECT EXISTS (SELECT 1 FROM relay.deliveries)") == f ]]; }
cpu_ticks() {  # utime + stime of the given pids, in clock ticks
    local t=0 p
    for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    echo "$t"
}
delivered() { q -c "SELECT http_2xx FROM relay.handler_stats WHERE handler = 'bench'"; }

if [[ $MODE == callgrind ]]; then
    set_dispatchers on 1
    pid=$(q -c "SELECT pid FROM relay.workers")
    before=$(delivered)
    note "dispatcher $pid under callgrind; instrumentation on, $N deliveries"
    vg() { (cd "$dir/pg" && runuser -u postgres -- env -u LOGNAME -u USER vgdb --pid="$pid" "$@" >/dev/null); }
    # vgdb finds a process by pid and user name; a forked postgres child has
    # overwritten its environment (its ps title), so valgrind and vgdb both
    # run without LOGNAME and USER and agree on "???".
    vg instrumentation on
    vg zero
    preload_sql | q >/dev/null
    for _ in $(seq 1 6000); do drained && break; sleep 0.2; done
    vg dump
    sleep 1
    got=$(( $(delivered) - before ))
    f=$(ls -t "$dir"/pg/cg."$pid"* | head -1)
    ir=$(awk '/^summary:|^totals:/ {print $2; exit}' "$f")
    [[ -n "${CG_OUT:-}" ]] && cp "$f" "$CG_OUT"
    python3 -c "print(f'callgrind: {$ir:,} Ir for $got deliveries (N=$N, C=$C): {$ir / $got:,.0f} Ir per delivery')"
    exit 0
fi

# ---- time mode
# warm-up: one small batch through one dispatcher
set_dispatchers on "$D"
N0=$N; N=2000; preload_sql | q >/dev/null; N=$N0
for _ in $(seq 1 600); do drained && break; sleep 0.1; done
rates=() cpus=()
for r in $(seq 1 "$REPS"); do
    set_dispatchers off "$D"
    preload_sql | q >/dev/null
    q -c "CHECKPOINT" >/dev/null
    before=$(delivered)
    t0=$(date +%s%N)
    set_dispatchers on "$D"
    mapfile -t pids < <(q -c "SELECT pid FROM relay.workers")
    c0=$(cpu_ticks "${pids[@]}")
    if [[ $MODE == syscalls ]]; then
        ev=(-e raw_syscalls:sys_enter)
        for sc in epoll_ctl epoll_wait epoll_create1 close poll sendto recvfrom rt_sigprocmask kill; do
            ev+=(-e "syscalls:sys_enter_$sc")
        done
        perf stat -x, -o "$dir/perf.$r" "${ev[@]}" -p "$(IFS=,; echo "${pids[*]}")" &
        st=$!
    fi
    while ! drained; do sleep 0.02; done
    if [[ $MODE == syscalls ]]; then
        kill -INT "$st"; wait "$st" || true
        awk -F, -v n=$(( $(delivered) - before )) '$1 ~ /^[0-9]+$/ {sub(/.*sys_enter_?/, "", $3); printf "#   system calls per delivery: %s %.2f\n", ($3 == "" ? "all" : $3), $1 / n}' "$dir/perf.$r" >&2
    fi
    t1=$(date +%s%N)
    c1=$(cpu_ticks "${pids[@]}")
    got=$(( $(delivered) - before ))
    rate=$(python3 -c "print(round($got / (($t1 - $t0) / 1e9)))")
    us=$(python3 -c "print(round(($c1 - $c0) * 1e6 / $(getconf CLK_TCK) / $got, 1))")
    note "rep $r: $got deliveries, $rate/s, dispatcher CPU $us µs/delivery (start included: ~0.1-0.3 s)"
    rates+=("$rate") cpus+=("$us")
done
# The request, captured, for wrk (the same body size and headers as the dispatcher's).
body="{\"id\":1234567,\"event_id\":1234567,\"topic\":\"bench.ev\",\"key\":null,\"seq\":null,\"published_at\":\"2026-12-02T01:53:26.123Z\",\"attempt\":1,\"headers\":null,\"payload\":$PAYLOAD}"
cat >"$dir/wrk.lua" <<EOF
wrk.method = "POST"
wrk.body = [[$body]]
wrk.headers["content-type"] = "application/json"
wrk.headers["user-agent"] = "relaybus/0.3.0"
wrk.headers["webhook-id"] = "msg_1234567"
wrk.headers["webhook-timestamp"] = "1764640000"
wrk.headers["webhook-signature"] = "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o6rOnVfNIRQ="
EOF
conns=$((C * D))
wrk_rate=$(wrk -t2 -c"$conns" -d"${WRK_SECS}s" -s "$dir/wrk.lua" "http://127.0.0.1:$PORT/hook" | awk '/^Requests\/sec:/ {printf "%d", $2}')
python3 - "$N" "$C" "$D" "$wrk_rate" "${rates[*]}" "${cpus[*]}" <<'EOF'
import statistics, sys
n, c, d, wrk = sys.argv[1:5]
rates = [int(x) for x in sys.argv[5].split()]
cpus = [float(x) for x in sys.argv[6].split()]
r, u = statistics.median(rates), statistics.median(cpus)
print(f"time: N={n} C={c} D={d}: median {r:,.0f} deliveries/s ({rates}), dispatcher CPU median {u} µs/delivery ({cpus}); "
      f"wrk -c{int(c) * int(d)}: {int(wrk):,}/s; ratio {r / int(wrk):.2f}x")
EOF
