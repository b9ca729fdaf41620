#!/usr/bin/env bash
# Failover to a streaming replica (docs/failover.md).
#
# A primary and a synchronous streaming replica (pg_basebackup -R,
# synchronous_standby_names = the replica's application_name), both with
# relaybus preloaded, in clusters of their own. Events are published under load
# (two sessions, shared keys) to a notify handler (ack mode, a LISTEN client that
# reconnects to whichever server accepts writes and drains with relay_claim), an
# http handler (the test receiver) and a kafka handler (a real broker). The
# primary is killed (-m immediate) mid-stream and the replica promoted; the old
# primary then rejoins as a standby (pg_rewind), and a switchover makes it the
# primary again. Shown:
#   - on the replica before promotion: no relaybus launcher or dispatcher (in
#     pg_stat_activity, relay.workers, its log); the read-only views work; every
#     call that hands over or completes a delivery is refused with 25006
#     (on 0.2.0 relay_claim and relay_extend worked on a standby: they leased
#     deliveries in the standby's shared memory, so a consumer of a standby got
#     work the primary also handed to another, and the leases it took were still
#     held after the promotion);
#   - after promotion the new primary's dispatchers start by themselves and
#     deliver every event whose publish was acknowledged, per key in seq order,
#     without waiting out a lease; only deliveries in flight at the crash are
#     sent again (relaybus.worker_synchronous_commit = on: completions are
#     replicated before a key's next delivery goes out); the duplicates are
#     counted, bounded (one a key per handler, a kafka key's window) and
#     reported, as is the time from promotion to first delivery;
#   - the old primary, rewound and streaming from the new one, runs no relaybus
#     process and refuses relay_publish/claim/ack (25006); what the new primary
#     publishes meanwhile is replayed there and delivered once, by the new
#     primary alone;
#   - a switchover (dispatchers stopped with relaybus.enabled = off, a fast
#     stop, the rejoined server promoted) loses nothing acknowledged and
#     delivers what was published across it once; the server it switched
#     over from comes back as a standby by a new base backup (docs/failover.md).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"

CLUSTER_SH=$RELAYBUS_ROOT/test/cluster.sh
base=$(mktemp -d /tmp/relaybus-failover.XXXXXX)  # outside $TMP (mode 700): postgres must reach it
chmod 755 "$base"
prim=$base/primary
repl=$base/replica
# The clusters go with everything else the test made.
eval "$(declare -f cleanup | sed '1s/^cleanup/kafka_cleanup/')"
cleanup() {
    bash "$CLUSTER_SH" destroy "$repl" >/dev/null 2>&1
    bash "$CLUSTER_SH" destroy "$prim" >/dev/null 2>&1
    rm -rf "$base"
    kafka_cleanup
}

# The broker starts beside the clusters' setup; the kafka handler is created
# once it is up, before the publishers.
kafka_pick_port
kafka_start >"$TMP/kafka.out" 2>&1 &
kafka_starting=$!
start_receiver r || die "could not start the receiver"
log "primary"
RELAYBUS_PRELOAD=relaybus RELAYBUS_EXTRA_CONF="wal_level = replica
max_wal_senders = 4
wal_log_hints = on
wal_keep_size = '128MB'
relaybus.worker_synchronous_commit = on
relaybus.http_allowlist = '127.0.0.1'" \
    bash "$CLUSTER_SH" start "$prim" >"$TMP/primary.out" 2>&1 || die "primary: $(cat "$TMP/primary.out")"
pport=$(. "$prim/env" && echo "$PGPORT")
# on HOST-DIR PORT DB ARGS...: psql against one of the two servers.
on() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$1" -p "$2" -U postgres -d "$3" "${@:4}" </dev/null; }
# state_of DIR PORT QUERY: the SQLSTATE QUERY fails with (empty if it succeeds).
state_of() {
    psql -X -q -At -v VERBOSITY=verbose -h "$1" -p "$2" -U postgres -d fo -c "$3" </dev/null 2>&1 \
        | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p' | head -n 1
}

on "$prim" "$pport" postgres -c "CREATE DATABASE fo" || die "CREATE DATABASE"
on "$prim" "$pport" fo -c "CREATE EXTENSION relaybus" \
    -c "SELECT relay_create_handler('fo_notify', 'notify', 'it_fo', '{\"ack\": true, \"lease\": \"60s\"}')" \
    -c "SELECT relay_route('fo.#', 'fo_notify')" \
    -c "SELECT relay_create_handler('fo_http', 'http', 'http://127.0.0.1:$RECV_PORT/fo', '{\"lease\": \"60s\"}')" \
    -c "SELECT relay_route('fo.#', 'fo_http')" \
    -c "SELECT relay_create_handler('fo_pull', 'pull')" \
    -c "SELECT relay_route('pull.#', 'fo_pull')" \
    -c "SELECT relay_publish('pull.x', jsonb_build_object('n', g), 'p' || g) FROM generate_series(1, 3) g" \
    -c "CREATE TABLE pub_log (id bigint PRIMARY KEY, key text)" >/dev/null || die "could not set up the primary"

log "replica: pg_basebackup -R"
start_standby "$prim" "$pport" "$repl" fo_replica 2>"$TMP/replica.out" || die "replica: $(cat "$TMP/replica.out")"
rport=$STANDBY_PORT
# replication_is HOST PORT APP COLUMN VALUE: pg_stat_replication of the server at
# HOST:PORT shows VALUE in COLUMN (state, sync_state) for the standby APP.
replication_is() {
    [[ $(on "$1" "$2" postgres -c "SELECT $4 FROM pg_stat_replication WHERE application_name = '$3'") == "$5" ]]
}
wait_until 30 replication_is "$prim" "$pport" fo_replica state streaming || die "the replica does not stream"
on "$prim" "$pport" postgres -c "ALTER SYSTEM SET synchronous_standby_names = 'fo_replica'" \
    -c "SELECT pg_reload_conf()" >/dev/null
check "the replica is synchronous" wait_until 15 replication_is "$prim" "$pport" fo_replica sync_state sync
check_eq "the replica is in recovery" t "$(on "$repl" "$rport" fo -c "SELECT pg_is_in_recovery()")"

# relaybus_procs [HOST PORT]: relaybus processes in pg_stat_activity (default: on
# the replica, where there is none until promotion).
relaybus_procs() {
    on "${1:-$repl}" "${2:-$rport}" postgres -c "SELECT count(*) FROM pg_stat_activity
                                                  WHERE backend_type LIKE 'relaybus%'"
}
replica_has_pull() { [[ $(on "$repl" "$rport" fo -c "SELECT count(*) FROM relay.deliveries") -ge 3 ]]; }
wait_until 15 replica_has_pull || die "the replica did not replay the pull deliveries"
check_eq "on the replica: no relaybus launcher or dispatcher" 0 "$(relaybus_procs)"
check_eq "on the replica: relay.workers is empty" 0 "$(on "$repl" "$rport" fo -c "SELECT count(*) FROM relay.workers")"
check_eq "on the replica: relay.handler_stats reads the pending deliveries" "3" \
    "$(on "$repl" "$rport" fo -c "SELECT pending FROM relay.handler_stats WHERE handler = 'fo_pull'")"
check_eq "on the replica: relay.handler_metrics and relay.dead_letters read" "3|0" \
    "$(on "$repl" "$rport" fo -c "SELECT (SELECT count(*) FROM relay.handler_metrics), (SELECT count(*) FROM relay.dead_letters)")"
pull_id=$(on "$repl" "$rport" fo -c "SELECT min(id) FROM relay.deliveries")
check_eq "on the replica: relay_payload reads" '{"n": 1}' \
    "$(on "$repl" "$rport" fo -c "SELECT relay_payload($pull_id)")"
check_eq "on the replica: relay_publish is refused (25006)" 25006 \
    "$(state_of "$repl" "$rport" "SELECT relay_publish('pull.x', '{}')")"
check_eq "on the replica: relay_claim is refused (25006), it hands nothing over" 25006 \
    "$(state_of "$repl" "$rport" "SELECT * FROM relay_claim('fo_pull', 10)")"
check_eq "on the replica: relay_extend is refused (25006)" 25006 \
    "$(state_of "$repl" "$rport" "SELECT relay_extend($pull_id, gen_random_uuid())")"
check_eq "on the replica: relay_ack is refused (25006)" 25006 \
    "$(state_of "$repl" "$rport" "SELECT relay_ack(ARRAY[$pull_id::bigint], ARRAY[gen_random_uuid()])")"
check_eq "on the replica: relay_nack is refused (25006)" 25006 \
    "$(state_of "$repl" "$rport" "SELECT relay_nack($pull_id, 'x', lease => gen_random_uuid())")"
check_eq "on the replica: relay_pause_handler is refused (25006)" 25006 \
    "$(state_of "$repl" "$rport" "SELECT relay_pause_handler('fo_pull')")"
check_eq "on the replica: no lease was taken" 0 "$(on "$repl" "$rport" fo -c "SELECT count(*) FROM relay._leases()")"

wait "$kafka_starting" || die "the broker did not start: $(tail -n 20 "$TMP/kafka.out")"
# A window of 4 per key: pipelined, and a bound on what the crash can repeat.
KAFKA_WINDOW=4
on "$prim" "$pport" fo -c "SELECT relay_create_handler('fo_kafka', 'kafka', 'kafka://$KAFKA_BOOTSTRAP/fo-topic',
                               '{\"lease\": \"60s\", \"timeout\": \"10s\", \"key_window\": $KAFKA_WINDOW}')" \
    -c "SELECT relay_route('fo.#', 'fo_kafka')" >/dev/null || die "could not create the kafka handler"

log "LISTEN client (reconnects to the server that accepts writes) and publishers"
conninfo="host=$prim,$repl port=$pport,$rport user=postgres dbname=fo target_session_attrs=read-write"
rm -f "$TMP/client.ready"
# --reconnect: the client must outlast the time from the kill to the promotion
# (two fresh Debian roots at load 40 took 42 s there, and a client that gave
# up at 40 s left every later notify check failing): 300 s, a cap only.
"$CLIENT" --channel it_fo --ack --claim-at-start fo_notify --reconnect 300 --timestamps \
    --ready-file "$TMP/client.ready" "$conninfo" >"$TMP/client.out" 2>"$TMP/client.err" &
bg_track $!
wait_until 15 test -s "$TMP/client.ready" || die "the client did not start: $(cat "$TMP/client.err")"

# Each publisher prints "id key" once its COMMIT returned: acknowledged, so (with
# synchronous replication) on the replica too.
for p in 1 2; do
    for ((i = 0; i < 4000; i++)); do
        k="k$(((i * 7 + p) % 16))"
        printf 'BEGIN;\nSELECT relay_publish(%s, jsonb_build_object(%s, %d, %s, %d), %s) AS id \\gset\n' \
            "'fo.e'" "'p'" "$p" "'i'" "$i" "'$k'"
        printf 'INSERT INTO pub_log VALUES (:id, %s);\nCOMMIT;\n\\echo :id %s\n' "'$k'" "$k"
    done >"$TMP/pub$p.sql"
    psql -X -q -At -v ON_ERROR_STOP=1 -h "$prim" -p "$pport" -U postgres -d fo -f "$TMP/pub$p.sql" \
        >"$TMP/pub$p.out" 2>"$TMP/pub$p.err" &
    bg_track $!
    eval "pub${p}_pid=$!"
done
published_enough() { (($(on "$prim" "$pport" fo -c "SELECT count(*) FROM pub_log") >= 600)); }
wait_until 60 published_enough || die "the publishers did not get going: $(cat "$TMP/pub1.err")"
check_eq "under load, on the replica: no relaybus launcher or dispatcher" 0 "$(relaybus_procs)"
delivered_before=$(recv_count "$TMP/r.log" /fo)

log "kill the primary (-m immediate) mid-stream"
bash "$CLUSTER_SH" stop-immediate "$prim" >/dev/null 2>&1
wait_pid "$pub1_pid" 10
wait_pid "$pub2_pid" 10
cat "$TMP/pub1.out" "$TMP/pub2.out" | sort -n >"$TMP/acked"
acked=$(wc -l <"$TMP/acked")
log "acknowledged publishes: $acked; http deliveries before the crash: $delivered_before"
check "the publishers were stopped by the crash, mid-stream" test "$acked" -lt 8000
check_eq "after the crash, before promotion: no relaybus process on the replica" 0 "$(relaybus_procs)"
check_eq "after the crash, before promotion: relay.workers on the replica is empty" 0 \
    "$(on "$repl" "$rport" fo -c "SELECT count(*) FROM relay.workers")"

log "promote the replica"
promoted_at=$(date +%s.%N)
check_eq "pg_promote()" t "$(on "$repl" "$rport" postgres -c "SELECT pg_promote()")"
grep -n 'received promote request' "$repl/log/postgresql.log" | head -n 1 >"$TMP/promote.line"
promote_line=$(cut -d: -f1 <"$TMP/promote.line")
check_eq "the replica's log shows no relaybus launcher or dispatcher before the promotion" 0 \
    "$(head -n "${promote_line:-1}" "$repl/log/postgresql.log" | grep -ci 'relaybus \(launcher\|dispatcher\)')"

# remaining [HOST PORT]: notify, http and kafka deliveries pending (default: on the replica).
remaining() {
    on "${1:-$repl}" "${2:-$rport}" fo -c "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                                WHERE h.name IN ('fo_notify', 'fo_http', 'fo_kafka')"
}
drained() { [[ $(remaining "$@") == 0 ]]; }
# Well within the 60 s leases: nothing waits out a lease taken on the old primary.
check "the new primary delivers everything (within 25 s, the leases are 60 s)" wait_until 25 drained
drained_at=$(date +%s.%N)
check_eq "the new primary runs its dispatcher" 1 \
    "$(on "$repl" "$rport" fo -c "SELECT count(*) FROM relay.workers WHERE lanes_held = 64")"

on "$repl" "$rport" fo -c "SELECT id, key FROM pub_log ORDER BY id" >"$TMP/committed"
committed=$(wc -l <"$TMP/committed")
lost_acked=$(cut -d' ' -f1 "$TMP/acked" | sort >"$TMP/acked.ids"; cut -d'|' -f1 "$TMP/committed" | sort \
    | comm -23 "$TMP/acked.ids" - | wc -l)
check_eq "every acknowledged publish is on the new primary" 0 "$lost_acked"
log "committed on the new primary: $committed (acknowledged: $acked)"

# first_order OUT: per key, the first receipt of each seq comes in seq order
# (first_order_violations); resent_behind counts re-sends of a seq that arrive
# after a later seq of the key was received: completions the crash forgot, which
# relaybus.worker_synchronous_commit = on prevents (docs/failover.md), so only
# the deliveries in flight at the crash are sent again.
first_order() {
    py_facts first_order "$1" <<'EOF'
import json, sys
import http_log
first_bad = behind = 0
seen, top, copies = {}, {}, {}
for line in open(sys.argv[1]):
    parts = line.rstrip("\n").split("\t")
    if len(parts) < 2:
        continue
    m = json.loads(parts[1])
    k, s = m.get("key"), m.get("seq")
    if k is None or s is None:
        continue
    copies[(k, s)] = copies.get((k, s), 0) + 1
    if s in seen.setdefault(k, set()):
        if s < top[k]:
            behind += 1
        continue
    if k in top and s < top[k]:
        first_bad += 1
    seen[k].add(s)
    top[k] = max(top.get(k, 0), s)
http_log.facts({"first_order_violations": first_bad, "resent_behind": behind,
                "max_copies": max(copies.values(), default=0)})
EOF
}

# received KIND FILE COPIES PER_KEY: every committed event once at least, per
# key in seq order, none more than COPIES times, at most PER_KEY duplicates a
# key on average; sets DUPS and BEHIND (re-sends after a later seq of their key).
received() {
    local kind=$1 file=$2
    analyze --published "$TMP/committed" "$file" || die "deliveries.py on $file"
    check_eq "$kind: no committed event missing" 0 "${R[missing]}"
    check_eq "$kind: no event that was not committed" 0 "${R[extra]}"
    check_eq "$kind: every key's seqs 1..n, keys as published" "0|0" "${R[seq_gap_keys]}|${R[key_mismatch]}"
    DUPS=${R[dups]}
    first_order "$file"
    check_eq "$kind: per key, first receipts in seq order" 0 "${R[first_order_violations]}"
    BEHIND=${R[resent_behind]}
    check_eq "$kind: re-sent only what was in flight (none behind a later seq of its key)" 0 "$BEHIND"
    check "$kind: each delivery received at most $3 times (${R[max_copies]})" test "${R[max_copies]}" -le "$3"
    check "$kind: duplicates at most $4 per key ($DUPS <= $(($4 * 16)))" test "$DUPS" -le $(($4 * 16))
}
# A key has one delivery in flight at a time per handler: the crash repeats at
# most one delivery per key, once. The LISTEN client can get one more: a
# NOTIFY the new primary sends between the client's LISTEN and its relay_claim
# arrives and is claimed too (the claim takes its lease over).
received notify "$TMP/client.out" 3 2
notify_dups=$DUPS notify_back=$BEHIND

# http_lines OUT: the receiver's records as listen_client lines, for the same analyses.
http_lines() {
    PYTHONPATH="$INTEG_DIR" python3 - "$TMP/r.log" >"$1" <<'EOF'
import json, sys
import http_log
for r in http_log.records(sys.argv[1], "/fo"):
    print(f"0\t{json.dumps(r['env'])}\tt={r['t']}")
EOF
}
http_lines "$TMP/http.out"
received http "$TMP/http.out" 2 1
http_dups=$DUPS http_back=$BEHIND

# Promotion to first delivery: the first notification or request after pg_promote().
first=$(python3 - "$promoted_at" "$TMP/client.out" "$TMP/http.out" <<'EOF'
import re, sys
t0 = float(sys.argv[1])
after = []
for path in sys.argv[2:]:
    for line in open(path):
        m = re.search(r"\t(?:recv|t)=([0-9.]+)", line)
        if m and float(m.group(1)) > t0:
            after.append(float(m.group(1)))
print(f"{(min(after) - t0) * 1000:.0f}" if after else "none")
EOF
)
check "a delivery after the promotion" test "$first" != none
log "failover: committed $committed, acknowledged $acked; duplicates: notify $notify_dups ($notify_back behind a later seq),"
log "  http $http_dups ($http_back behind a later seq)"
log "  promotion to first delivery ${first} ms, to all delivered $(python3 -c "print(f'{($drained_at - $promoted_at) * 1000:.0f}')") ms"

# ---------------------------------------------------------------- the old primary rejoins
# pg_rewind needs wal_log_hints (set above) or data checksums on the old
# primary, and the old primary's WAL back to the last checkpoint before the
# servers diverged: the crash recovery pg_rewind runs first ends with a
# checkpoint that recycles that WAL unless wal_keep_size (set above) keeps it
# ("could not find previous WAL record"). It reads the new timeline from the source's control file, which a
# promotion updates only at its first checkpoint: without the CHECKPOINT it
# finds both on one timeline, rewinds nothing, and the old primary cannot
# follow the new one. It copies the source's configuration files too, port
# and socket directory included: this server's own are appended again after it.
log "the old primary rejoins as a standby of the new primary (CHECKPOINT there, pg_rewind -R)"
on "$repl" "$rport" postgres -c "CHECKPOINT" || die "CHECKPOINT on the new primary"
as_postgres() {
    if ((EUID == 0)); then (cd "$base" && runuser -u postgres -- "$@"); else "$@"; fi
}
rewind_started=$(date +%s.%N)
as_postgres pg_rewind --target-pgdata="$prim/data" -R \
    --source-server="host=$repl port=$rport user=postgres dbname=postgres application_name=fo_old" \
    >"$TMP/rewind.out" 2>&1 || die "pg_rewind: $(cat "$TMP/rewind.out")"
rewind_ms=$(python3 -c "print(f'{($(date +%s.%N) - $rewind_started) * 1000:.0f}')")
check "pg_rewind rewound the old primary (it had diverged: it crashed, the replica was promoted)" \
    grep -q 'Done!' "$TMP/rewind.out"
printf "port = %s\nunix_socket_directories = '%s'\n" "$pport" "$prim" >>"$prim/data/postgresql.conf"
check "pg_rewind -R wrote standby.signal" test -f "$prim/data/standby.signal"
log_from=$(($(wc -l <"$prim/log/postgresql.log") + 1))
bash "$CLUSTER_SH" start "$prim" >"$TMP/rejoin.out" 2>&1 || die "the old primary: $(cat "$TMP/rejoin.out")"
check_eq "the old primary is in recovery" t "$(on "$prim" "$pport" fo -c "SELECT pg_is_in_recovery()")"
check "the old primary streams from the new primary" \
    wait_until 30 replication_is "$repl" "$rport" fo_old state streaming
log "pg_rewind took $rewind_ms ms"

# Sampled all along what follows: any relaybus process on the rejoined server.
(while [[ ! -e "$TMP/stop-sampling" ]]; do relaybus_procs "$prim" "$pport"; sleep 0.2; done) \
    >"$TMP/old_procs" 2>/dev/null &
bg_track $!
check_eq "on the rejoined server: relay.workers is empty" 0 \
    "$(on "$prim" "$pport" fo -c "SELECT count(*) FROM relay.workers")"
check_eq "on the rejoined server: relay_publish is refused (25006)" 25006 \
    "$(state_of "$prim" "$pport" "SELECT relay_publish('fo.e', '{}', 'k0')")"
check_eq "on the rejoined server: relay_claim is refused (25006)" 25006 \
    "$(state_of "$prim" "$pport" "SELECT * FROM relay_claim('fo_pull', 10)")"
check_eq "on the rejoined server: relay_ack is refused (25006)" 25006 \
    "$(state_of "$prim" "$pport" "SELECT relay_ack(ARRAY[$pull_id::bigint], ARRAY[gen_random_uuid()])")"
check_eq "on the rejoined server: no lease, nothing in flight" "0|0" \
    "$(on "$prim" "$pport" fo -c "SELECT (SELECT count(*) FROM relay._leases()),
                                         (SELECT coalesce(sum(in_flight), 0) FROM relay.handler_stats)")"

# Published on the new primary while the old one streams: delivered once each,
# by the new primary alone, and replayed on the rejoined server.
log "publish on the new primary with the old one streaming from it"
before_rejoin=$(on "$repl" "$rport" fo -c "SELECT max(id) FROM pub_log")
for ((i = 0; i < 48; i++)); do
    printf "WITH e AS (SELECT relay_publish('fo.e', jsonb_build_object('r', %d), 'k%d') AS id)
            INSERT INTO pub_log SELECT id, 'k%d' FROM e;\n" "$i" $((i % 16)) $((i % 16))
done >"$TMP/rejoin_pub.sql"
echo "SELECT relay_publish('pull.r', jsonb_build_object('r', g), 'r' || g) FROM generate_series(1, 3) g;" \
    >>"$TMP/rejoin_pub.sql"
psql -X -q -v ON_ERROR_STOP=1 -h "$repl" -p "$rport" -U postgres -d fo -f "$TMP/rejoin_pub.sql" >/dev/null \
    || die "could not publish on the new primary"
on "$repl" "$rport" fo -c "SELECT id FROM pub_log WHERE id > $before_rejoin ORDER BY id" >"$TMP/rejoin.ids"
check_eq "48 events published after the rejoin" 48 "$(wc -l <"$TMP/rejoin.ids")"
check "the new primary delivers them" wait_until 25 drained
# replayed: prints "pub_log rows past the rejoin|its pull events pending|notify,
# http and kafka deliveries left" (an event is a row of relay.events while a delivery
# of it is pending: the pull handler's wait for a consumer).
replayed() {
    on "$prim" "$pport" fo -c "SELECT (SELECT count(*) FROM pub_log WHERE id > $before_rejoin),
                                       (SELECT count(*) FROM relay.events WHERE topic = 'pull.r'),
                                       (SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                                        WHERE h.name IN ('fo_notify', 'fo_http', 'fo_kafka'))"
}
replayed_all() { [[ $(replayed) == "48|3|0" ]]; }
wait_until 20 replayed_all
check_eq "the rejoined server replays them: the events, and their completed deliveries gone" "48|3|0" "$(replayed)"
check_eq "on the rejoined server: relay_payload reads an event published after the rejoin" '{"r": 2}' \
    "$(on "$prim" "$pport" fo -c "SELECT relay_payload(min(id)) FROM relay.deliveries WHERE key = 'r2'")"
# received_each IDS MAX COPIES OUT...: every event id of the file IDS is in 1
# to MAX lines of the OUTs (listen_client lines), with at most COPIES lines
# beyond the first in all; prints what it found.
received_each() {
    python3 - "$@" <<'EOF'
import json, sys
want = {int(x) for x in open(sys.argv[1]).read().split()}
most, copies_most = int(sys.argv[2]), int(sys.argv[3])
counts = {}
for path in sys.argv[4:]:
    for line in open(path):
        parts = line.rstrip("\n").split("\t")
        if len(parts) < 2:
            continue
        eid = json.loads(parts[1]).get("event_id")
        if eid in want:
            counts[eid] = counts.get(eid, 0) + 1
bad = sorted((e, counts.get(e, 0)) for e in want if not 1 <= counts.get(e, 0) <= most)
copies = sum(counts.values()) - len(counts)
print(f"{len(want) - len(bad)} of {len(want)} received 1 to {most} times, "
      f"{copies} copies beyond the first (at most {copies_most}); not: {bad[:10]}")
sys.exit(1 if bad or not want or copies > copies_most else 0)
EOF
}
# The receiver logs a request when it answers it, the client a notification
# before it acks: both are in by the time the deliveries are gone.
http_lines "$TMP/http2.out"
check "notify: each event published after the rejoin delivered exactly once" received_each "$TMP/rejoin.ids" 1 0 "$TMP/client.out"
check "http: each event published after the rejoin delivered exactly once" received_each "$TMP/rejoin.ids" 1 0 "$TMP/http2.out"
touch "$TMP/stop-sampling"
sleep 0.5
check "the rejoined server ran no relaybus process meanwhile ($(wc -l <"$TMP/old_procs") samples)" \
    bash -c "[[ -s '$TMP/old_procs' ]] && ! grep -qv '^0\$' '$TMP/old_procs'"
no_relaybus_lines() { ! tail -n "+$log_from" "$prim/log/postgresql.log" | sed "s|$base||g" | grep -i 'relaybus'; }
check "the rejoined server's log names no relaybus process" no_relaybus_lines
check_eq "the rejoined server is still in recovery" t "$(on "$prim" "$pport" fo -c "SELECT pg_is_in_recovery()")"
log "rejoin: pg_rewind $rewind_ms ms; 48 events after it delivered once each by the new primary"

# ---------------------------------------------------------------- switchover back
# Planned, while the application publishes: the new primary's dispatchers
# stopped first (relaybus.enabled = off: each completes its requests in flight
# and exits), then the server (a fast shutdown sends its standbys all of its
# WAL before it ends), and the rejoined server promoted. A fast shutdown alone
# SIGTERMs a dispatcher, which dies inside its transaction when it is in one,
# and its deliveries in flight are sent again (docs/failover.md). Commits wait
# for the rejoined server, as they did for the replica.
log "switchover back: the new primary's dispatchers stopped, then the server, the rejoined server promoted"
on "$repl" "$rport" postgres -c "ALTER SYSTEM SET synchronous_standby_names = 'fo_old'" \
    -c "SELECT pg_reload_conf()" >/dev/null
check "the rejoined server is synchronous" wait_until 15 replication_is "$repl" "$rport" fo_old sync_state sync
before_switch=$(on "$repl" "$rport" fo -c "SELECT max(id) FROM pub_log")
for ((i = 0; i < 3000; i++)); do
    printf "WITH e AS (SELECT relay_publish('fo.e', jsonb_build_object('s', %d), 'k%d') AS id)
            INSERT INTO pub_log SELECT id, 'k%d' FROM e RETURNING id;\n" "$i" $((i % 16)) $((i % 16))
done >"$TMP/switch_pub.sql"
psql -X -q -At -v ON_ERROR_STOP=1 -h "$repl" -p "$rport" -U postgres -d fo -f "$TMP/switch_pub.sql" \
    >"$TMP/switch_pub.out" 2>"$TMP/switch_pub.err" &
switch_pub=$!
bg_track "$switch_pub"
wait_lines "$TMP/switch_pub.out" 150 30 || die "the publisher did not get going: $(cat "$TMP/switch_pub.err")"
on "$repl" "$rport" postgres -c "ALTER SYSTEM SET relaybus.enabled = off" -c "SELECT pg_reload_conf()" >/dev/null
no_dispatcher() { [[ $(on "$repl" "$rport" postgres -c "SELECT count(*) FROM pg_stat_activity
                                                         WHERE backend_type = 'relaybus dispatcher'") == 0 ]]; }
check "relaybus.enabled = off: the dispatchers exit" wait_until 20 no_dispatcher
bash "$CLUSTER_SH" stop "$repl" >"$TMP/switch_stop.out" 2>&1 || die "fast stop: $(cat "$TMP/switch_stop.out")"
wait_pid "$switch_pub" 10
sort "$TMP/switch_pub.out" >"$TMP/switch.acked"  # for comm: in its order, not by number
check "the publisher ran until the shutdown stopped it, mid-stream" test "$(line_count "$TMP/switch.acked")" -lt 3000
switched_at=$(date +%s.%N)
check_eq "pg_promote() of the rejoined server" t "$(on "$prim" "$pport" postgres -c "SELECT pg_promote()")"
check "the promoted server delivers everything" wait_until 25 drained "$prim" "$pport"
switch_drained_at=$(date +%s.%N)
check_eq "the promoted server runs its dispatcher" 1 \
    "$(on "$prim" "$pport" fo -c "SELECT count(*) FROM relay.workers WHERE lanes_held = 64")"
on "$prim" "$pport" fo -c "SELECT id FROM pub_log WHERE id > $before_switch ORDER BY id" >"$TMP/switch.ids"
check_eq "every acknowledged publish is on the promoted server" 0 \
    "$(comm -23 "$TMP/switch.acked" <(sort "$TMP/switch.ids") | wc -l)"
http_lines "$TMP/http3.out"
# A key's NOTIFY the client had not acked when the server stopped is sent
# again by the promoted server (the dispatchers exit without waiting for
# acks), and the LISTEN client's reconnect race (above) can add one more: at
# most three receipts of a delivery, two copies a key.
check "notify: each event published before the switchover delivered, two copies a key at most" \
    received_each "$TMP/switch.ids" 3 32 "$TMP/client.out"
check "http: each event published before the switchover delivered once" \
    received_each "$TMP/switch.ids" 1 0 "$TMP/http3.out"
log "switchover: $(line_count "$TMP/switch.acked") acknowledged, $(line_count "$TMP/switch.ids") committed;"
log "  promotion to all delivered $(python3 -c "print(f'{($switch_drained_at - $switched_at) * 1000:.0f}')") ms;"
log "  notify: $(received_each "$TMP/switch.ids" 3 32 "$TMP/client.out")"

# ---------------------------------------------------------------- a new base backup
# The other way back for an old primary (docs/failover.md: where pg_rewind
# cannot run): its data directory replaced by a base backup of the primary.
log "the switched-over server rejoins by a new base backup"
again_started=$(date +%s.%N)
rm -rf "$repl/data"
start_standby "$prim" "$pport" "$repl" fo_again 2>"$TMP/again.out" || die "base backup: $(cat "$TMP/again.out")"
rport=$STANDBY_PORT
check "it streams from the primary" wait_until 30 replication_is "$prim" "$pport" fo_again state streaming
check_eq "it is in recovery" t "$(on "$repl" "$rport" fo -c "SELECT pg_is_in_recovery()")"
check_eq "on it: no relaybus process" 0 "$(relaybus_procs)"
check_eq "on it: relay_claim is refused (25006)" 25006 \
    "$(state_of "$repl" "$rport" "SELECT * FROM relay_claim('fo_pull', 10)")"
on "$prim" "$pport" fo -c "SELECT relay_publish('pull.again', '{\"again\": 1}', 'again')" >/dev/null
replayed_again() { [[ $(on "$repl" "$rport" fo -c "SELECT count(*) FROM relay.events WHERE topic = 'pull.again'") == 1 ]]; }
check "it replays what the primary publishes" wait_until 20 replayed_again
log "base backup to replaying: $(python3 -c "print(f'{($(date +%s.%N) - $again_started) * 1000:.0f}')") ms"

# kafka: the topic read back whole, against every committed event (the
# failover's, the rejoin's, the switchover's). A key has at most a window in
# flight, so the crash repeats at most that many of its messages.
on "$prim" "$pport" fo -c "SELECT id, key FROM pub_log ORDER BY id" >"$TMP/committed_all"
check "kafka: every committed event is in the topic" \
    wait_until 60 kafka_has fo-topic "$(wc -l <"$TMP/committed_all")"
kafka_consume fo-topic "$TMP/topic.json"
python3 - "$TMP/topic.json" >"$TMP/kafka2.out" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    h = dict(zip(m["headers"][0::2], m["headers"][1::2]))
    print(f"0\t{json.dumps({'event_id': int(h['relay-event-id'])})}")
EOF
check "kafka: each event published after the rejoin produced exactly once" \
    received_each "$TMP/rejoin.ids" 1 0 "$TMP/kafka2.out"
check "kafka: each event published before the switchover produced once" \
    received_each "$TMP/switch.ids" 1 0 "$TMP/kafka2.out"
kafka_order_facts "$TMP/topic.json" "$TMP/committed_all"
check_eq "kafka: nothing committed is missing, nothing uncommitted arrived" "0|0" "${R[missing]}|${R[extra]}"
check_eq "kafka: each key in one partition" True "${R[keys_in_one_partition]}"
check_eq "kafka: per key in seq order, repeats only of contiguous runs" 0 "${R[out_of_order_runs]}"
check "kafka: a key repeats at most its window (${R[max_dups_per_key]} <= $KAFKA_WINDOW)" \
    test "${R[max_dups_per_key]}" -le "$KAFKA_WINDOW"
log "kafka: ${R[messages]} messages, ${R[duplicates]} duplicates (max ${R[max_dups_per_key]} per key, window $KAFKA_WINDOW)"
finish
