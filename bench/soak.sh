#!/usr/bin/env bash
# The soak (issue 15): mixed notify, http and pull traffic at a fixed publish
# rate for a given time, with the dispatcher's memory, the backlog, the dead
# letters and the publish-to-handler latency per kind reported per minute.
#
#   bench/soak.sh [--minutes N] [--rate N] [--pg-config PATH] [--out DIR]
#                 [--drain S] [--keep-cluster]
#
#   --minutes N      publishing time (default 30)
#   --rate N         events/s per kind (default 100: ~300/s in all)
#   --pg-config P    the build to measure (default the system's PostgreSQL 15;
#                    e.g. a tree from scripts/pg-tree.sh)
#   --out DIR        results (default bench/results/<UTC stamp>-soak/)
#   --drain S        after publishing, how long to wait for the backlog to
#                    drain before the exactness check (default 120)
#   --keep-cluster   leave the cluster (and the raw files) in the work dir
#
# One throwaway cluster (test/cluster.sh, the harness's durable settings), one
# database with three handlers, each routed from its own topic:
#   soak_notify  notify, fire mode; a real LISTEN client (listen_client --timestamps)
#   soak_http    http, envelope body, to bench/soak_receiver.py on loopback
#   soak_pull    pull; one consumer (pgbench) claiming up to 500 every 20 ms,
#                recording and acking them in one transaction
# Publishers: one pgbench per kind, -R RATE (Poisson arrivals), one keyed event
# (1,000 keys) per transaction; the payload carries the publish wall time
# {"t": epoch}, and the same transaction logs the event id in soak_published.
# Every minute: pg_log_backend_memory_contexts(dispatcher) read back from the
# server log (TopMemoryContext and the grand total), /proc/PID/status
# (RssAnon, VmRSS), rows per handler in relay.deliveries, relay.dead_letters.
# At the end bench/soak_report.py writes report.md and minutes.jsonl.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
MINUTES=30
RATE=100
DRAIN=120
OUT=
KEEP=0
PG_CONFIG=${PG_CONFIG:-$(bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/pg-config.sh")}

usage() { sed -n '2,17p' "$0" >&2; exit 2; }
while (($#)); do
    case $1 in
        --minutes) MINUTES=${2:?}; shift 2 ;;
        --rate) RATE=${2:?}; shift 2 ;;
        --pg-config) PG_CONFIG=${2:?}; shift 2 ;;
        --out) OUT=${2:?}; shift 2 ;;
        --drain) DRAIN=${2:?}; shift 2 ;;
        --keep-cluster) KEEP=1; shift ;;
        -h | --help) usage ;;
        *) echo "soak.sh: unknown argument $1" >&2; usage ;;
    esac
done
[[ "$MINUTES" =~ ^[0-9]+$ && "$MINUTES" -ge 1 ]] || { echo "soak.sh: --minutes must be a positive integer" >&2; exit 2; }
[[ "$RATE" =~ ^[0-9]+$ && "$RATE" -ge 1 ]] || { echo "soak.sh: --rate must be a positive integer" >&2; exit 2; }
[[ -x "$PG_CONFIG" ]] || { echo "soak.sh: no pg_config at $PG_CONFIG" >&2; exit 2; }
export PG_CONFIG
BINDIR=$("$PG_CONFIG" --bindir)
PATH=$BINDIR:$PATH
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-$ROOT/bench/results/$STAMP-soak}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)

WORK=$(mktemp -d /tmp/relaybus-soak.XXXXXX)
chmod 755 "$WORK"
CLUSTER=$WORK/c
PIDS=()

say() { printf '[soak %s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$OUT/soak.log"; }
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    PIDS=()
    if ((KEEP)); then
        say "kept: cluster and raw files in $WORK (stop: PG_CONFIG=$PG_CONFIG bash test/cluster.sh destroy $CLUSTER)"
    else
        bash "$ROOT/test/cluster.sh" destroy "$CLUSTER" >/dev/null 2>&1
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'say "interrupted"; exit 1' INT TERM
fail() { say "FAILED: $*"; exit 1; }

# ---------------------------------------------------------------- cluster
say "build $PG_CONFIG, $MINUTES min at $RATE events/s per kind, out $OUT, work $WORK"
RELAYBUS_EXTRA_CONF="synchronous_commit = on
full_page_writes = on
shared_buffers = 1GB
max_wal_size = 4GB
checkpoint_timeout = 30min
relaybus.http_allowlist = '127.0.0.1'" \
    bash "$ROOT/test/cluster.sh" start "$CLUSTER" >"$OUT/cluster.log" 2>&1 || fail "cluster start (see cluster.log)"
# shellcheck disable=SC1091
source "$CLUSTER/env"
SERVER_LOG=$CLUSTER/log/postgresql.log
export PGDATABASE=soak
psql_q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@" </dev/null; }
psql_q -d postgres -c "CREATE DATABASE soak" >/dev/null || fail "create database"
psql_q -c "CREATE EXTENSION relaybus" \
    -c "CREATE TABLE soak_published (id bigint PRIMARY KEY, kind text NOT NULL, t float8 NOT NULL)" \
    -c "CREATE TABLE soak_pulled (delivery_id bigint, event_id bigint, t_pub float8, t_recv float8)" \
    >/dev/null || fail "create extension"

# ---------------------------------------------------------------- receiver, listener, handlers
python3 "$ROOT/bench/soak_receiver.py" --port-file "$WORK/recv.port" --log "$WORK/http.log" \
    2>"$WORK/recv.err" &
PIDS+=($!)
for _ in $(seq 100); do [[ -s "$WORK/recv.port" ]] && break; sleep 0.1; done
[[ -s "$WORK/recv.port" ]] || fail "the receiver did not start: $(cat "$WORK/recv.err")"
RECV_PORT=$(cat "$WORK/recv.port")

CLIENT=$WORK/listen_client
g++ -std=c++17 -O2 -I"$("$PG_CONFIG" --includedir)" -o "$CLIENT" "$ROOT/test/integration/listen_client.cpp" \
    -L"$("$PG_CONFIG" --libdir)" -lpq || fail "could not build listen_client"
"$CLIENT" --channel soak_notify --timestamps --ready-file "$WORK/listen.ready" "dbname=soak" \
    >"$WORK/notify.out" 2>"$WORK/notify.err" &
PIDS+=($!)
for _ in $(seq 150); do [[ -s "$WORK/listen.ready" ]] && break; sleep 0.1; done
[[ -s "$WORK/listen.ready" ]] || fail "the LISTEN client did not start: $(cat "$WORK/notify.err")"

psql_q -c "SELECT relay_create_handler('soak_notify', 'notify', 'soak_notify')" \
    -c "SELECT relay_route('soak.notify', 'soak_notify')" \
    -c "SELECT relay_create_handler('soak_http', 'http', 'http://127.0.0.1:$RECV_PORT/soak', '{}')" \
    -c "SELECT relay_route('soak.http', 'soak_http')" \
    -c "SELECT relay_create_handler('soak_pull', 'pull')" \
    -c "SELECT relay_route('soak.pull', 'soak_pull')" >/dev/null || fail "create handlers"

dispatcher_pid() {
    psql_q -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'
               AND datname = 'soak' ORDER BY pid LIMIT 1"
}
for _ in $(seq 300); do
    [[ "$(psql_q -c "SELECT count(*) || '|' || coalesce(sum(lanes_held), 0) FROM relay.workers")" == "1|64" ]] && break
    sleep 0.1
done
PID=$(dispatcher_pid)
[[ -n "$PID" ]] || fail "no dispatcher serves the database"
say "dispatcher pid $PID, receiver port $RECV_PORT"

# ---------------------------------------------------------------- per-minute sample
# memory_of PID: "TOP_USED TOP_TOTAL GRAND_USED GRAND_TOTAL" (bytes) from the
# server log, after asking the process to log its memory contexts.
memory_of() {
    local before i
    before=$(grep -c "\[$1\] .*Grand total:" "$SERVER_LOG")
    psql_q -c "SELECT pg_log_backend_memory_contexts($1)" >/dev/null || return 1
    for ((i = 0; i < 100; i++)); do
        (($(grep -c "\[$1\] .*Grand total:" "$SERVER_LOG") > before)) && break
        sleep 0.1
    done
    ((i < 100)) || return 1
    grep "\[$1\] .*level: 0; TopMemoryContext:" "$SERVER_LOG" | tail -n 1 |
        sed -E 's/.*TopMemoryContext: ([0-9]+) total.* ([0-9]+) used.*/\2 \1/' | tr '\n' ' '
    grep "\[$1\] .*Grand total:" "$SERVER_LOG" | tail -n 1 |
        sed -E 's/.*Grand total: ([0-9]+) bytes.* ([0-9]+) used.*/\2 \1/'
}
proc_kb() { sed -n "s/^$2:[[:space:]]*\([0-9]*\) kB/\1/p" "/proc/$1/status" 2>/dev/null; }
STATE_SQL="SELECT json_build_object(
    'backlog', (SELECT json_object_agg(h.name, (SELECT count(*) FROM relay.deliveries d WHERE d.handler_id = h.id))
                FROM relay.handlers h),
    'dead', (SELECT count(*) FROM relay.dead_letters),
    'published', (SELECT count(*) FROM soak_published))"

# sample LABEL: one line of samples.jsonl.
sample() {
    local label=$1 pid mem top_used top_total grand_used grand_total state
    pid=$(dispatcher_pid)
    [[ -n "$pid" ]] || { say "minute $label: no dispatcher"; pid=0; }
    [[ "$pid" == "$PID" ]] || say "minute $label: the dispatcher is now pid $pid (was $PID)"
    mem=$( ((pid > 0)) && memory_of "$pid")
    read -r top_used top_total grand_used grand_total <<<"${mem:-}"
    state=$(psql_q -c "$STATE_SQL")
    printf '{"minute": "%s", "t": %s, "pid": %s, "top_used": %s, "top_total": %s, "grand_used": %s, "grand_total": %s, "rss_anon_kb": %s, "vm_rss_kb": %s, "state": %s}\n' \
        "$label" "$(date +%s.%N)" "$pid" "${top_used:-null}" "${top_total:-null}" "${grand_used:-null}" \
        "${grand_total:-null}" "$(proc_kb "$pid" RssAnon)" "$(proc_kb "$pid" VmRSS)" "${state:-null}" \
        | sed -E 's/: ,/: null,/g' >>"$OUT/samples.jsonl"
    say "minute $label: pid $pid TopMemoryContext used ${top_used:-?} B, grand total used ${grand_used:-?} B, RssAnon $(proc_kb "$pid" RssAnon) kB, $state"
}

# ---------------------------------------------------------------- traffic
cat >"$WORK/pull.sql" <<'EOF'
WITH c AS (SELECT id, event_id, payload FROM relay_claim('soak_pull', 500)),
     r AS (INSERT INTO soak_pulled SELECT id, event_id, (payload->>'t')::float8,
                  extract(epoch FROM clock_timestamp())::float8 FROM c)
SELECT relay_ack(coalesce((SELECT array_agg(id) FROM c), '{}'));
\sleep 20 ms
EOF
for kind in notify http pull; do
    cat >"$WORK/pub_$kind.sql" <<EOF
\set k random(1, 1000)
WITH p AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS t)
INSERT INTO soak_published (id, kind, t)
SELECT relay_publish('soak.$kind', jsonb_build_object('t', p.t), key => 'k' || :k), '$kind', p.t FROM p;
EOF
done

: >"$OUT/samples.jsonl"
SECS=$((MINUTES * 60))
pgbench -n -c 1 -T $((SECS + DRAIN + 600)) -f "$WORK/pull.sql" soak >"$OUT/pgbench-pull.log" 2>&1 &
PULL_PID=$!
PIDS+=($PULL_PID)
sample 0
T0=$(date +%s.%N)
PUB_PIDS=()
for kind in notify http pull; do
    pgbench -n -c 4 -j 1 -R "$RATE" -T "$SECS" -P 60 -f "$WORK/pub_$kind.sql" soak \
        >"$OUT/pgbench-pub-$kind.log" 2>&1 &
    PUB_PIDS+=($!)
    PIDS+=($!)
done
say "publishing for $MINUTES min from $T0"
for ((m = 1; m <= MINUTES; m++)); do
    now=$(date +%s.%N)
    wait_s=$(python3 -c "print(max(0.0, $T0 + 60 * $m - $now))")
    sleep "$wait_s"
    sample "$m"
done
for p in "${PUB_PIDS[@]}"; do wait "$p"; done
T1=$(date +%s.%N)

# ---------------------------------------------------------------- drain, exactness
say "publishers done; draining (up to $DRAIN s)"
for ((i = 0; i < DRAIN * 2; i++)); do
    [[ "$(psql_q -c "SELECT count(*) FROM relay.deliveries")" == 0 ]] && break
    sleep 0.5
done
sleep 2   # the last notifications and responses reach their logs
sample drained
kill "$PULL_PID" 2>/dev/null
wait "$PULL_PID" 2>/dev/null
psql_q -c "COPY soak_published TO STDOUT" >"$WORK/published.tsv"
psql_q -c "COPY soak_pulled TO STDOUT" >"$WORK/pulled.tsv"
psql_q -c "COPY (SELECT h.name, d.event_id FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id) TO STDOUT" \
    >"$WORK/pending.tsv"
psql_q -c "COPY (SELECT handler, event_id FROM relay.dead_letters) TO STDOUT" >"$WORK/dead.tsv"

ref=$(cat "$(cd "$BINDIR/../../../../.." && pwd)/ref" 2>/dev/null | head -n 1)
so=$("$PG_CONFIG" --pkglibdir)/relaybus.so
cat >"$OUT/env.json" <<EOF
{"stamp": "$STAMP", "pg_config": "$PG_CONFIG", "build_ref": "${ref:-unknown}",
 "relaybus_so_sha256": "$(sha256sum "$so" | cut -d' ' -f1)", "minutes": $MINUTES, "rate_per_kind": $RATE,
 "t0": $T0, "t1": $T1, "nproc": $(nproc), "load_at_end": "$(cut -d' ' -f1-3 /proc/loadavg)",
 "harness_ref": "$(git -C "$ROOT" rev-parse HEAD)"}
EOF
python3 "$ROOT/bench/soak_report.py" --work "$WORK" --out "$OUT" | tee -a "$OUT/soak.log"
rc=${PIPESTATUS[0]}
say "report: $OUT/report.md"
exit "$rc"
