#!/usr/bin/env bash
# Moving a database between the editions (docs/managed.md, "Moving between the
# editions") with nothing lost, both ways, as an operator would move to and
# from a managed service: the data of schema relay dumped with
# `pg_dump --data-only`, restored with `pg_restore --data-only` into a database
# where the other edition is installed.
#
#   extension (this script's cluster, relaybus preloaded)
#     -> managed edition (a second cluster with nothing preloaded, installed
#        and restored by a database owner that is not a superuser)
#     -> extension again (a fresh database of the first cluster)
#
# At each step: the handlers, routes, pending and delayed deliveries, dead
# letters, key counters, dedupe keys and sequences arrive; key seqs continue;
# a dedupe key published before the move returns its first event; new ids do
# not collide; the backlog is claimed in key order; the extension's pending
# counters count the restored rows.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT=$RELAYBUS_ROOT
VERSION=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$ROOT/relaybus.control")
SCRIPT=$ROOT/build/relaybus-managed--$VERSION.sql
OWNER=relay_owner
MANAGED=$TMP/managed

stop_managed() { [[ -d "$MANAGED" ]] && bash "$ROOT/test/cluster.sh" destroy "$MANAGED" >/dev/null 2>&1; }
trap 'stop_managed; cleanup' EXIT
trap 'stop_managed; cleanup; echo "$TEST_NAME: interrupted"; echo "$PASSED passed, $((FAILED + 1)) failed"; exit 1' INT TERM

make -s -C "$ROOT" managed >/dev/null || die "make managed failed"
cp "$SCRIPT" "$TMP/managed.sql"
chmod -R a+rX "$TMP"

# The state both editions must carry: pull handlers (nothing delivers them
# meanwhile), a paused notify handler's backlog, a delayed delivery, a dead
# letter, keyed runs, dedupe keys.
fill() { # db
    sql "$1" \
        "SELECT relay_create_handler('mv_pull', 'pull', NULL, '{\"max_attempts\": 1}')" \
        "SELECT relay_route('mv.#', 'mv_pull')" \
        "SELECT relay_create_handler('mv_notify', 'notify', 'it_mv_notify')" \
        "SELECT relay_route('mvn.#', 'mv_notify')" \
        "SELECT relay_pause_handler('mv_notify')" \
        "SELECT relay_publish('mv.dead', '{\"n\": 0}', 'dk')" \
        "SELECT relay_nack(id, 'fails') FROM relay_claim('mv_pull', 10)" \
        "SELECT relay_publish('mv.a', jsonb_build_object('n', g), 'k1') FROM generate_series(1, 3) g" \
        "SELECT relay_publish('mv.b', jsonb_build_object('n', g), 'k2') FROM generate_series(4, 5) g" \
        "SELECT relay_publish('mv.c', '{\"n\": 6}', dedupe_key => 'dd1')" \
        "SELECT relay_publish('mv.later', '{\"n\": 7}', 'k3', not_before => now() + interval '1 hour')" \
        "SELECT relay_publish('mvn.x', jsonb_build_object('n', g), 'nk') FROM generate_series(8, 9) g" >/dev/null
}

# What must survive a move, one line.
state() { # db [user]
    psql -X -q -At -v ON_ERROR_STOP=1 -d "$1" ${2:+-U "$2"} </dev/null -c "
        SELECT (SELECT string_agg(name || ':' || kind || ':' || paused, ',' ORDER BY id) FROM relay.handlers),
               (SELECT string_agg(pattern, ',' ORDER BY pattern) FROM relay.routes),
               (SELECT count(*) FROM relay.deliveries),
               (SELECT count(*) FROM relay.deliveries WHERE not_before > now()),
               (SELECT count(*) FROM relay.dead_letters),
               (SELECT string_agg(key || '=' || seq, ',' ORDER BY key) FROM relay.key_seqs),
               (SELECT string_agg(key, ',' ORDER BY key) FROM relay.dedupe),
               (SELECT string_agg(id || '/' || event_id || '/' || coalesce(seq::text, '-'), ',' ORDER BY id)
                  FROM relay.deliveries)"
}

# After a move: what a consumer and a publisher see.
continues() { # label db max_event [user]
    local label=$1 db=$2 max_event=$3 user=${4:-}
    q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" ${user:+-U "$user"} </dev/null "$@"; }
    check_eq "$label: the backlog is claimed in key order (k1 1..3 first, then k2)" \
        "k1:1,k1:2,k1:3,k2:1,k2:2" \
        "$(q -c "SELECT string_agg(key || ':' || seq, ',' ORDER BY key, seq)
                   FROM relay_claim('mv_pull', 10, per_key => 10) WHERE key IN ('k1', 'k2')")"
    check_eq "$label: key k1 continues at seq 4" "4" \
        "$(q -c "SELECT relay_publish('mv.a', '{\"n\": 10}', 'k1')" \
             -c "SELECT seq FROM relay.deliveries WHERE key = 'k1' ORDER BY seq DESC LIMIT 1" | tail -1)"
    check_eq "$label: a dedupe key published before the move returns its event" "t" \
        "$(q -c "SELECT relay_publish('mv.c', '{\"n\": 11}', dedupe_key => 'dd1') =
                        (SELECT event_id FROM relay.deliveries WHERE payload->>'n' = '6')")"
    check_eq "$label: a new event's id is above every moved one" "t" \
        "$(q -c "SELECT relay_publish('mv.new', '{\"n\": 12}') > $max_event")"
    check_eq "$label: a new handler's id is above every moved one" "t" \
        "$(q -c "SELECT relay_create_handler('mv_new_$RANDOM', 'pull') >
                        (SELECT max(id) FROM relay.handlers WHERE name LIKE 'mv\\_%' AND name NOT LIKE 'mv\\_new\\_%')")"
    check_eq "$label: the paused notify handler's backlog is there, paused" "2|t" \
        "$(q -c "SELECT count(*), bool_and(h.paused) FROM relay.deliveries d JOIN relay.handlers h
                   ON h.id = d.handler_id WHERE h.name = 'mv_notify'")"
}

# dump_relay DB FILE [OPTION...]: the data of schema relay. A database with
# the extension needs --extension=relaybus too: its tables are the extension's
# configuration tables, whose rows pg_dump dumps only with the extension.
dump_relay() {
    local db=$1 file=$2
    shift 2
    pg_dump --data-only --schema=relay "$@" -Fc -f "$file" -d "$db"
}

# ---------------------------------------------------------------- extension -> managed
log "the extension's database"
new_db ext move || die "could not create a database"
fill "$ext" || die "could not fill $ext"
before=$(state "$ext")
log "before: $before"
check_eq "the source holds 2 handlers, 2 routes, 9 deliveries (1 delayed), 1 dead letter" "2|2|9|1|1" \
    "$(cut -d'|' -f1-5 <<<"$before" | awk -F'|' '{ n = split($1, h, ","); m = split($2, r, ","); print n "|" m "|" $3 "|" $4 "|" $5 }')"
max_event=$(sql "$ext" "SELECT max(event_id) FROM relay.deliveries")

check "pg_dump --data-only --schema=relay --extension=relaybus of the extension's database" \
    dump_relay "$ext" "$TMP/ext.dump" --extension=relaybus

log "a cluster with nothing preloaded, the managed edition installed by a database owner"
RELAYBUS_PRELOAD='' bash "$ROOT/test/cluster.sh" start "$MANAGED" >/dev/null || die "managed cluster did not start"
mport=$(sed -n 's/.*PGPORT=\([0-9]*\).*/\1/p' "$MANAGED/env")
m_su() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$MANAGED" -p "$mport" -U postgres "$@" </dev/null; }
m_su -d postgres -c "CREATE ROLE $OWNER LOGIN CREATEROLE" -c "CREATE DATABASE managed OWNER $OWNER" >/dev/null \
    || die "owner and database"
check "the owner installs the managed edition" \
    psql -X -q -1 -v ON_ERROR_STOP=1 -h "$MANAGED" -p "$mport" -U "$OWNER" -d managed -f "$TMP/managed.sql"
check "the owner (not a superuser) restores the data with pg_restore --data-only" \
    pg_restore --data-only --exit-on-error -h "$MANAGED" -p "$mport" -U "$OWNER" -d managed "$TMP/ext.dump"
mdb="host=$MANAGED port=$mport dbname=managed"
# The application's own tables move with an ordinary dump, which names the
# extension: its two entries are left out of the restore list (pg_dump 17 and
# later can leave them out itself with --exclude-extension=relaybus).
sql "$ext" "CREATE TABLE app_orders (id int PRIMARY KEY, note text)" \
    "INSERT INTO app_orders VALUES (1, 'kept')" >/dev/null || die "application table"
check "pg_dump --exclude-schema=relay of the application" \
    pg_dump --exclude-schema=relay --no-owner -Fc -f "$TMP/app.dump" -d "$ext"
pg_restore -l "$TMP/app.dump" | grep -v -E ' EXTENSION (- )?relaybus' >"$TMP/app.list"
check "the owner restores the application, the extension's entries left out" \
    pg_restore --exit-on-error --no-owner -L "$TMP/app.list" -h "$MANAGED" -p "$mport" -U "$OWNER" -d managed \
        "$TMP/app.dump"
check_eq "managed: the application's row arrived" "kept" \
    "$(psql -X -q -At -d "$mdb" -U "$OWNER" -c "SELECT note FROM app_orders" </dev/null)"
check_eq "managed: everything arrived as it was" "$before" "$(state "$mdb" "$OWNER")"
continues "managed" "$mdb" "$max_event" "$OWNER"

# A whole-database dump of the SQL edition (what an operator or a managed
# service's export takes) restores as it is: schema, functions, grants, rows
# and sequences, by the owner, into a new database of the same cluster.
# Its leases (an UNLOGGED table, like the extension's shared memory) stay.
check "pg_dump -Fc --no-unlogged-table-data of the whole managed database" \
    pg_dump -Fc --no-unlogged-table-data -f "$TMP/whole.dump" -d "$mdb" -U "$OWNER"
m_su -d postgres -c "CREATE DATABASE managed_copy OWNER $OWNER" >/dev/null || die "managed_copy"
check "the owner restores it into a new database (pg_restore --exit-on-error)" \
    pg_restore --exit-on-error -h "$MANAGED" -p "$mport" -U "$OWNER" -d managed_copy "$TMP/whole.dump"
cdb="host=$MANAGED port=$mport dbname=managed_copy"
check_eq "the restored copy holds the same state" "$(state "$mdb" "$OWNER")" "$(state "$cdb" "$OWNER")"
check_eq "the restored copy holds no lease: what was leased is claimable" "0|k1:1,k2:1" \
    "$(psql -X -q -At -v ON_ERROR_STOP=1 -d "$cdb" -U "$OWNER" </dev/null \
        -c "SELECT (SELECT count(*) FROM relay.leases),
                   (SELECT string_agg(key || ':' || seq, ',' ORDER BY key) FROM relay_claim('mv_pull', 10)
                     WHERE key IN ('k1', 'k2'))")"

check_eq "the restored copy publishes: k2 continues at seq 3" "3" \
    "$(psql -X -q -At -v ON_ERROR_STOP=1 -d "$cdb" -U "$OWNER" </dev/null \
        -c "SELECT relay_publish('mv.b', '{\"n\": 20}', 'k2')" \
        -c "SELECT max(seq) FROM relay.deliveries WHERE key = 'k2'" | tail -1)"
check_eq "the restored copy keeps the grants: relay_publisher may publish, not read" "t|f" \
    "$(m_su -d managed_copy -c "SELECT has_function_privilege('relay_publisher',
            'relay_publish(text, jsonb, text, jsonb, integer, timestamptz, text)', 'EXECUTE'),
          has_table_privilege('relay_publisher', 'relay.deliveries', 'SELECT')")"

# ---------------------------------------------------------------- managed -> extension
log "back: the managed edition's data into a new database with the extension"
# The SQL edition's leases are its own (the extension keeps them in shared
# memory): not moved, so a delivery leased at the move is claimable again.
mid=$(state "$mdb" "$OWNER")
max_event=$(psql -X -q -At -d "$mdb" -U "$OWNER" -c "SELECT max(event_id) FROM relay.deliveries" </dev/null)
check "pg_dump --data-only --schema=relay of the managed database (its leases left out)" \
    dump_relay "$mdb" "$TMP/managed.dump" --exclude-table=relay.leases
new_db back move_back || die "could not create a database"
# The new database's install created nothing to collide with.
check_eq "a new extension database holds no handler, route or delivery" "0|0|0" \
    "$(sql "$back" "SELECT (SELECT count(*) FROM relay.handlers), (SELECT count(*) FROM relay.routes),
                           (SELECT count(*) FROM relay.deliveries)")"
check "pg_restore --data-only into the extension's database" \
    pg_restore --data-only --exit-on-error -d "$back" "$TMP/managed.dump"
# The claim above leased k1 and k2's deliveries in the managed edition; their
# leases stayed behind, so here they are pending like the rest.
check_eq "extension: everything arrived as it was" "$mid" "$(state "$back")"
pending_is() { sql_is "$back" "SELECT sum(pending) FROM relay.handler_stats WHERE handler IN ('mv_pull', 'mv_notify')" "$1"; }
want=$(sql "$back" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                      WHERE h.name IN ('mv_pull', 'mv_notify')")
check "extension: relay.handler_stats counts the restored backlog ($want pending)" wait_until 20 pending_is "$want"
# The extension's claim is fenced by the seqs the managed edition assigned.
check_eq "extension: the backlog is claimed in key order" "k1:1,k1:2,k1:3,k1:4" \
    "$(sql "$back" "SELECT string_agg(key || ':' || seq, ',' ORDER BY seq)
                      FROM relay_claim('mv_pull', 10, per_key => 10) WHERE key = 'k1'")"
check_eq "extension: key k1 continues at seq 5" "5" \
    "$(sql "$back" "SELECT relay_publish('mv.a', '{\"n\": 13}', 'k1')" \
                   "SELECT max(seq) FROM relay.deliveries WHERE key = 'k1'" | tail -1)"
check_eq "extension: a new event's id is above every moved one" "t" \
    "$(sql "$back" "SELECT relay_publish('mv.new', '{\"n\": 14}') > $max_event")"
check_eq "extension: the dedupe key still returns its first event" "t" \
    "$(sql "$back" "SELECT relay_publish('mv.c', '{\"n\": 15}', dedupe_key => 'dd1') =
                           (SELECT event_id FROM relay.deliveries WHERE payload->>'n' = '6')")"

finish
