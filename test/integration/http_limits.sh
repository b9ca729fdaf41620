#!/usr/bin/env bash
# A handler's max_concurrency and rate hold across the dispatchers of its
# database (relaybus.workers_per_database = 2, each with `concurrency` 2):
#   - max_concurrency 2: the receiver never has more than 2 of its requests at
#     once, where the same handler without it reaches 4 (the two dispatchers'
#     concurrency added up: the measure can fail); each key's events arrive
#     in order; relay.handler_stats counts the deliveries held back.
#   - rate 50, burst 5, over a backlog of 1,000: arrivals per second within
#     10 % of 50 over the drain (~20 s), the leases held stay near what the
#     rate sends in a second or two, relay.handler_stats says `limited`
#     meanwhile; another handler of the database is served at once
#     throughout; a relay_alter_handler raising the rate to 200 takes effect.
#   - Dispatchers that exit with both permits of a max_concurrency 2 handler
#     (their requests held by the receiver) give them back: their successors
#     deliver the rest.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

start_receiver r || die "the receiver did not start"
URL=http://127.0.0.1:$RECV_PORT
LOG=$TMP/r.log
allow_loopback || die "could not set relaybus.http_allowlist"
set_conf relaybus.workers_per_database 2 || die "workers_per_database"
new_db db http_limits || die "could not create a database"
check "two dispatchers serve the database" wait_workers "$db" 2 20

# max_concurrency --------------------------------------------------------------
# 40 events on 8 keys: both dispatchers hold lanes with work. Each request is
# answered after 0.3 s, so requests overlap whenever the senders allow it.
concurrency_case() { # NAME OPTIONS
    http_handler "$db" "$1" "$URL/$1" "$2" "$1.t" || die "handler $1"
    recv_plan "$RECV_PORT" "/$1" '[{"delay": 0.3, "repeat": true}]' || die "receiver control"
    sql "$db" "SELECT relay_publish('$1.t', jsonb_build_object('i', i), 'k' || (i % 8))
                 FROM generate_series(1, 40) i" >/dev/null
    check "$1: the 40 deliveries arrive" wait_requests "$LOG" "/$1" 40 60
    py_facts "$1" "$LOG" "/$1" <<'EOF'
import sys, http_log
recs = http_log.records(sys.argv[1], sys.argv[2])
http_log.facts(dict(n=len(recs), max_active=max(r["active"] for r in recs), disorder=http_log.disorder(recs)))
EOF
}
concurrency_case uncapped '{"concurrency": 2}'
log "without max_concurrency: at most $(r max_active) requests at once"
check "without max_concurrency the two dispatchers' concurrency adds up (>= 3 at once: $(r max_active))" \
    test "$(r max_active)" -ge 3
concurrency_case capped '{"concurrency": 2, "max_concurrency": 2}'
log "max_concurrency 2: at most $(r max_active) requests at once"
check_eq "max_concurrency 2: never more than 2 requests at once" 1 "$(((r_max = $(r max_active)) >= 1 && r_max <= 2))"
check_eq "max_concurrency 2: each key's events arrive in order" 0 "$(r disorder)"
check "max_concurrency 2: relay.handler_stats counts the deliveries held back" \
    test "$(handler_stat "$db" capped held_back)" -gt 0
settled() { [[ $(sql "$db" "SELECT count(*) FROM relay.deliveries") == 0 ]]; }
check "the deliveries are completed" wait_until 30 settled

# rate -------------------------------------------------------------------------
http_handler "$db" paced "$URL/paced" '{"concurrency": 2, "rate": 50, "burst": 5}' 'paced.t' || die "handler paced"
http_handler "$db" quick "$URL/quick" '{}' 'quick.t' || die "handler quick"
sql "$db" "SELECT relay_publish('paced.t', jsonb_build_object('i', i), 'k' || (i % 16))
             FROM generate_series(1, 1000) i" >/dev/null
# Meanwhile: an event of the other handler every second, and the leases the
# limited one holds.
: >"$TMP/leases"
for i in $(seq 1 15); do
    sleep 1
    sql "$db" "SELECT relay_publish('quick.t', jsonb_build_object('sent', extract(epoch FROM clock_timestamp())))" \
        >/dev/null
    sql "$db" "SELECT in_flight, limited FROM relay.handler_stats WHERE handler = 'paced'" >>"$TMP/leases"
done
check "paced: the 1,000 deliveries arrive" wait_requests "$LOG" /paced 1000 60
check "quick: its 15 events arrive" wait_requests "$LOG" /quick 15 20
py_facts rate "$LOG" <<'EOF'
import sys, http_log
paced = http_log.records(sys.argv[1], "/paced")
quick = http_log.records(sys.argv[1], "/quick")
t = [r["t"] for r in paced]
# After the first second (the burst): arrivals per second to the last one.
start = t[0] + 1.0
later = [x for x in t if x >= start]
if len(later) < 2:  # all within the first second: no pacing at all
    later = t
waits = [r["t"] - float(r["env"]["payload"]["sent"]) for r in quick]
http_log.facts(dict(rate=f"{(len(later) - 1) / max(later[-1] - later[0], 1e-3):.1f}", span=f"{t[-1] - t[0]:.1f}",
                    quick_max_ms=int(max(waits) * 1000), disorder=http_log.disorder(paced)))
EOF
log "rate 50, burst 5: $(r rate) arrivals/s over $(r span) s; quick's slowest event took $(r quick_max_ms) ms"
check "rate 50: arrivals per second within 10 % of 50 ($(r rate))" \
    awk -v v="$(r rate)" 'BEGIN { exit !(v >= 45 && v <= 55) }'
check_eq "rate 50: each key's events arrive in order" 0 "$(r disorder)"
check "another handler is not slowed by the limited one (each event within 1.5 s: $(r quick_max_ms) ms)" \
    test "$(r quick_max_ms)" -lt 1500
max_leases=$(cut -d'|' -f1 "$TMP/leases" | sort -n | tail -1)
log "paced: at most $max_leases leases held while it drained"
check "paced: the leases held stay within ~2 s of its rate (<= 130: $max_leases)" test "$max_leases" -le 130
check "paced: relay.handler_stats said limited while it drained" grep -q '|t$' "$TMP/leases"
check "the deliveries are completed" wait_until 30 settled
# `limited` says a delivery was refused a permit within the last second.
check "paced: not limited once drained" wait_until 5 sql_is "$db" \
    "SELECT limited FROM relay.handler_stats WHERE handler = 'paced'" f

# A live change ---------------------------------------------------------------
sql "$db" "SELECT relay_publish('paced.t', jsonb_build_object('i', i), 'k' || (i % 16))
             FROM generate_series(1001, 1600) i" >/dev/null
sleep 2
sql "$db" "SELECT relay_alter_handler('paced', options => '{\"rate\": 200, \"burst\": 20}')" >/dev/null
altered=$(date +%s.%N)
check "paced: the 600 more arrive" wait_requests "$LOG" /paced 1600 60
py_facts alter "$LOG" "$altered" <<'EOF'
import sys, http_log
before, after = http_log.rates_around([r["t"] for r in http_log.records(sys.argv[1], "/paced")][1000:],
                                      float(sys.argv[2]), skip=6)
http_log.facts(dict(before=before, after=after))
EOF
log "before the change $(r before) arrivals/s, from a second after it $(r after)/s"
check "relay_alter_handler raising rate to 200 takes effect (>= 150/s: $(r after))" \
    awk -v v="$(r after)" 'BEGIN { exit !(v >= 150) }'

# Permits of dispatchers that exit --------------------------------------------
http_handler "$db" held "$URL/held" '{"concurrency": 2, "max_concurrency": 2, "timeout": "60s"}' 'held.t' ||
    die "handler held"
recv_plan "$RECV_PORT" /held "[{\"hold\": \"$TMP/go\"}, {\"hold\": \"$TMP/go\"}]" || die "receiver control"
sql "$db" "SELECT relay_publish('held.t', jsonb_build_object('i', i), 'k' || i) FROM generate_series(1, 6) i" >/dev/null
check "held: 2 requests go out and are held" wait_requests "$LOG" /held 2 20
sleep 1
check_eq "held: no third while both permits are out" 2 "$(recv_count "$LOG" /held)"
old=$(dispatcher_pids "$db" | tr '\n' ' ')
sql "$db" "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'
             AND datname = current_database()" >/dev/null
gone() { [[ -z "$(comm -12 <(dispatcher_pids "$db") <(tr ' ' '\n' <<<"$old" | sed '/^$/d'))" ]]; }
check "the dispatchers holding the permits exit" wait_until 30 gone
check "two new dispatchers serve the database" wait_workers "$db" 2 30
# The two held deliveries stay leased to their old holders until the leases
# lapse; the other four need the permits.
check "held: their successors send the other 4 (the permits came back)" wait_requests "$LOG" /held 6 30
touch "$TMP/go"
finish
