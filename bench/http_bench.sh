#!/usr/bin/env bash
# Webhook delivery evidence for the closing note of the HTTP callouts issue (a
# benchmark, not a test), on one throwaway cluster, printed as a markdown report:
#
#   bash bench/http_bench.sh
#
#  1. Throughput: deliveries per second from a preloaded backlog of N unkeyed
#     deliveries (committed in one transaction) to a fast local receiver (nginx,
#     one worker, `return 200;`) at per-handler concurrency 1, 16 and 64,
#     against what the same nginx takes from a load generator (wrk, POST with
#     the same body and headers, as many connections) on the same machine.
#  2. Memory: the dispatcher's VmRSS (and its private part, RssAnon) after
#     CALLOUTS callouts in all.
#  3. Outage: events published at a paced RATE/s for DURATION s; the
#     receiver (a second nginx, logging every request's webhook-id) is stopped
#     for OUTAGE s in the middle. Requests made to the down endpoint, backlog
#     peak, time to drain after recovery, and nothing lost. The handler has the
#     default options (backoff 1s..10min, circuit breaker).
#
# Environment: N (20000), CALLOUTS (100000), RATE (1000), DURATION (90),
# OUTAGE (60), OUTAGE_AT (15), WRK_SECS (10). Needs nginx, wrk and pgbench
# (installs the Debian packages nginx-light and wrk when missing); run
# `make && make install` first. Durable settings (fsync, synchronous_commit on).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N=${N:-20000}
CALLOUTS=${CALLOUTS:-100000}
RATE=${RATE:-1000}
DURATION=${DURATION:-90}
OUTAGE=${OUTAGE:-60}
OUTAGE_AT=${OUTAGE_AT:-15}
WRK_SECS=${WRK_SECS:-10}
PG_BIN=$($(bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/pg-config.sh") --bindir)
export PATH="$PG_BIN:$PATH"

note() { echo "# $*" >&2; }
if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
    note "installing nginx-light and wrk"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light wrk >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

dir=$(mktemp -d /tmp/relaybus-httpbench.XXXXXX)
chmod 755 "$dir"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for f in "$dir"/nginx-*/nginx.pid; do [[ -f "$f" ]] && kill "$(cat "$f")" 2>/dev/null || true; done
    bash "$ROOT/test/cluster.sh" destroy "$dir/pg" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

free_port() { python3 "$ROOT/scripts/free-port.py"; }

# nginx_start NAME PORT ACCESS_LOG(off|file): one worker, 200 to everything.
nginx_start() {
    local name=$1 port=$2 alog=$3 d=$dir/nginx-$1
    mkdir -p "$d/logs"
    local access="access_log off;"
    [[ "$alog" != off ]] && access="access_log $alog ids buffer=64k flush=200ms;"
    cat >"$d/nginx.conf" <<EOF
user root;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
events { worker_connections 4096; }
http {
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    log_format ids '\$msec \$http_webhook_id \$status';
    $access
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_buffer_size 64k;
    server {
        listen 127.0.0.1:$port reuseport;
        location / { return 200; }
    }
}
EOF
    "$NGINX" -p "$d" -c "$d/nginx.conf" -e "$d/logs/error.log" || return 1
    local i
    for i in $(seq 1 50); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2).close()" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nginx $name did not start" >&2
    return 1
}
nginx_stop() { local d=$dir/nginx-$1; "$NGINX" -p "$d" -c "$d/nginx.conf" -e "$d/logs/error.log" -s stop; sleep 0.3; }

# ---------------------------------------------------------------- the cluster
note "cluster in $dir/pg"
RELAYBUS_EXTRA_CONF=$'shared_buffers = 512MB\nmax_wal_size = 4GB\ncheckpoint_timeout = 30min' \
    bash test/cluster.sh start "$dir/pg" >/dev/null
# shellcheck disable=SC1091
source "$dir/pg/env"
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
q -d postgres -c "ALTER SYSTEM SET relaybus.http_allowlist = '127.0.0.1'" -c "SELECT pg_reload_conf()" >/dev/null
q -c "CREATE EXTENSION relaybus"
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
FAST_PORT=$(free_port)
nginx_start fast "$FAST_PORT" off
q -c "SELECT relay_create_handler('bench', 'http', 'http://127.0.0.1:$FAST_PORT/hook',
                                  '{\"secret\": \"$SECRET\", \"concurrency\": 1}')" \
  -c "SELECT relay_route('bench.ev', 'bench')" >/dev/null
for i in $(seq 1 100); do
    [[ $(q -c "SELECT count(*) FROM relay.workers") == 1 ]] && break
    sleep 0.2
done
dispatcher=$(q -c "SELECT pid FROM relay.workers")
PAYLOAD='{"order_id": 123456, "customer": "c-000042", "amount": 129.95, "currency": "EUR", "items": 3, "note": "bench"}'

rss() { awk '/^(VmRSS|RssAnon|VmHWM):/ {printf "%s=%s ", $1, $2}' "/proc/$dispatcher/status"; }
callouts() { q -c "SELECT http_2xx + http_3xx + http_4xx + http_5xx + http_errors FROM relay.handler_stats WHERE handler = 'bench'"; }

# preload_and_drain N: N unkeyed deliveries committed at once; prints the seconds to deliver them all.
preload_and_drain() {
    local n=$1 left=$1 sqls=() b t0 t1
    while ((left > 0)); do
        b=$((left > 10000 ? 10000 : left))
        sqls+=(-c "SELECT count(*) FROM unnest(relay_publish_batch('bench.ev', array_fill('$PAYLOAD'::jsonb, ARRAY[$b])))")
        left=$((left - b))
    done
    q -c "BEGIN" "${sqls[@]}" -c "COMMIT" >/dev/null
    t0=$(date +%s%N)
    while [[ $(q -c "SELECT EXISTS (SELECT 1 FROM relay.deliveries)") == t ]]; do sleep 0.05; done
    t1=$(date +%s%N)
    python3 -c "print(f'{($t1 - $t0) / 1e9:.3f}')"
}

# One request's exact body and headers, for wrk: captured from a real delivery
# by a throwaway python receiver.
CAP_PORT=$(free_port)
python3 - "$CAP_PORT" "$dir/sample.json" <<'EOF' &
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        json.dump({"body": body.decode(), "headers": {k.lower(): v for k, v in self.headers.items()}},
                  open(sys.argv[2], "w"))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).handle_request()
EOF
PIDS+=($!)
sleep 0.5
q -c "SELECT relay_create_handler('capture', 'http', 'http://127.0.0.1:$CAP_PORT/hook', '{\"secret\": \"$SECRET\"}')" \
  -c "SELECT relay_route('bench.capture', 'capture')" \
  -c "SELECT relay_publish('bench.capture', '$PAYLOAD')" >/dev/null
for i in $(seq 1 100); do [[ -s "$dir/sample.json" ]] && break; sleep 0.1; done
q -c "SELECT relay_drop_handler('capture', true)" >/dev/null
python3 - "$dir/sample.json" "$dir/wrk.lua" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
keep = ["content-type", "user-agent", "webhook-id", "webhook-timestamp", "webhook-signature", "accept"]
lua = ['wrk.method = "POST"', "wrk.body = " + json.dumps(s["body"])]
lua += [f'wrk.headers[{json.dumps(k)}] = {json.dumps(s["headers"][k])}' for k in keep if k in s["headers"]]
open(sys.argv[2], "w").write("\n".join(lua) + "\n")
EOF
BODY_BYTES=$(python3 -c "import json; print(len(json.load(open('$dir/sample.json'))['body'].encode()))")

# ---------------------------------------------------------------- 1. throughput
note "warm-up"
q -c "SELECT relay_alter_handler('bench', options => '{\"concurrency\": 16}')" >/dev/null
preload_and_drain 2000 >/dev/null
rss_start=$(rss)
declare -A RELAY WRK SECS
for c in 1 16 64; do
    q -c "SELECT relay_alter_handler('bench', options => '{\"concurrency\": $c}')" >/dev/null
    sleep 0.5
    note "relaybus, concurrency $c: $N deliveries"
    SECS[$c]=$(preload_and_drain "$N")
    RELAY[$c]=$(python3 -c "print(round($N / ${SECS[$c]}))")
    note "  ${RELAY[$c]}/s"
    threads=$((c < 2 ? 1 : 2))
    note "wrk, $c connections, ${WRK_SECS}s"
    WRK[$c]=$(wrk -t"$threads" -c"$c" -d"${WRK_SECS}s" -s "$dir/wrk.lua" "http://127.0.0.1:$FAST_PORT/hook" |
        awk '/^Requests\/sec:/ {printf "%d", $2}')
    note "  ${WRK[$c]}/s"
done

# ---------------------------------------------------------------- 2. RSS after CALLOUTS callouts
done_so_far=$(callouts)
if ((done_so_far < CALLOUTS)); then
    rest=$((CALLOUTS - done_so_far))
    note "memory: $rest more callouts (concurrency 16) to reach $CALLOUTS"
    q -c "SELECT relay_alter_handler('bench', options => '{\"concurrency\": 16}')" >/dev/null
    while ((rest > 0)); do
        b=$((rest > 20000 ? 20000 : rest))
        preload_and_drain "$b" >/dev/null
        rest=$((rest - b))
    done
fi
total_callouts=$(callouts)
rss_end=$(rss)
same_dispatcher=$([[ $(q -c "SELECT pid FROM relay.workers") == "$dispatcher" ]] && echo yes || echo NO)

# ---------------------------------------------------------------- 3. outage under RATE events/s
OUT_PORT=$(free_port)
ALOG=$dir/outage_access.log
nginx_start outage "$OUT_PORT" "$ALOG"
q -c "SELECT relay_create_handler('outage', 'http', 'http://127.0.0.1:$OUT_PORT/hook', '{\"secret\": \"$SECRET\"}')" \
  -c "SELECT relay_route('outage.ev', 'outage')" \
  -c "CREATE TABLE pub_log (id bigint PRIMARY KEY)" >/dev/null
PER_TX=20
TPS=$((RATE / PER_TX))
cat >"$dir/outage.sql" <<EOF
INSERT INTO pub_log SELECT unnest(relay_publish_batch('outage.ev', array_fill('$PAYLOAD'::jsonb, ARRAY[$PER_TX])));
EOF
# Samples every 0.5 s: time, pending, failed callouts (http_errors + 5xx), 2xx, breaker.
(
    while :; do
        echo "$(date +%s.%N) $(q -F ' ' -c "SELECT pending, http_errors + http_5xx, http_2xx, coalesce(extract(epoch FROM breaker_until - now())::numeric(10,1)::text, '-')
                                             FROM relay.handler_stats WHERE handler = 'outage'")"
        sleep 0.5
    done
) >"$dir/samples.txt" 2>/dev/null &
monitor=$!
PIDS+=($monitor)
note "outage: publishing $RATE/s for ${DURATION}s; receiver down from ${OUTAGE_AT}s for ${OUTAGE}s"
t_start=$(date +%s.%N)
pgbench -n -c 2 -j 2 -R "$TPS" -T "$DURATION" -f "$dir/outage.sql" >"$dir/pgbench.txt" 2>&1 &
pgb=$!
PIDS+=($pgb)
sleep "$OUTAGE_AT"
t_down=$(date +%s.%N)
nginx_stop outage
note "  receiver stopped"
sleep "$OUTAGE"
nginx_start outage "$OUT_PORT" "$ALOG"
t_up=$(date +%s.%N)
note "  receiver back"
wait "$pgb" || true
t_pub_end=$(date +%s.%N)
note "  publishing done; waiting for the backlog to drain (at most 15 min)"
deadline=$(($(date +%s) + 900))
while [[ $(q -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'outage'") != 0 ]]; do
    (($(date +%s) > deadline)) && break
    sleep 0.5
done
t_end=$(date +%s.%N)
sleep 1
kill "$monitor" 2>/dev/null || true
published=$(q -c "SELECT count(*) FROM pub_log")
pending_left=$(q -c "SELECT pending FROM relay.handler_stats WHERE handler = 'outage'")
dead=$(q -c "SELECT count(*) FROM relay.dead_letters WHERE handler = 'outage'")
nginx_stop outage
pg_lag=$(awk '/^latency average/ {l=$4} /^rate limit schedule lag/ {g=$0} END {print l " ms; " g}' "$dir/pgbench.txt")

# ---------------------------------------------------------------- report
python3 - "$dir/samples.txt" "$ALOG" "$t_start" "$t_down" "$t_up" "$t_pub_end" "$t_end" "$published" \
    "$pending_left" "$dead" <<EOF
import sys
samples_f, alog, t_start, t_down, t_up, t_pub_end, t_end, published, pending_left, dead = sys.argv[1:11]
t_start, t_down, t_up, t_pub_end, t_end = map(float, (t_start, t_down, t_up, t_pub_end, t_end))
N, C = $N, $CALLOUTS
relay = {1: ${RELAY[1]}, 16: ${RELAY[16]}, 64: ${RELAY[64]}}
secs = {1: ${SECS[1]}, 16: ${SECS[16]}, 64: ${SECS[64]}}
wrk = {1: ${WRK[1]:-0}, 16: ${WRK[16]:-0}, 64: ${WRK[64]:-0}}
def kv(s):
    return {k.rstrip(":"): int(v) for k, v in (x.split("=") for x in s.split())}
r0, r1 = kv("$rss_start"), kv("$rss_end")

samples = []
for line in open(samples_f):
    p = line.split()
    if len(p) == 5:
        samples.append((float(p[0]), int(p[1]), int(p[2]), int(p[3]), p[4]))
def at(t):  # the last sample at or before t
    best = samples[0]
    for s in samples:
        if s[0] <= t:
            best = s
    return best
before = [s[1] for s in samples if t_start + 3 <= s[0] < t_down]
steady = sorted(before)[len(before) // 2] if before else 0
peak = max(samples, key=lambda s: s[1])
failed_during = at(t_up)[2] - at(t_down)[2]
failed_after = samples[-1][2] - at(t_up)[2]
breakers = [s[4] for s in samples if t_down <= s[0] < t_up and s[4] != "-"]
drained = next((s[0] for s in samples if s[0] >= t_up and s[1] <= max(2 * steady, 100)), None)
empty = next((s[0] for s in samples if s[0] >= t_pub_end and s[1] == 0), t_end)
reqs = {}
first_ok = None
for line in open(alog):
    p = line.split()
    if len(p) == 3 and p[2] == "200":
        reqs[p[1]] = reqs.get(p[1], 0) + 1
        t = float(p[0])
        if t >= t_up and (first_ok is None or t < first_ok):
            first_ok = t
dups = sum(n - 1 for n in reqs.values())

print("## Webhook delivery: throughput, memory, outage\n")
print("Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); PostgreSQL $(q -c 'SHOW server_version'),"
      " durable settings (fsync, synchronous_commit on); receiver: nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///'), one worker,"
      " \`return 200;\`, keep-alive. Requests: POST, $BODY_BYTES-byte envelope, signed (HMAC-SHA256). Command: \`bash bench/http_bench.sh\`"
      f" (N={N}).\n")
print("### 1. Throughput from a preloaded backlog\n")
print(f"{N:,} unkeyed deliveries committed in one transaction; time from COMMIT to an empty relay.deliveries."
      " wrk: same nginx, same body and headers, as many connections, $WRK_SECS s"
      " (\`wrk -t{1|2} -c{C} -d${WRK_SECS}s -s wrk.lua\`).\n")
print("| concurrency | relaybus deliveries/s | seconds | wrk requests/s | relaybus / wrk |")
print("| ---: | ---: | ---: | ---: | ---: |")
for c in (1, 16, 64):
    ratio = f"{relay[c] / wrk[c]:.1%}" if wrk[c] else "n/a"
    print(f"| {c} | {relay[c]:,} | {secs[c]:.1f} | {wrk[c]:,} | {ratio} |")
print("\n### 2. Dispatcher memory\n")
print(f"Dispatcher pid $dispatcher (the same process throughout: $same_dispatcher), after the warm-up and after {int('$total_callouts'):,} callouts in all:\n")
print("| | VmRSS | RssAnon (private) | VmHWM |")
print("| --- | ---: | ---: | ---: |")
print(f"| after warm-up (2,000 callouts) | {r0['VmRSS'] / 1024:.1f} MiB | {r0['RssAnon'] / 1024:.1f} MiB | {r0['VmHWM'] / 1024:.1f} MiB |")
print(f"| after {int('$total_callouts'):,} callouts | {r1['VmRSS'] / 1024:.1f} MiB | {r1['RssAnon'] / 1024:.1f} MiB | {r1['VmHWM'] / 1024:.1f} MiB |")
print("\n(VmRSS includes the shared buffers the process touched; RssAnon is its own memory.)\n")
print("### 3. Receiver down for a minute under $RATE events/s\n")
print(f"pgbench publishes $PER_TX events per transaction at $TPS tx/s ($RATE events/s) for $DURATION s; the receiver"
      f" (nginx) is stopped {t_down - t_start:.0f} s in and restarted {t_up - t_down:.0f} s later. Handler with default"
      " options (timeout 30 s, concurrency 16, backoff 1 s .. 10 min, max_attempts 10). pgbench: $pg_lag.\n")
print("| measure | value |")
print("| --- | ---: |")
print(f"| events published | {int(published):,} |")
print(f"| requests to the down endpoint (failed callouts while it was down) | {failed_during:,} |")
print(f"| ... of which in the last {t_up - t_down - 10:.0f} s of the outage | {at(t_up)[2] - at(t_down + 10)[2]:,} |")
print(f"| failed callouts after it came back | {failed_after:,} |")
print(f"| circuit breaker open while down: samples with it open / longest remaining backoff seen | {len(breakers)} of {sum(1 for s in samples if t_down <= s[0] < t_up)} / {max((float(b) for b in breakers), default=0):.1f} s |")
print(f"| backlog before the outage (median pending) | {steady:,} |")
print(f"| backlog peak | {peak[1]:,} (at {peak[0] - t_down:.1f} s after the stop) |")
print(f"| first delivery after the restart | {(first_ok - t_up) if first_ok else float('nan'):.1f} s after it |")
print(f"| backlog back to normal (<= max(2 x before, 100)) | {(drained - t_up) if drained else float('nan'):.1f} s after the restart |")
print(f"| backlog empty after publishing stopped | {empty - t_pub_end:.1f} s |")
print(f"| delivered (distinct webhook-ids answered 200) | {len(reqs):,} |")
print(f"| duplicates | {dups:,} |")
print(f"| pending / dead letters at the end | {pending_left} / {dead} |")
ok = len(reqs) == int(published) and pending_left == "0" and dead == "0"
print(f"\nNothing lost: {'yes' if ok else 'NO'} ({len(reqs):,} of {int(published):,} events delivered).")
EOF
