#!/usr/bin/env bash
# The managed SQL edition's upgrade scripts (docs/managed.md, "Upgrades"), on
# a cluster with no relaybus at all, run by the database owner (not a
# superuser): an install of 0.2.0 (test/fixtures, as released) with handlers,
# a backlog, key counters, dedupe keys, a dead letter and a lease held by a
# consumer, upgraded with build/relaybus-managed--0.2.0--<current>.sql, has
# the catalog a fresh install of <current> has, keeps its data, and goes on:
# the held lease is acked, seqs continue, the new columns work. Each refusal
# (already upgraded, nothing installed, another role) is checked with its
# SQLSTATE, and leaves the database as it was.
#
# Uses its own cluster (not the one run_all.sh gives the other scripts).
export PGHOST=${PGHOST:-/nonexistent} PGPORT=${PGPORT:-1}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/managed_lib.sh"

FROM=0.2.0  # the generator checks below
OWNER=relay_owner

trap 'stop_bare_cluster; cleanup' EXIT
trap 'stop_bare_cluster; cleanup; echo "$TEST_NAME: interrupted"; echo "$PASSED passed, $((FAILED + 1)) failed"; exit 1' INT TERM

make -s -C "$RELAYBUS_ROOT" managed >/dev/null || die "make managed failed"
# The generator decides every statement of an extension upgrade script: a
# kind it does not know stops the build, with nothing written.
printf '%s\n' "CREATE FUNCTION relay.f() RETURNS int AS 'MODULE_PATHNAME', 'f' LANGUAGE C;" \
    'DO $x$ BEGIN PERFORM 1; END $x$;' >"$TMP/odd--upgrade.sql"
out=$(bash "$RELAYBUS_ROOT/scripts/managed-upgrade.sh" "$FROM" "$MANAGED_VERSION" "$MANAGED_SCRIPT" "$TMP/odd.sql" \
      "$TMP/odd--upgrade.sql" 2>&1)
rc=$?
check "a DO block in an extension upgrade script stops the build, nothing written ($(tail -1 <<<"$out"))" \
    test "$rc" = 1 -a ! -e "$TMP/odd.sql" -a -n "$(grep -F 'odd--upgrade.sql:2: a statement of a kind' <<<"$out")"
printf '%s\n' "CREATE FUNCTION relay.f() RETURNS int AS 'MODULE_PATHNAME', 'f' LANGUAGE C;" \
    'ALTER TABLE relay.handlers ADD COLUMN note text;' 'DROP FUNCTION relay.g(int);' >"$TMP/ok--upgrade.sql"
bash "$RELAYBUS_ROOT/scripts/managed-upgrade.sh" "$FROM" "$MANAGED_VERSION" "$MANAGED_SCRIPT" "$TMP/ok.sql" \
    "$TMP/ok--upgrade.sql" 2>/dev/null
check_eq "its table changes and DROPs (IF EXISTS) are kept, its C definitions left out" \
    "ALTER TABLE relay.handlers ADD COLUMN note text;|DROP FUNCTION IF EXISTS relay.g(int);|0" \
    "$(sed -n '/^-- State/,/^-- Definitions/p' "$TMP/ok.sql" | grep -E '^(ALTER|DROP)' | paste -sd'|')|$(grep -c MODULE_PATHNAME "$TMP/ok.sql")"

bare_cluster || die "the cluster without relaybus did not start"
psql_q -U postgres -d postgres -c "CREATE ROLE $OWNER LOGIN CREATEROLE" \
    -c "CREATE DATABASE fresh OWNER $OWNER" \
    -c "CREATE DATABASE empty OWNER $OWNER" -c "CREATE ROLE app LOGIN" >/dev/null ||
    die "could not create the owner and its databases"
as_owner() { local db=$1; shift; psql -X -q -At -v ON_ERROR_STOP=1 -U "$OWNER" -d "$db" "$@" </dev/null; }
# run_script DB FILE [ROLE]: psql -1 -f; prints "rc|first error line".
run_script() {
    local out rc
    out=$(psql -X -q -1 -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -U "${3:-$OWNER}" -d "$1" -f "$2" 2>&1 </dev/null)
    rc=$?
    echo "$rc|$(grep -m1 -o 'ERROR:.*' <<<"$out")"
}

r=$(run_script fresh "$MANAGED_SCRIPT")
check_eq "a fresh install of $MANAGED_VERSION" "0|" "$r"
# Every object of the edition by name, with its definition and privileges.
catalog() {
    psql -X -q -At -v ON_ERROR_STOP=1 -U "$OWNER" -d "$1" <<'SQL'
SELECT 'function', p.oid::regprocedure, md5(pg_get_functiondef(p.oid)), p.provolatile, p.proisstrict,
       p.proparallel, p.prosecdef, p.procost, p.prorows, p.proconfig, p.proacl, p.proowner::regrole,
       obj_description(p.oid, 'pg_proc')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'relay' OR (n.nspname = 'public' AND p.proname LIKE 'relay\_%')
 ORDER BY 2;
SELECT 'relation', c.oid::regclass, c.relkind, c.relacl, c.relowner::regrole, c.relpersistence,
       obj_description(c.oid, 'pg_class'), CASE WHEN c.relkind = 'v' THEN md5(pg_get_viewdef(c.oid)) END,
       (SELECT string_agg(format('%s %s %s %s', a.attname, format_type(a.atttypid, a.atttypmod),
                                 a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid)), ', ' ORDER BY a.attnum)
          FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       (SELECT string_agg(pg_get_constraintdef(k.oid) || ' ' || k.conname, ', ' ORDER BY k.conname)
          FROM pg_constraint k WHERE k.conrelid = c.oid),
       (SELECT string_agg(pg_get_indexdef(i.indexrelid), ', ' ORDER BY 1) FROM pg_index i WHERE i.indrelid = c.oid),
       (SELECT string_agg(pg_get_triggerdef(t.oid), ', ' ORDER BY t.tgname)
          FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'relay' ORDER BY 2;
SELECT 'schema', n.nspname, n.nspacl, n.nspowner::regrole, obj_description(n.oid, 'pg_namespace')
  FROM pg_namespace n WHERE n.nspname = 'relay';
SQL
}

# upgrade_case FROM: an install of FROM (as released) with state, upgraded.
upgrade_case() {
    local FROM=$1 up="up_${1//./_}"
    local OLD_SCRIPT=$RELAYBUS_ROOT/test/fixtures/relaybus-managed--$FROM.sql
    local UPGRADE=$RELAYBUS_ROOT/build/relaybus-managed--$FROM--$MANAGED_VERSION.sql
    [[ -f "$UPGRADE" ]] || { fail "make managed built $UPGRADE"; return; }
    psql_q -U postgres -d postgres -c "CREATE DATABASE $up OWNER $OWNER" >/dev/null || die "database $up"
    # ---------------------------------------------------------------- $FROM with state
    r=$(run_script "$up" "$OLD_SCRIPT")
    check_eq "$FROM: the $FROM install runs as $OWNER" "0|" "$r"
    as_owner "$up" -c "SELECT relay_create_handler('pulled', 'pull', NULL, '{\"max_attempts\": 1}')" \
        -c "SELECT relay_route('orders.#', 'pulled')" \
        -c "SELECT relay_create_handler('fired', 'notify', 'orders_channel', '{}')" \
        -c "SELECT relay_route('orders.created', 'fired')" \
        -c "SELECT relay_publish('orders.created', jsonb_build_object('i', i), 'k' || (i % 2)) FROM generate_series(1, 6) i" \
        -c "SELECT relay_publish('orders.paid', '{}', 'k9', dedupe_key => 'once')" >/dev/null ||
        die "could not fill the $FROM install"
    # A dead letter (max_attempts 1), then a lease held across the upgrade.
    as_owner "$up" -c "SELECT relay_nack(id, 'bad', lease => lease) FROM relay_claim('pulled', 1)" >/dev/null
    held=$(as_owner "$up" -c "SELECT id || '|' || lease FROM relay_claim('pulled', 1, '10 min')")
    [[ "$held" == *"|"* ]] || die "no lease to hold across the upgrade: $held"
    before=$(as_owner "$up" -c "SELECT (SELECT count(*) FROM relay.deliveries) || ' ' || (SELECT count(*) FROM relay.dead_letters)
                                   || ' ' || (SELECT string_agg(key || '=' || seq, ',' ORDER BY key) FROM relay.key_seqs)
                                   || ' ' || (SELECT count(*) FROM relay.dedupe) || ' ' || (SELECT count(*) FROM relay.leases)")
    
    # ---------------------------------------------------------------- refusals
    r=$(run_script empty "$UPGRADE")
    check_eq "$FROM: upgrading a database without the edition: 42704, nothing created" \
        "3|ERROR:  42704: the relaybus managed edition is not installed in this database|0" \
        "$r|$(as_owner empty -c "SELECT count(*) FROM pg_namespace WHERE nspname = 'relay'")"
    # What records the version (0.2.0 and 0.3.0: nothing), before and after.
    recorded() { as_owner "$up" -c "SELECT coalesce(string_agg(prosrc, ''), 'none') FROM pg_proc WHERE proname = '_managed_version'"; }
    recorded_before=$(recorded)
    r=$(run_script "$up" "$UPGRADE" app)
    check "$FROM: upgrading as a role that does not own the objects fails (42501) and changes nothing" \
        test "${r%%|*}" != 0 -a -n "$(grep -F '42501' <<<"$r")" -a "$(recorded)" == "$recorded_before"
    
    # ---------------------------------------------------------------- upgrade
    r=$(run_script "$up" "$UPGRADE")
    check_eq "$FROM: the upgrade $FROM -> $MANAGED_VERSION runs as $OWNER (psql -1 -f)" "0|" "$r"
    check_eq "$FROM: the recorded version is $MANAGED_VERSION" "$MANAGED_VERSION" "$(as_owner "$up" -c "SELECT relay._managed_version()")"
    r=$(run_script "$up" "$UPGRADE")
    check_eq "$FROM: upgrading again: 55000, the version named" \
        "3|ERROR:  55000: relaybus managed edition $MANAGED_VERSION is installed; this script upgrades $FROM to $MANAGED_VERSION" "$r"
    
    catalog "$up" | LC_ALL=C sort >"$TMP/upgraded.cat"
    catalog fresh | LC_ALL=C sort >"$TMP/fresh.cat"
    check "$FROM: the catalogs hold the objects ($(wc -l <"$TMP/fresh.cat") rows)" test "$(wc -l <"$TMP/fresh.cat")" -gt 100
    check "$FROM: the upgraded catalog is the fresh install's (functions, views, tables, triggers, privileges, owners)" \
        diff "$TMP/fresh.cat" "$TMP/upgraded.cat"
    if ! diff -q "$TMP/fresh.cat" "$TMP/upgraded.cat" >/dev/null; then
        diff "$TMP/fresh.cat" "$TMP/upgraded.cat" | head -20 | sed 's/^/    /'
    fi
    
    # ---------------------------------------------------------------- the data kept, and going on
    check_eq "$FROM: deliveries, dead letters, key counters, dedupe keys and leases kept" "$before" \
        "$(as_owner "$up" -c "SELECT (SELECT count(*) FROM relay.deliveries) || ' ' || (SELECT count(*) FROM relay.dead_letters)
                                   || ' ' || (SELECT string_agg(key || '=' || seq, ',' ORDER BY key) FROM relay.key_seqs)
                                   || ' ' || (SELECT count(*) FROM relay.dedupe) || ' ' || (SELECT count(*) FROM relay.leases)")"
    check_eq "$FROM: the lease taken before the upgrade is acked after it" "1" \
        "$(as_owner "$up" -c "SELECT relay_ack(ARRAY[${held%%|*}]::bigint[], ARRAY['${held#*|}']::uuid[])")"
    check_eq "$FROM: a key's seq continues after the upgrade (k0: 4)" "4" \
        "$(as_owner "$up" -c "SELECT relay_publish('orders.created', '{}', 'k0')" \
                       -c "SELECT max(seq) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                            WHERE h.name = 'pulled' AND d.key = 'k0'" | tail -1)"
    n0=$(as_owner "$up" -c "SELECT count(*) FROM relay.deliveries")
    as_owner "$up" -c "SELECT relay_publish('orders.paid', '{}', 'k9', dedupe_key => 'once')" >/dev/null 2>&1
    check_eq "$FROM: the dedupe key still holds (the repeat publishes nothing)" "$n0" "$(as_owner "$up" -c "SELECT count(*) FROM relay.deliveries")"
    tp=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
    check_eq "$FROM: $MANAGED_VERSION's trace context works on the upgraded database (relay_claim's traceparent column)" \
        "0af7651916cd43dd8448eb211c80319c" \
        "$(as_owner "$up" -c "BEGIN" -c "SET LOCAL relaybus.traceparent = '$tp'" \
             -c "SELECT relay_publish('orders.traced', '{}', 'k5')" -c "COMMIT" \
             -c "SELECT split_part(traceparent, '-', 2) FROM relay_claim('pulled', 10) WHERE topic = 'orders.traced'" |
           tail -1)"
    check_eq "$FROM: the views answer with $MANAGED_VERSION's columns" "pulled|0" \
        "$(as_owner "$up" -c "SELECT handler, held_back FROM relay.handler_stats WHERE handler = 'pulled'")"
}

for from in 0.2.0 0.3.0 0.4.0 0.5.0; do upgrade_case "$from"; done

finish
