#!/usr/bin/env bash
# The launcher and the dispatchers follow PostgreSQL's signal conventions:
#  - pg_terminate_backend of the launcher: the postmaster starts a new launcher
#    (it exits with FATAL, not 0) and deliveries continue;
#  - SIGTERM (pg_terminate_backend) to a dispatcher blocked in a lock wait ends
#    it at once (die interrupts the wait), and the launcher starts a new one;
#  - the dispatchers keep running while the launcher is replaced (the new
#    launcher adopts them instead of starting duplicates).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

launcher_pid() { sql postgres "SELECT pid FROM pg_stat_activity WHERE backend_type = 'relaybus launcher'"; }
new_launcher() { local p; p=$(launcher_pid); [[ -n "$p" && "$p" != "$1" ]]; }
new_dispatcher() { local p; p=$(dispatcher_pids "$1"); [[ -n "$p" && "$p" != "$2" ]]; }
gone() { [[ -z "$(sql postgres "SELECT 1 FROM pg_stat_activity WHERE pid = $1")" ]]; }
in_lock_wait() { [[ $(sql postgres "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1") == Lock ]]; }

new_db db sig || die "could not create a database"
notify_handler "$db" fire it_sig '{}' 'sig.#' || die "handler"
check "the database is served" wait_workers "$db" 1 20
start_client c "$db" it_sig || die "client"
publish() { sql "$db" "SELECT relay_publish('sig.ev', jsonb_build_object('n', g), 'k' || (g % 3)) FROM generate_series(1, $1) g" >/dev/null; }

# ---------------------------------------------------------------- the launcher
log "pg_terminate_backend of the launcher"
launcher=$(launcher_pid)
disp=$(dispatcher_pids "$db")
check_eq "pg_terminate_backend(launcher) returns true" t "$(sql postgres "SELECT pg_terminate_backend($launcher)")"
check "a new launcher appears" wait_until 15 new_launcher "$launcher"
check_eq "the dispatcher kept running, and no second one was started" "$disp" "$(dispatcher_pids "$db")"
publish 30
check "deliveries continue (30 notifications)" wait_lines "$TMP/c.out" 30 15

# ---------------------------------------------------------------- a dispatcher in a lock wait
log "SIGTERM to a dispatcher blocked on a lock"
launcher=$(launcher_pid)
disp=$(dispatcher_pids "$db")
# A session holds an exclusive lock on relay.deliveries; the dispatcher's next
# pass (a publish wakes it) waits for it.
coproc LOCKER { psql -X -q -At -d "$db" 2>&1; }
bg_track "$LOCKER_PID"
echo "BEGIN; LOCK TABLE relay.deliveries IN ACCESS EXCLUSIVE MODE; SELECT 'locked';" >&"${LOCKER[1]}"
read -r -t 10 line <&"${LOCKER[0]}"
check_eq "a session holds the lock" locked "$line"
publish 3 &  # blocks on the lock too; it is released below
pub_pid=$!
bg_track "$pub_pid"
check "the dispatcher waits for the lock" wait_until 10 in_lock_wait "$disp"
t0=$(date +%s%N)
sql postgres "SELECT pg_terminate_backend($disp)" >/dev/null
check "the dispatcher ends at once while the lock is still held" wait_until 3 gone "$disp"
ms=$((($(date +%s%N) - t0) / 1000000))
log "ended after ${ms} ms"
check "the launcher starts a new dispatcher" wait_until 10 new_dispatcher "$db" "$disp"
echo "COMMIT;" >&"${LOCKER[1]}"
exec {LOCKER[1]}>&-
wait "$pub_pid" 2>/dev/null
check "deliveries continue after the lock is released (33 notifications)" wait_lines "$TMP/c.out" 33 15
check_eq "the launcher is the same process" "$launcher" "$(launcher_pid)"

finish
