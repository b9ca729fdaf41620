#!/usr/bin/env bash
# Errors that no delivery caused are not charged to a delivery:
#  - settings inherited from ALTER DATABASE ... SET (default_transaction_read_only,
#    lock_timeout, statement_timeout, default_transaction_isolation, search_path,
#    ...) do not reach the dispatcher: it pins its own, and deliveries flow;
#    with a lock held on relay.deliveries it waits instead of failing;
#  - an environmental error in the completing transaction (a serialization
#    failure, 40001, raised by a superuser's trigger on relay.deliveries) makes
#    the dispatcher retry the iteration after a backoff: the delivery's attempt
#    count does not grow, it is not dead-lettered (max_attempts 2), and
#    it arrives (attempt 1) once the cause is gone.
# On 0.1.0 the first stalled the database's deliveries for ever, and the second
# charged the innocent delivery an attempt (and would dead-letter it).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# This script's own sessions must not be read-only.
export PGOPTIONS="-c default_transaction_read_only=off -c lock_timeout=0 -c statement_timeout=0 -c idle_in_transaction_session_timeout=0 -c search_path=public -c session_replication_role=origin -c default_transaction_isolation=read\\ committed"

name="it_env_$$_${RANDOM}"
psql_q -d postgres -c "CREATE DATABASE \"$name\"" >/dev/null || die "could not create a database"
DBS+=("$name")
db=$name
# Hostile database defaults, in place before the dispatcher connects.
for s in "default_transaction_read_only = on" "lock_timeout = '1ms'" "statement_timeout = '1ms'" \
         "idle_in_transaction_session_timeout = '1ms'" "default_transaction_isolation = 'serializable'" \
         "default_transaction_deferrable = on" "search_path = 'nowhere'" \
         "session_replication_role = 'replica'"; do
    psql_q -d postgres -c "ALTER DATABASE \"$db\" SET $s" >/dev/null || die "ALTER DATABASE SET $s"
done
sql "$db" "CREATE EXTENSION relaybus" >/dev/null || die "CREATE EXTENSION"
notify_handler "$db" env it_env '{"max_attempts": 1}' 'env.#' || die "handler env"
check "a dispatcher serves the database" wait_workers "$db" 1 20
start_client c "$db" it_env || die "client"

log "deliveries flow under hostile database defaults"
sql "$db" "SELECT relay_publish('env.a', jsonb_build_object('n', g), 'k' || (g % 5)) FROM generate_series(1, 50) g" \
    >/dev/null
check "the 50 deliveries arrive" wait_lines "$TMP/c.out" 50 20
check_eq "no delivery is left" 0 "$(sql "$db" "SELECT count(*) FROM relay.deliveries")"
check_eq "nothing was dead-lettered" 0 "$(sql "$db" "SELECT count(*) FROM relay.dead_letters")"
check_eq "no iteration failed" 0 "$(sql "$db" "SELECT sum(failed) FROM relay.workers")"

log "a lock held on relay.deliveries: the dispatcher waits (lock_timeout '1ms' does not reach it)"
sql "$db" "SELECT relay_publish('env.locked', '{\"n\": 51}', 'locked', not_before => now() + interval '2 s')" \
    >/dev/null
psql_q -d "$db" -c "BEGIN" -c "LOCK TABLE relay.deliveries IN SHARE MODE" -c "SELECT pg_sleep(4)" -c "COMMIT" \
    >/dev/null &
bg_track $!
dispatcher_waits() {
    [[ $(sql "$db" "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'
                      AND datname = current_database() AND wait_event_type = 'Lock'") == 1 ]]
}
check "the dispatcher claimed and notified it, and its DELETE waits for the lock" wait_until 10 dispatcher_waits
check "the delivery arrives once the lock is gone" wait_lines "$TMP/c.out" 51 15
check_eq "as its first attempt" 1 \
    "$(sed -n 51p "$TMP/c.out" | cut -f2 | python3 -c 'import json, sys; print(json.load(sys.stdin)["attempt"])')"
check_eq "no iteration failed" 0 "$(sql "$db" "SELECT sum(failed) FROM relay.workers")"

log "a serialization failure while completing is retried, not charged"
kill "$CLIENT_PID" 2>/dev/null
new_db db conflict || die "could not create a database"
notify_handler "$db" env it_env2 '{"max_attempts": 2, "backoff_base": "100ms"}' 'env.#' || die "handler env"
check "a dispatcher serves the second database" wait_workers "$db" 1 20
start_client d "$db" it_env2 || die "client"
sql "$db" "CREATE FUNCTION public.conflict() RETURNS trigger LANGUAGE plpgsql AS \$\$
             BEGIN RAISE EXCEPTION 'injected conflict' USING ERRCODE = 'serialization_failure'; END \$\$" \
    "CREATE TRIGGER conflict BEFORE DELETE ON relay.deliveries FOR EACH ROW
       WHEN (OLD.topic = 'env.conflict') EXECUTE FUNCTION public.conflict()" >/dev/null || die "trigger"
sql "$db" "SELECT relay_publish('env.conflict', '{\"n\": 0}', 'c')" >/dev/null
failed_a_few() { (($(sql "$db" "SELECT sum(failed) FROM relay.workers") >= 3)); }
check "the dispatcher's iterations fail (relay.workers.failed >= 3)" wait_until 20 failed_a_few
check_eq "relay.workers.last_error names the cause" "t" \
    "$(sql "$db" "SELECT bool_and(last_error LIKE '%injected conflict%') FROM relay.workers")"
check_eq "the delivery is still pending, attempt 0, no last_error" "1|0|t" \
    "$(sql "$db" "SELECT count(*), max(attempt), bool_and(last_error IS NULL) FROM relay.deliveries")"
check_eq "it was not dead-lettered" 0 "$(sql "$db" "SELECT count(*) FROM relay.dead_letters")"
sql "$db" "DROP TRIGGER conflict ON relay.deliveries" >/dev/null
check "it arrives once the cause is gone" wait_lines "$TMP/d.out" 1 20
check_eq "as its first attempt" 1 \
    "$(sed -n 1p "$TMP/d.out" | cut -f2 | python3 -c 'import json, sys; print(json.load(sys.stdin)["attempt"])')"
check_eq "no delivery is left" 0 "$(sql "$db" "SELECT count(*) FROM relay.deliveries")"

finish
