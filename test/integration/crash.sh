#!/usr/bin/env bash
# Crashes in the middle of a run, with a notify handler in ack mode and a LISTEN
# consumer that acks every delivery, while pgbench publishes:
#  (a) kill -9 of the dispatcher: the postmaster crash-restarts, a new launcher
#      and dispatcher come back, the consumer reconnects, and every committed
#      event is received and acked; duplicates only for deliveries in flight at
#      the crash (sent by the old dispatcher, sent again by the new one);
#  (b) test/cluster.sh restart-immediate: after recovery a fresh consumer gets
#      everything the first one did not ack; the union of what both received
#      is every committed event.
# The committed events are known exactly: publishers insert the returned id into
# pub_log in the publishing transaction.
#
# The handler's lease is 5 s: the new dispatcher sends the pending deliveries as
# soon as it runs, usually before the consumer has reconnected; those
# notifications reach nobody, and the lease brings them back.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR=${RELAYBUS_CLUSTER_DIR:-}
[[ -n "$CLUSTER_DIR" && -d "$CLUSTER_DIR" ]] || die "RELAYBUS_CLUSTER_DIR is not set: this test crashes the cluster"
SERVER_LOG=$CLUSTER_DIR/log/postgresql.log

cat >"$TMP/pub.sql" <<'EOF'
\set r random(1, 1000000000)
\set hot random(1, 8)
WITH k AS (SELECT CASE WHEN :hot <= 5 THEN 'hot-' || :hot
                       WHEN :hot = 6 THEN NULL
                       ELSE 'd-' || :client_id || '-' || :r END AS key)
INSERT INTO pub_log
SELECT relay_publish('crash.ev', jsonb_build_object('r', :r), k.key), k.key FROM k;
EOF

server_ready() { pg_isready -q -d postgres -t 1; }
launcher_pid() { sql postgres "SELECT pid FROM pg_stat_activity WHERE backend_type = 'relaybus launcher'"; }
pending() { sql "$1" "SELECT count(*) FROM relay.deliveries"; }
all_acked() { [[ $(pending "$1") == 0 ]]; }

# setup VAR PREFIX CHANNEL: a database with pub_log and an ack-mode notify handler.
setup() {
    new_db "$1" "$2" || die "could not create a database"
    create_pub_log "${!1}"
    notify_handler "${!1}" acked "$3" '{"ack": true, "lease": "5s"}' 'crash.#' || die "could not create the handler"
}

# report NAME FILES...: analysis of a run; the checks shared by (a) and (b).
report() {
    local name=$1
    shift
    dump_pub_log "$db" "$TMP/$name.pub"
    analyze --published "$TMP/$name.pub" "$@" || die "analysis failed"
    log "$name: ${R[published]} committed, ${R[lines]} notifications, ${R[dups]} duplicates"
    check "$name: at least 150 events were committed (a loaded machine publishes fewer before the crash) (${R[published]})" test "${R[published]}" -ge 150
    check_eq "$name: every committed event was received" 0 "${R[missing]}"
    [[ "${R[missing]}" == 0 ]] || echo "    missing: ${R[missing_ids]}"
    check_eq "$name: nothing was received that was not committed" 0 "${R[extra]}"
    check_eq "$name: no duplicate from the same dispatcher (only deliveries in flight at the crash came twice)" \
        0 "${R[dups_same_sender]}"
    check_eq "$name: per key, seqs never go back in receive order (per consumer run)" 0 "${R[order_violations]}"
    check_eq "$name: per key, the received seqs are exactly 1..n" 0 "${R[seq_gap_keys]}"
    check_eq "$name: well-formed lines" 0 "${R[bad_lines]}"
}

# ================================================================ (a) kill -9 of the dispatcher
log "(a) kill -9 of the dispatcher"
setup db crash_a it_crash_a
check "(a) a dispatcher serves the database" wait_workers "$db" 1 20
old_dispatcher=$(sql "$db" "SELECT pid FROM relay.workers")
old_launcher=$(launcher_pid)
check "(a) the dispatcher shows in pg_stat_activity as 'relaybus dispatcher'" \
    test "$(dispatcher_pids "$db")" = "$old_dispatcher"

start_client a "$db" it_crash_a --ack --reconnect 90 --timestamps || die "client a"
pgbench -n -c 2 -j 2 -R 150 -t 300 -f "$TMP/pub.sql" "$db" >"$TMP/a.pgbench1" 2>&1 &
pgb=$!
bg_track "$pgb"
check "(a) deliveries flow before the crash" wait_lines "$TMP/a.out" 100 60
log "(a) killing dispatcher $old_dispatcher after $(line_count "$TMP/a.out") notifications"
log_size=$(stat -c %s "$SERVER_LOG" 2>/dev/null || echo 0)
kill -9 "$old_dispatcher"
wait_pid "$pgb" 60
check "(a) the server comes back" wait_until 90 server_ready
if [[ -f "$SERVER_LOG" ]]; then
    check "(a) the postmaster crash-restarted (server log)" \
        bash -c "tail -c +$((log_size + 1)) '$SERVER_LOG' | grep -q 'all server processes terminated; reinitializing'"
fi
check "(a) a new dispatcher serves the database" wait_workers "$db" 1 30
new_dispatcher=$(sql "$db" "SELECT pid FROM relay.workers")
check "(a) relay.workers shows a new pid ($old_dispatcher -> $new_dispatcher)" \
    test -n "$new_dispatcher" -a "$new_dispatcher" != "$old_dispatcher"
check "(a) a new launcher runs" bash -c "p=\$(psql -X -At -d postgres -c \"SELECT pid FROM pg_stat_activity WHERE backend_type = 'relaybus launcher'\"); [[ -n \$p && \$p != $old_launcher ]]"
check "(a) the consumer reconnected" wait_until 30 grep -q reconnected "$TMP/a.err"
log "(a) publishing after the crash"
pgbench -n -c 2 -j 2 -t 100 -f "$TMP/pub.sql" "$db" >"$TMP/a.pgbench2" 2>&1
check_eq "(a) publishing works after the crash" 0 "$?"
check "(a) every delivery is acked in the end (relay.deliveries empty)" wait_until 60 all_acked "$db"
sleep 0.5
kill "$CLIENT_PID" 2>/dev/null
wait "$CLIENT_PID" 2>/dev/null
report "(a)" "$TMP/a.out"
check_eq "(a) the notifications came from the old and the new dispatcher" "$old_dispatcher $new_dispatcher" \
    "$(cut -f1 "$TMP/a.out" | awk '!seen[$1]++' | tr '\n' ' ' | sed 's/ $//')"

# ================================================================ (b) restart-immediate
log "(b) restart-immediate"
setup db crash_b it_crash_b
check "(b) a dispatcher serves the database" wait_workers "$db" 1 20
old_dispatcher=$(sql "$db" "SELECT pid FROM relay.workers")
port=$PGPORT
# The first consumer leaves its first 20 deliveries unacked (leased for 5 s,
# the restart comes well before): they, and what queues behind them on their
# keys, are pending at the crash.
start_client b1 "$db" it_crash_b --ack --ack-skip 20 --timestamps || die "client b1"
b1=$CLIENT_PID
pgbench -n -c 2 -j 2 -R 150 -t 300 -f "$TMP/pub.sql" "$db" >"$TMP/b.pgbench1" 2>&1 &
pgb=$!
bg_track "$pgb"
check "(b) deliveries flow before the crash" wait_lines "$TMP/b1.out" 40 60
log "(b) restart-immediate after $(line_count "$TMP/b1.out") notifications"
bash "$RELAYBUS_ROOT/test/cluster.sh" restart-immediate "$CLUSTER_DIR" >"$TMP/restart.out" 2>&1
check_eq "(b) test/cluster.sh restart-immediate succeeded" 0 "$?"
wait_pid "$pgb" 60
wait_pid "$b1" 30
check_eq "(b) the first consumer lost its connection (exit 2)" 2 "$WAIT_RC"
check "(b) the server is back on the same port" grep -q "(port $port)" "$TMP/restart.out"
check "(b) the server accepts connections" wait_until 30 server_ready
check "(b) a new dispatcher serves the database" wait_workers "$db" 1 30
new_dispatcher=$(sql "$db" "SELECT pid FROM relay.workers")
check "(b) relay.workers shows a new pid ($old_dispatcher -> $new_dispatcher)" \
    test -n "$new_dispatcher" -a "$new_dispatcher" != "$old_dispatcher"
sql "$db" "SELECT event_id FROM relay.deliveries" >"$TMP/b.pending"
check "(b) at least the 20 unacked deliveries are pending after recovery ($(wc -l <"$TMP/b.pending"))" \
    test "$(wc -l <"$TMP/b.pending")" -ge 20
start_client b2 "$db" it_crash_b --ack --timestamps || die "client b2"
log "(b) publishing after the restart"
pgbench -n -c 2 -j 2 -t 100 -f "$TMP/pub.sql" "$db" >"$TMP/b.pgbench2" 2>&1
check_eq "(b) publishing works after the restart" 0 "$?"
check "(b) every delivery is acked in the end (relay.deliveries empty)" wait_until 60 all_acked "$db"
check "(b) every delivery pending at the restart was received by the fresh consumer" python3 -c "
import json, sys
got = set(json.loads(l.split('\t')[1])['event_id'] for l in open('$TMP/b2.out'))
pending = set(int(x) for x in open('$TMP/b.pending').read().split())
sys.exit(not pending <= got)"
sleep 0.5
kill "$CLIENT_PID" 2>/dev/null
wait "$CLIENT_PID" 2>/dev/null
report "(b)" "$TMP/b1.out" "$TMP/b2.out"

# The first database is served again after the restart too.
check "(b) both databases have a dispatcher after the restart" \
    test "$(sql postgres "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'")" -ge 2

finish
