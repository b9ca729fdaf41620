#!/usr/bin/env bash
# Catalog changes wake the dispatchers at commit, as publishes do: with
# relaybus.poll_interval at 10 s, the first delivery that a committed catalog
# change makes possible reaches its LISTEN client in well under 2 s, for
#   (a) relay_resume_handler of a paused handler with a backlog,
#   (b) a new handler and its route, then a publish to it,
#   (c) relay_route adding a route to an existing handler, then a publish,
#   (d) relay_alter_handler options (ack mode off) freeing a backlog that
#       relaybus.max_in_flight held back,
#   (e) relay_replay of a dead letter,
# and a catalog change that rolls back wakes nobody. In (b) and (c) the
# publish wakes the dispatchers too, and relay_replay (e) asks for a rescan.
#
# Before each change the dispatcher is made to run one iteration (a publish to
# a "ping" handler, waited for): its next poll is then ~10 s away, so only a
# wake-up delivers within the limit. 2 s is the bound wakeup.sh holds publishes
# to; a woken iteration takes tens of milliseconds, hundreds on a loaded
# 2-core machine, while a missed wake-up costs the rest of the 10 s poll.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

LIMIT=2.0  # seconds; the poll interval is 10 s
new_db db catwake || die "could not create a database"
notify_handler "$db" ping it_cw_ping '{}' 'ping.#' || die "handler ping"
notify_handler "$db" resumed it_cw_resume '{}' 'res.#' || die "handler resumed"
notify_handler "$db" routed it_cw_route '{}' 'other.#' || die "handler routed"
notify_handler "$db" acked it_cw_acked '{"ack": true}' 'acked.#' || die "handler acked"
notify_handler "$db" replayed it_cw_replay '{}' 'rep.#' || die "handler replayed"
check "a dispatcher serves the database" wait_workers "$db" 1 20

set_conf relaybus.poll_interval 10s || die "could not set relaybus.poll_interval"
set_conf relaybus.max_in_flight 2 || die "could not set relaybus.max_in_flight"
show_is() { [[ $(sql "$db" "SHOW $1") == "$2" ]]; }
check "relaybus.poll_interval is 10s" wait_until 5 show_is relaybus.poll_interval 10s
hb_age() { sql "$db" "SELECT extract(epoch FROM now() - heartbeat)::numeric(10,3) FROM relay.workers"; }
asleep() { python3 -c "import sys; sys.exit(not float('$(hb_age)') >= $1)"; }
check "the dispatcher took the setting (idle, heartbeat older than 3 s)" wait_until 15 asleep 3

start_client ping "$db" it_cw_ping || die "client ping"
start_client resume "$db" it_cw_resume --timestamps || die "client resume"
start_client route "$db" it_cw_route --timestamps || die "client route"
start_client acked "$db" it_cw_acked --timestamps || die "client acked"  # never acks
start_client replay "$db" it_cw_replay --timestamps || die "client replay"

# ping: one iteration of the dispatcher, done; it sleeps its 10 s poll from now.
ping() {
    local n=$(($(line_count "$TMP/ping.out") + 1))
    sql "$db" "SELECT relay_publish('ping.x', '{}')" >/dev/null && wait_lines "$TMP/ping.out" "$n" 12
}
now() { sql "$db" "SELECT extract(epoch FROM clock_timestamp())"; }
recv_time() { sed -n "${2}p" "$1" | grep -o 'recv=[0-9.]*' | cut -d= -f2; }
# check_latency NAME FILE LINE T: line LINE of FILE arrived less than LIMIT s after T.
check_latency() {
    local name=$1 t d
    if ! wait_lines "$2" "$3" 12; then
        fail "$name" "not received within 12 s"
        return
    fi
    t=$(recv_time "$2" "$3")
    d=$(python3 -c "print('%.3f' % ($t - $4))")
    if python3 -c "import sys; sys.exit(not $d < $LIMIT)"; then
        pass "$name: $d s"
    else
        fail "$name: $d s"
    fi
}
# change SQL...: runs the statements in one transaction after a ping and
# prints the time just before it (the latency is measured from there).
change() {
    ping || { echo "ping not delivered" >&2; return 1; }
    local t q args=()
    for q in "$@"; do args+=(-c "$q"); done
    t=$(now)
    psql_q -d "$db" -c "BEGIN" "${args[@]}" -c "COMMIT" >/dev/null || return 1
    echo "$t"
}

# (a) resume with a backlog.
sql "$db" "SELECT relay_pause_handler('resumed')" >/dev/null || die "pause"
sql "$db" "SELECT relay_publish('res.x', jsonb_build_object('n', g)) FROM generate_series(1, 5) g" >/dev/null
check "(a) nothing arrives while paused" sql_is "$db" \
    "SELECT pending FROM relay.handler_stats WHERE handler = 'resumed'" 5
# A resume that rolls back wakes nobody: the dispatcher's heartbeat (renewed
# on every iteration) stays as it was.
ping || die "ping"
hb0=$(sql "$db" "SELECT heartbeat FROM relay.workers")
psql_q -d "$db" -c "BEGIN" -c "SELECT relay_resume_handler('resumed')" -c "ROLLBACK" >/dev/null
sleep 1.5  # the negative case: time for a wrong wake-up to show
check_eq "a rolled-back resume: no iteration (heartbeat unchanged), nothing delivered" "$hb0|0" \
    "$(sql "$db" "SELECT heartbeat FROM relay.workers")|$(line_count "$TMP/resume.out")"
t=$(change "SELECT relay_resume_handler('resumed')") || die "resume"
check_latency "(a) relay_resume_handler: the backlog's first delivery arrives in < ${LIMIT}s" \
    "$TMP/resume.out" 1 "$t"
check "(a) and then all 5" wait_lines "$TMP/resume.out" 5 12

# (b) a new handler and its route, then a publish routed to it.
t=$(change "SELECT relay_create_handler('created', 'notify', 'it_cw_route', '{}')" \
           "SELECT relay_route('new.#', 'created')") || die "create"
sql "$db" "SELECT relay_publish('new.x', '{\"case\": \"b\"}')" >/dev/null
check_latency "(b) new handler + route: the first publish arrives in < ${LIMIT}s" \
    "$TMP/route.out" 1 "$t"

# (c) a route added to an existing handler, then a publish on it.
t=$(change "SELECT relay_route('more.#', 'routed')") || die "route"
sql "$db" "SELECT relay_publish('more.x', '{\"case\": \"c\"}')" >/dev/null
check_latency "(c) relay_route: the first publish on the new route arrives in < ${LIMIT}s" \
    "$TMP/route.out" 2 "$t"

# (d) ack mode holds back all but relaybus.max_in_flight (2) unacked
# deliveries; switched off, the rest may go at once.
check "relaybus.max_in_flight is 2" wait_until 5 show_is relaybus.max_in_flight 2
sql "$db" "SELECT relay_publish('acked.x', jsonb_build_object('n', g)) FROM generate_series(1, 3) g" >/dev/null
check "(d) ack mode: 2 of 3 arrive (max_in_flight)" wait_lines "$TMP/acked.out" 2 12
t=$(change "SELECT relay_alter_handler('acked', options => '{\"ack\": false}')") || die "alter"
check_latency "(d) relay_alter_handler options: the held-back delivery arrives in < ${LIMIT}s" \
    "$TMP/acked.out" 3 "$t"

# (e) a dead letter (cancelled while paused) replayed.
sql "$db" "SELECT relay_pause_handler('replayed')" \
    "SELECT relay_cancel(ARRAY[relay_publish('rep.x', '{\"case\": \"e\"}')])" \
    "SELECT relay_resume_handler('replayed')" >/dev/null || die "dead letter"
check_eq "(e) one dead letter" 1 "$(sql "$db" "SELECT count(*) FROM relay.dead_letters")"
t=$(change "SELECT relay_replay('replayed')") || die "replay"
check_latency "(e) relay_replay: the replayed delivery arrives in < ${LIMIT}s" \
    "$TMP/replay.out" 1 "$t"

finish
