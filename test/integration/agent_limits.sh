#!/usr/bin/env bash
# A handler's max_concurrency and rate hold across two relaybus-agents of one
# database of the managed SQL edition (docs/managed.md, "Limits across
# agents"), each agent with `concurrency` 4, on a cluster without any relaybus
# library; a real receiver records how many requests of a path it is serving
# at each arrival:
#   (1) max_concurrency 2: never more than 2 in flight, where the same handler
#       without it reaches 3 or more (the agents' concurrency adds up: the
#       measure can fail); each key's events in order; the agents' /metrics
#       count the deliveries held back
#   (2) rate 20, burst 2, over a backlog of 200: arrivals per second over the
#       tail near 20, the leases held stay near what a second of the rate
#       sends, each key in order, /metrics says limited meanwhile; another
#       handler's events arrive at once throughout
#   (3) relay_alter_handler: a rate raised to 100 and a max_concurrency
#       lowered to 1 apply to what follows
#   (4) kill -9 of the agent holding both slots of a max_concurrency 2 handler
#       (its requests held by the receiver): the other agent gets the slots
#       at once (not after the dead agent's leases lapse) and sends the rest;
#       meanwhile pg_locks shows the slots and agents (docs/managed.md's query)
# The agents report their counters every 0.5 s (relay._agent_report):
# relay.handler_stats shows the held-back count their /metrics show and
# `limited` while the rate holds paced back; relay.workers has a row per live
# agent (its connection's pid), and the killed agent's goes once stale; bad
# reports are refused with 22023.
export PGHOST=${PGHOST:-/nonexistent} PGPORT=${PGPORT:-1}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/managed_lib.sh"
managed_traps
DB=limitsdb
OWNER=relay_owner
agent_database "$OWNER" "$DB"
own() { psql_q -U "$OWNER" -d "$DB" "$@"; }
receiver_at r

# start_agent NAME: an agent in the background (log $TMP/NAME.log, /metrics on
# a free port named in it); its pid in AGENT_PID.
start_agent() {
    "$RELAYBUS_ROOT/relaybus-agent" --database "host=$PGHOST port=$PGPORT dbname=$DB user=agent_login" \
        --http-allowlist 127.0.0.1 --poll-interval 200ms --metrics-addr 127.0.0.1:0 --log-level debug \
        --report-interval 500ms \
        2>"$TMP/$1.log" &
    AGENT_PID=$!
    bg_track "$AGENT_PID"
}
loaded() { grep -q '"msg":"handlers loaded"' "$TMP/$1.log"; }
# metric AGENT NAME HANDLER: the agent's /metrics value of NAME{handler="HANDLER"}.
metric() {
    local port
    port=$(grep -o '"port":[0-9]*' "$TMP/$1.log" | head -1 | cut -d: -f2)
    curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$2{handler=\"$3\"}" '$1 == m { print $2 }'
}
metric_sum() {
    local a b
    a=$(metric a "$1" "$2") b=$(metric b "$1" "$2")
    echo $((${a:-0} + ${b:-0}))
}
handler() { # NAME OPTIONS
    own -c "SELECT relay_create_handler('$1', 'http', '$URL/$1', '$2')" -c "SELECT relay_route('$1.#', '$1')" \
        >/dev/null || die "handler $1"
}
publish() { # HANDLER FROM TO KEYS
    own -c "SELECT relay_publish('$1.t', jsonb_build_object('i', i), 'k' || (i % $4))
              FROM generate_series($2, $3) i" >/dev/null || die "publish $1"
}
# facts NAME PATH [FROM_I]: n, max_active and disorder (a key's event after a
# later one) of PATH's requests whose payload i >= FROM_I.
facts() {
    py_facts "$1" "$LOG" "$2" "${3:-0}" <<'EOF'
import sys, http_log
recs = [r for r in http_log.records(sys.argv[1], sys.argv[2]) if r["env"]["payload"]["i"] >= int(sys.argv[3])]
http_log.facts(dict(n=len(recs), max_active=max(r["active"] for r in recs), disorder=http_log.disorder(recs)))
EOF
}
settled() { [[ $(own -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                         WHERE h.name = '$1'") == 0 ]]; }

handler uncapped '{"concurrency": 4}'
handler capped '{"concurrency": 4, "max_concurrency": 2}'
handler paced '{"concurrency": 4, "rate": 20, "burst": 2}'
handler quick '{}'
start_agent a
A=$AGENT_PID
start_agent b
B=$AGENT_PID
check "two agents serve the database" wait_until 30 eval 'loaded a && loaded b'

# (1) max_concurrency -----------------------------------------------------------
# 40 events on 8 keys, each answered after 0.3 s: requests overlap whenever
# the senders allow it, and both agents claim some.
declare -A MAX_ACTIVE
for h in uncapped capped; do
    recv_plan "$RECV_PORT" "/$h" '[{"delay": 0.3, "repeat": true}]' || die "receiver control"
    publish "$h" 1 40 8
    check "$h: the 40 deliveries arrive" wait_requests "$LOG" "/$h" 40 90
    facts "$h" "/$h"
    MAX_ACTIVE[$h]=$(r max_active)
    log "$h: at most ${MAX_ACTIVE[$h]} requests at once"
done
check "without max_concurrency the two agents' concurrency adds up (>= 3 at once: ${MAX_ACTIVE[uncapped]})" \
    test "${MAX_ACTIVE[uncapped]}" -ge 3
check_eq "max_concurrency 2: never more than 2 requests at once" 1 "$(((m = $(r max_active)) >= 1 && m <= 2))"
check_eq "max_concurrency 2: each key's events arrive in order" 0 "$(r disorder)"
check "max_concurrency 2: the agents' /metrics count deliveries held back ($(metric_sum relaybus_agent_held_back_total capped))" \
    test "$(metric_sum relaybus_agent_held_back_total capped)" -gt 0
check "capped: the deliveries are completed" wait_until 30 settled capped
check "capped: idle, the agents give their slots back" wait_until 10 eval \
    '[[ $(metric_sum relaybus_agent_limit_slots capped) == 0 ]]'
# What the agents reported, in the views.
stats_match() {
    [[ $(own -c "SELECT delivered, held_back FROM relay.handler_stats WHERE handler = 'capped'") == \
        "40|$(metric_sum relaybus_agent_held_back_total capped)" ]]
}
check "relay.handler_stats: capped delivered 40, held_back what the agents' /metrics count" wait_until 10 stats_match
own -c "SELECT delivered, held_back FROM relay.handler_stats WHERE handler = 'capped'" >"$TMP/capped.stats"
log "capped in relay.handler_stats: $(cat "$TMP/capped.stats") (delivered|held_back)"
check_eq "relay.workers: a row per agent, each its connection's pid, workers 0 and 1" "2|2|0,1" "$(own -c "
    SELECT count(*), count(*) FILTER (WHERE w.pid IN (SELECT pid FROM pg_stat_activity WHERE usename = 'agent_login')),
           string_agg(w.worker::text, ',' ORDER BY w.worker)
      FROM relay.workers w")"
workers_delivered() {
    [[ $(own -c "SELECT sum(delivered) FROM relay.workers") == \
        $(($(metric_sum relaybus_agent_delivered_total uncapped) + $(metric_sum relaybus_agent_delivered_total capped))) ]]
}
check "relay.workers: the agents' delivered add up to their /metrics" wait_until 10 workers_delivered
report_refused() { # ARGS: relay._agent_report's, as the agent's role
    psql -X -q -At -U agent_login -d "$DB" -v VERBOSITY=verbose -c "SELECT relay._agent_report($1)" \
        >"$TMP/refused.out" 2>&1
    grep -q "ERROR:  22023" "$TMP/refused.out" || { cat "$TMP/refused.out" >&2; return 1; }
}
check "a report that is not an object of objects is refused (22023)" report_refused "'x', 0, 5000, '[1]'"
check "a handler's report that is not an object is refused (22023)" report_refused "'x', 0, 5000, '{\"h\": 1}'"
check "a report interval under 100 ms is refused (22023)" report_refused "'x', 0, 10, '{}'"
check "an empty agent name is refused (22023)" report_refused "'', 0, 5000, '{}'"
check_eq "the refused reports stored nothing" 0 "$(own -c "SELECT count(*) FROM relay.agent_reports WHERE agent = 'x' OR agent = ''")"

# (2) rate ----------------------------------------------------------------------
publish paced 1 200 16
: >"$TMP/leases" >"$TMP/limited"
for i in $(seq 1 8); do
    sleep 1
    own -c "SELECT relay_publish('quick.t', jsonb_build_object('i', $i, 'sent', extract(epoch FROM clock_timestamp())))" \
        >/dev/null
    own -c "SELECT in_flight FROM relay.handler_stats WHERE handler = 'paced'" >>"$TMP/leases"
    echo "$(metric a relaybus_agent_limited paced) $(metric b relaybus_agent_limited paced)" >>"$TMP/limited"
    own -c "SELECT limited FROM relay.handler_stats WHERE handler = 'paced'" >>"$TMP/limited.sql"
done
check "quick: its 8 events arrive" wait_requests "$LOG" /quick 8 20
py_facts quick "$LOG" <<'EOF'
import sys, http_log
http_log.facts(dict(max_ms=max(int((r["t"] - float(r["env"]["payload"]["sent"])) * 1000)
                               for r in http_log.records(sys.argv[1], "/quick"))))
EOF
quick_max_ms=$(r max_ms)
check "paced: the 200 deliveries arrive" wait_requests "$LOG" /paced 200 90
py_facts rate "$LOG" <<'EOF'
import sys, http_log
paced = http_log.records(sys.argv[1], "/paced")
t = [r["t"] for r in paced]
# The tail: from 2 s after the first arrival (the burst and the agents
# joining) to the last.
tail = [x for x in t if x >= t[0] + 2.0]
if len(tail) < 2:  # all within 2 s: no pacing at all
    tail = t
# The most in any 1 s window: the burst bound, whatever the tail's mean. At
# the start an agent joining may add a documented overshoot; the tail's
# windows carry only rate + burst.
def peak(xs):
    return max(sum(1 for y in xs if x <= y < x + 1.0) for x in xs)
http_log.facts(dict(rate=f"{(len(tail) - 1) / max(tail[-1] - tail[0], 1e-3):.1f}", span=f"{t[-1] - t[0]:.1f}",
                    peak=peak(t), peak_tail=peak(tail), disorder=http_log.disorder(paced)))
EOF
log "rate 20, burst 2: $(r rate) arrivals/s over the tail, $(r span) s in all, at most $(r peak_tail) in a second of the tail, $(r peak) of the whole; quick's slowest event took $quick_max_ms ms"
check "rate 20: the tail's arrivals per second near 20 (14 to 23: $(r rate))" \
    awk -v v="$(r rate)" 'BEGIN { exit !(v >= 14 && v <= 23) }'
check "rate 20, burst 2: at most 25 arrivals in any second of the tail ($(r peak_tail))" test "$(r peak_tail)" -le 25
# rate + burst + what docs/managed.md allows an agent joining (rate / 2 for
# 0.5 s, the newcomer's token) + 2 for timing.
check "rate 20, burst 2: at most 30 in any second, the agents' start included ($(r peak))" test "$(r peak)" -le 30
check_eq "rate 20: each key's events arrive in order" 0 "$(r disorder)"
check "another handler is not slowed by the limited one (each event within 1.5 s: $quick_max_ms ms)" \
    test "$quick_max_ms" -lt 1500
max_leases=$(sort -n "$TMP/leases" | tail -1)
log "paced: at most $max_leases leases held while it drained"
check "paced: the leases held stay near a second of its rate (<= 40 of 200: $max_leases)" test "$max_leases" -le 40
check "paced: an agent's /metrics said limited while it drained" grep -q 1 "$TMP/limited"
check "paced: relay.handler_stats said limited while it drained" grep -qx t "$TMP/limited.sql"
check "paced: the deliveries are completed" wait_until 30 settled paced

# (3) live changes --------------------------------------------------------------
publish paced 201 600 16
sleep 2
own -c "SELECT relay_alter_handler('paced', options => '{\"concurrency\": 4, \"rate\": 100, \"burst\": 10}')" >/dev/null
altered=$(date +%s.%N)
check "paced: the 400 more arrive" wait_requests "$LOG" /paced 600 90
py_facts alter "$LOG" "$altered" <<'EOF'
import sys, http_log
before, after = http_log.rates_around([r["t"] for r in http_log.records(sys.argv[1], "/paced")][200:],
                                      float(sys.argv[2]))
http_log.facts(dict(before=before, after=after))
EOF
log "paced: before the change $(r before) arrivals/s, from a second after it $(r after)/s"
check "relay_alter_handler raising rate to 100 takes effect (35 to 115/s: $(r after))" \
    awk -v v="$(r after)" 'BEGIN { exit !(v >= 35 && v <= 115) }'
own -c "SELECT relay_alter_handler('capped', options => '{\"concurrency\": 4, \"max_concurrency\": 1}')" >/dev/null
sleep 1
publish capped 41 60 8
check "capped: the 20 more arrive" wait_requests "$LOG" /capped 60 90
facts capped1 /capped 41
check_eq "relay_alter_handler lowering max_concurrency to 1: one request at a time ($(r max_active))" 1 "$(r max_active)"
check_eq "... each key's events in order" 0 "$(r disorder)"

# (4) kill -9 of the agent holding the slots -------------------------------------
kill -TERM "$B"
wait_pid "$B" 30
handler held '{"concurrency": 4, "max_concurrency": 2, "timeout": "20s", "lease": "5s"}'
recv_plan "$RECV_PORT" /held "[{\"hold\": \"$TMP/go\"}, {\"hold\": \"$TMP/go\"}]" || die "receiver control"
# A alone: it takes both slots, sends 2 (held), and leases 2 more behind them.
publish held 1 6 6
check "held: 2 requests go out and are held" wait_requests "$LOG" /held 2 30
check "held: agent a holds both slots" wait_until 10 eval '[[ $(metric a relaybus_agent_limit_slots held) == 2 ]]'
start_agent b
B=$AGENT_PID
check "agent b is counted among the handler's agents (it waits for a slot)" wait_until 30 eval \
    '[[ $(metric b relaybus_agent_limit_agents held) == 2 ]]'
sleep 1
check_eq "held: no third request while a holds both slots" 2 "$(recv_count "$LOG" /held)"
# docs/managed.md's query of pg_locks: the picture across agents.
check_eq "pg_locks shows held's 2 slots and its 2 agents" "held|2|2" "$(own -c "
    SELECT h.name, count(*) FILTER (WHERE l.classid = 1380057089) AS slots_held,
           count(*) FILTER (WHERE l.classid = 1380057090) AS agents
      FROM pg_locks l
      JOIN relay.handlers h ON h.id = CASE WHEN l.classid = 1380057090 THEN l.objid::bigint
                                           ELSE l.objid::bigint >> 17 END
     WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND h.name = 'held'
     GROUP BY h.name")"
kill -KILL "$A"
killed=$(date +%s)
check "held: b gets the slots and sends the 2 deliveries nobody leased" wait_requests "$LOG" /held 4 15
log "held: b sent them $(($(date +%s) - killed)) s after the kill (a's leases last 22 s)"
touch "$TMP/go"
check "held: all 6 are delivered once a's leases lapse" wait_until 90 settled held
one_worker() {
    [[ $(own -c "SELECT count(*), count(*) FILTER (WHERE w.pid IN
                   (SELECT pid FROM pg_stat_activity WHERE usename = 'agent_login')) FROM relay.workers w") == "1|1" ]]
}
check "relay.workers: the killed agent's row goes once its report is stale, b's stays" wait_until 30 one_worker
finish
