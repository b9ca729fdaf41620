#!/usr/bin/env bash
# A transaction that holds an old snapshot (a report, pg_dump, a session idle
# in transaction) keeps every delivery completed since it began visible to
# it, so their index entries cannot be marked dead: a dispatcher's claim that
# scans each priority class from its first entry walked all of them, and one
# more per delivery (3,000 events one at a time: 1,500 entries and ~1,000
# buffer visits per claim, growing with the snapshot's age). Dispatchers now
# start each class at a floor below which every entry is settled (claim_floor).
#
# (a) One dispatcher (no lane list), an old REPEATABLE READ snapshot held open,
#     1,200 events committed one at a time: the class scan reads a bounded
#     number of index entries per call (deliveries_claim's idx_tup_read over
#     the scan's calls in pg_stat_statements).
# (b) Two dispatchers (each claims with a lane list): the same.
# (c) A late committer: an event whose transaction drew its id, then stayed
#     open while a stream of later events was claimed past it, is delivered
#     within seconds of its commit, not at the next poll (poll_interval 10 s).
# (d) A replay (old ids, below any floor) while the stream runs is delivered.
# (e) A pull consumer (relay_claim) under an old snapshot: 1,000 events, each
#     published, claimed and acked in turn; its claims read a bounded number
#     of index entries (they used to scan from the head every time nothing
#     was ahead of the frontier).
# (f) Eight pgbench publishers (hot keys, per-client keys, unkeyed), whose
#     transactions commit out of id order all the time, while two dispatchers
#     claim from their floors under an old snapshot: every committed event is
#     received once, and each key's seqs arrive as 1..n in order.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new_db db oldsnap || die "could not create a database"
sql "$db" "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null ||
    die "pg_stat_statements is not available"
notify_handler "$db" n it_oldsnap '{"ack": false}' 'n.#' || die "could not create the notify handler"
check "a dispatcher serves the database" wait_workers "$db" 1 20
start_client main "$db" it_oldsnap || die "the LISTEN client did not start"
delivered=0
expect() {  # expect N TIMEOUT LABEL: the client has received N more notifications
    delivered=$((delivered + $1))
    check "$3: $delivered notifications in all" wait_lines "$TMP/main.out" "$delivered" "$2"
}
for i in 1 2 3 4 5 6 7 8; do sql "$db" "SELECT relay_publish('n.x', '{}')" >/dev/null; done
expect 8 20 "warm-up"

# hold_snapshot NAME: a session in REPEATABLE READ that has taken its snapshot
# and sleeps; ends with the test (or with release_snapshot NAME).
hold_snapshot() {
    psql -X -q -d "$db" -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
        -c "SELECT count(*) FROM relay.deliveries" -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
    bg_track $!
    wait_until 10 bash -c "[[ \$(psql -X -At -d '$db' -c \"SELECT count(*) FROM pg_stat_activity
        WHERE datname = '$db' AND backend_xmin IS NOT NULL AND query LIKE '%pg_sleep(600)%' AND pid <> pg_backend_pid()\") == 1 ]]"
}
release_snapshot() {
    sql "$db" "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
               WHERE datname = '$db' AND query LIKE '%pg_sleep(600)%' AND pid <> pg_backend_pid()" >/dev/null
}
# Events committed one at a time, a few ms apart: each is claimed on its own.
trickle() {  # trickle N [TOPIC]
    sql "$db" "DO \$\$ BEGIN FOR i IN 1..$1 LOOP
                 PERFORM relay_publish('${2:-n.x}', jsonb_build_object('i', i));
                 COMMIT; PERFORM pg_sleep(0.002);
               END LOOP; END \$\$" >/dev/null
}
# Calls of the claim's class scan (from the head or from a floor, with a lane
# list or without; pg_stat_statements may show the classes' numbers as
# parameters) since the last pg_stat_statements_reset; each reads the four
# classes' ranges of deliveries_claim, and nothing else reads that index.
scan_calls() {
    sql "$db" "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
                WHERE query LIKE '%(SELECT id, priority, key, not_before FROM relay.deliveries WHERE handler_id = \$1 AND priority >= %'"
}
claim_index() {  # idx_scan idx_tup_read of deliveries_claim (as flushed by the dispatchers)
    sql "$db" "SELECT idx_scan || ' ' || idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'deliveries_claim'"
}
# measure LABEL N: trickles N events with stats reset before; sets CALLS and PER_SCAN
# (index entries read per class scan). Dispatchers flush their statistics at
# most once a second: wait until the index shows every scan the trickle made.
measure() {
    local s0 t0 s1 t1
    sleep 2.5
    read -r s0 t0 < <(claim_index)
    sql "$db" "SELECT pg_stat_statements_reset()" >/dev/null
    trickle "$2"
    expect "$2" 60 "$1 the trickle is delivered"
    CALLS=$(scan_calls)
    flushed() { read -r s1 t1 < <(claim_index); ((s1 - s0 >= 4 * CALLS)); }
    check "$1 the dispatchers' index statistics are flushed" wait_until 20 flushed
    read -r s1 t1 < <(claim_index)
    PER_SCAN=$(python3 -c "print(round(($t1 - $t0) / max($CALLS, 1), 1))")
    log "$1 class scans: $CALLS, deliveries_claim entries read per scan: $PER_SCAN"
}

log "(a) one dispatcher, an old snapshot held, 1,200 events one at a time"
check "(a) a session holds an old snapshot" hold_snapshot
measure "(a)" 1200
check "(a) the class scan ran for most events ($CALLS >= 300)" test "$CALLS" -ge 300
check "(a) a class scan reads at most 50 index entries on average ($PER_SCAN)" \
    python3 -c "import sys; sys.exit(0 if $PER_SCAN <= 50 else 1)"
release_snapshot

log "(b) two dispatchers (lane lists), an old snapshot held"
set_conf relaybus.workers_per_database 2 || die "could not set relaybus.workers_per_database"
check "(b) two dispatchers share the lanes" wait_workers "$db" 2 30
check "(b) a session holds an old snapshot" hold_snapshot
measure "(b)" 800
check "(b) the class scan ran for most events ($CALLS >= 300)" test "$CALLS" -ge 300
check "(b) a class scan reads at most 50 index entries on average ($PER_SCAN)" \
    python3 -c "import sys; sys.exit(0 if $PER_SCAN <= 50 else 1)"
release_snapshot
reset_conf relaybus.workers_per_database
check "(b) one dispatcher again" wait_workers "$db" 1 30

log "(c) a late committer while a stream is claimed past it (poll_interval 10 s)"
set_conf relaybus.poll_interval 10s || die "could not set relaybus.poll_interval"
show_is() { [[ $(sql "$db" "SHOW relaybus.poll_interval") == "$1" ]]; }
check "(c) relaybus.poll_interval is 10s" wait_until 5 show_is 10s
(trickle 2500 n.stream) &
stream=$!
bg_track "$stream"
sleep 0.5
# The late event's transaction draws its id now and commits 1.5 s later, while
# the stream goes on (its 2,500 events take over 5 s).
sql "$db" "BEGIN" "SELECT relay_publish('n.late', '{\"late\": true}')" "SELECT pg_sleep(1.5)" "COMMIT" >/dev/null
committed=$(date +%s%N)
check "(c) the stream is still running at the commit" kill -0 "$stream"
check "(c) the late event arrives within 3 s of its commit" wait_until 3 grep -q '"n.late"' "$TMP/main.out"
log "(c) late event after $(( ($(date +%s%N) - committed) / 1000000 )) ms"

log "(d) a replay of a dead letter (an old id) while the stream runs"
sql "$db" "SELECT relay_create_handler('d', 'pull', '', '{\"max_attempts\": 1}')" "SELECT relay_route('d.#', 'd')" \
    "SELECT relay_publish('d.x', '{}')" >/dev/null
sql "$db" "SELECT relay_nack(c.id, 'poison', NULL, c.lease) FROM relay_claim('d', 1) c" >/dev/null
old=$(sql "$db" "SELECT id FROM relay.dead_letters WHERE handler_id = (SELECT id FROM relay.handlers WHERE name = 'd')")
sql "$db" "UPDATE relay.dead_letters SET handler_id = (SELECT id FROM relay.handlers WHERE name = 'n'),
                  topic = 'n.replayed' WHERE id = $old" >/dev/null
check "(d) the stream is still running at the replay" kill -0 "$stream"
sql "$db" "SELECT relay_replay('n')" >/dev/null
check "(d) the replayed delivery (id $old) arrives within 3 s" wait_until 3 grep -q '"n.replayed"' "$TMP/main.out"
wait "$stream"
expect 2502 60 "(c, d) the stream, the late event and the replay are delivered"
check_eq "(c, d) nothing is left" 0 "$(sql "$db" "SELECT count(*) FROM relay.deliveries")"
reset_conf relaybus.poll_interval

log "(e) a pull consumer under an old snapshot"
sql "$db" "SELECT relay_create_handler('p', 'pull', '', '{}')" "SELECT relay_route('p.#', 'p')" >/dev/null
check "(e) a session holds an old snapshot" hold_snapshot
sleep 2.5
read -r s0 t0 < <(claim_index)
# One session (its statistics are flushed when it exits): publish, claim, ack.
psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" -c "DO \$\$
    DECLARE got int := 0; c record;
    BEGIN
      FOR i IN 1..1000 LOOP
        PERFORM relay_publish('p.x', jsonb_build_object('i', i));
        COMMIT;
        FOR c IN SELECT * FROM relay_claim('p', 10) LOOP
          PERFORM relay_ack(ARRAY[c.id], ARRAY[c.lease]);
          got := got + 1;
        END LOOP;
        COMMIT;
      END LOOP;
      RAISE NOTICE 'claimed %', got;
    END \$\$" >"$TMP/pull.out" 2>"$TMP/pull.err"
check_eq "(e) the consumer's session ran" 0 "$?"
check "(e) it claimed and acked all 1,000" grep -q "claimed 1000" "$TMP/pull.err"
pull_flushed() { read -r s1 t1 < <(claim_index); ((s1 - s0 >= 4000)); }
check "(e) the session's index statistics are flushed" wait_until 20 pull_flushed
read -r s1 t1 < <(claim_index)
per_claim=$(python3 -c "print(round(($t1 - $t0) / 1000, 1))")
log "(e) deliveries_claim entries read per relay_claim: $per_claim"
check "(e) a claim reads at most 50 index entries on average ($per_claim)" \
    python3 -c "import sys; sys.exit(0 if $per_claim <= 50 else 1)"
release_snapshot

log "(f) eight publishers, two dispatchers, an old snapshot: exactly once and in key order"
create_pub_log "$db"
cat >"$TMP/pub.sql" <<'SQL'
\set r random(1, 1000000000)
\set hot random(1, 8)
WITH k AS (SELECT CASE WHEN :hot <= 5 THEN 'hot-' || :hot
                       WHEN :hot = 6 THEN NULL
                       ELSE 'c-' || :client_id || '-' || (:r % 20) END AS key)
INSERT INTO pub_log
SELECT relay_publish('n.f', jsonb_build_object('r', :r), k.key), k.key FROM k;
SQL
set_conf relaybus.workers_per_database 2 || die "could not set relaybus.workers_per_database"
check "(f) two dispatchers share the lanes" wait_workers "$db" 2 30
start_client f "$db" it_oldsnap || die "the LISTEN client did not start"
check "(f) a session holds an old snapshot" hold_snapshot
pgbench -n -c 8 -j 2 -t 250 -f "$TMP/pub.sql" "$db" >"$TMP/f.pgbench" 2>&1
check_eq "(f) pgbench ran" 0 "$?"
f_done() { [[ $(sql "$db" "SELECT count(*) FROM relay.deliveries") == 0 ]]; }
check "(f) everything is delivered" wait_until 60 f_done
sleep 1
release_snapshot
dump_pub_log "$db" "$TMP/f.pub"
analyze --published "$TMP/f.pub" "$TMP/f.out" || die "analysis failed"
log "(f) ${R[published]} committed, ${R[lines]} received"
check_eq "(f) 2,000 events were committed" 2000 "${R[published]}"
check_eq "(f) every committed event was received" 0 "${R[missing]}"
check_eq "(f) nothing was received twice" 0 "${R[dups]}"
check_eq "(f) per key, seqs never go back" 0 "${R[order_violations]}"
check_eq "(f) per key, the received seqs are exactly 1..n" 0 "${R[seq_gap_keys]}"

finish
