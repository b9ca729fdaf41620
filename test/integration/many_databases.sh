#!/usr/bin/env bash
# The launcher serves every database that has relaybus, however many:
#  - 70 databases with relaybus (more than the 64 that 0.1.0 could hold) each
#    get a dispatcher and deliver;
#  - with too few background worker slots (max_worker_processes), every
#    database left without a dispatcher is named in the server log once (not
#    once per launcher pass), and its relay.workers shows a row without a pid
#    saying why.
# Restarts the cluster twice (max_worker_processes needs a restart).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

N=70
prefix="it_many_$$_"
tpl="${prefix}tpl"

restart_with_workers() {  # restart_with_workers N|default
    if [[ $1 == default ]]; then
        psql_q -d postgres -c "ALTER SYSTEM RESET max_worker_processes" >/dev/null
    else
        psql_q -d postgres -c "ALTER SYSTEM SET max_worker_processes = $1" >/dev/null
    fi
    bash "$RELAYBUS_ROOT/test/cluster.sh" restart "$RELAYBUS_CLUSTER_DIR" >/dev/null 2>&1 || return 1
    wait_until 20 psql_q -d postgres -c "SELECT 1"
}
drop_all() {
    seq 1 "$N" | xargs -P 4 -I{} psql -X -q -d postgres \
        -c "DROP DATABASE IF EXISTS \"${prefix}{}\" WITH (FORCE)" >/dev/null 2>&1
    psql_q -d postgres -c "ALTER DATABASE \"$tpl\" IS_TEMPLATE false" >/dev/null 2>&1
    psql_q -d postgres -c "DROP DATABASE IF EXISTS \"$tpl\" WITH (FORCE)" >/dev/null 2>&1
}
# Undo everything also when the test stops early.
fatal() {
    drop_all
    restart_with_workers default
    die "$@"
}

served_count() {
    sql postgres "SELECT count(DISTINCT datname) FROM pg_stat_activity
                   WHERE backend_type = 'relaybus dispatcher' AND datname LIKE '${prefix}%'"
}
all_served() { [[ $(served_count) == "$1" ]]; }
pending_in() { sql "$1" "SELECT count(*) FROM relay.deliveries"; }
all_delivered() {
    local i
    for ((i = 1; i <= N; i++)); do
        [[ $(pending_in "${prefix}$i") == 0 ]] || return 1
    done
}

log "a template with relaybus and a fire-and-forget handler"
restart_with_workers $((N + 20)) || fatal "could not restart the cluster"
psql_q -d postgres -c "CREATE DATABASE \"$tpl\"" >/dev/null || fatal "template"
sql "$tpl" "CREATE EXTENSION relaybus" \
    "SELECT relay_create_handler('fire', 'notify', 'it_many')" "SELECT relay_route('many.#', 'fire')" >/dev/null ||
    fatal "template setup"
psql_q -d postgres -c "ALTER DATABASE \"$tpl\" IS_TEMPLATE true" >/dev/null || fatal "template flag"

log "$N databases"
# A throwaway cluster: without fsync, copying the template takes a fraction of the time.
set_conf fsync off || fatal "could not set fsync"
created=$(seq 1 "$N" | xargs -P 4 -I{} psql -X -q -At -d postgres \
    -c "CREATE DATABASE \"${prefix}{}\" TEMPLATE \"$tpl\"" -c "SELECT 1" 2>&1 | grep -c '^1$')
[[ $created == "$N" ]] || fatal "could not create the databases ($created of $N)"
check "all $N databases get a dispatcher" wait_until 60 all_served "$N"
log "$(served_count) served"
for ((i = 1; i <= N; i++)); do
    sql "${prefix}$i" "SELECT relay_publish('many.ev', jsonb_build_object('db', $i))" >/dev/null
done
check "an event published in each of the $N databases is delivered" wait_until 30 all_delivered

log "too few worker slots"
log_size=$(stat -c %s "$SERVER_LOG")
restart_with_workers 40 || fatal "could not restart the cluster"
# The launcher takes one slot; the other databases of the cluster take some.
settle() { local a b; a=$(served_count); sleep 1; b=$(served_count); [[ $a == "$b" && $a -gt 0 ]]; }
check "dispatchers start for as many databases as there are slots" wait_until 30 settle
sql postgres "SELECT pg_reload_conf()" >/dev/null  # one more launcher pass
sleep 1
served=$(served_count)
check "some of the $N databases are left without a dispatcher ($served served)" test "$served" -lt "$N"
new_log() { tail -c +$((log_size + 1)) "$SERVER_LOG"; }
unserved=0 named_once=0 shown=0 never_more=1
new_log >"$TMP/log.txt"
sql postgres "SELECT DISTINCT datname FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'" >"$TMP/served.txt"
for ((i = 1; i <= N; i++)); do
    db="${prefix}$i"
    n=$(grep -c "could not start a dispatcher for database \"$db\"" "$TMP/log.txt")
    ((n > 1)) && never_more=0
    if ! grep -qx "$db" "$TMP/served.txt"; then
        unserved=$((unserved + 1))
        ((n == 1)) && named_once=$((named_once + 1))
        [[ $(sql "$db" "SELECT count(*) FROM relay.workers WHERE pid IS NULL AND last_error LIKE 'not started%max_worker_processes%'") == 1 ]] &&
            shown=$((shown + 1))
    fi
done
check_eq "each of the $unserved unserved databases is named in the log exactly once" "$unserved" "$named_once"
check_eq "relay.workers of each unserved database shows why" "$unserved" "$shown"
check_eq "no database is named more than once" 1 "$never_more"

drop_all
restart_with_workers default || die "could not restart the cluster"
trap 'cleanup' EXIT
finish
