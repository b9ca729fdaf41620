#!/usr/bin/env bash
# A fresh CREATE EXTENSION relaybus (sql/relaybus--<current>.sql, built from
# sql/relaybus.sql) and an install of 0.1.0 updated with ALTER EXTENSION
# relaybus UPDATE give the same catalog: every object the extension creates,
# with its definition, privileges, comments and extension membership, its
# pg_extension_config_dump registrations and the roles it creates with their
# memberships.
#
# The objects are compared as pg_dump --schema-only --binary-upgrade prints them
# (the mode pg_upgrade uses: it prints every member of an extension with its
# ALTER EXTENSION ADD and its initial privileges, where a plain dump prints only
# CREATE EXTENSION), without the lines that differ between any two databases
# (object ids, relfilenodes, the oids of the config tables; the missing-value
# defaults of columns added by ALTER TABLE, which only describe rows older than
# the column), and as catalog rows (pg_proc, pg_class, pg_extension) that do not
# depend on how pg_dump prints them. The roles are cluster-wide, so the test
# runs in a cluster of its own and drops them between the two installs.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_SH=$RELAYBUS_ROOT/test/cluster.sh
base=$(mktemp -d /tmp/relaybus-catalog.XXXXXX)  # outside $TMP (mode 700): postgres must reach it
chmod 755 "$base"
eval "lib_$(declare -f cleanup)"
cleanup() {
    bash "$CLUSTER_SH" destroy "$base/cluster" >/dev/null 2>&1
    rm -rf "$base"
    lib_cleanup
}

RELAYBUS_PRELOAD=relaybus RELAYBUS_EXTRA_CONF="relaybus.enabled = off" \
    bash "$CLUSTER_SH" start "$base/cluster" >"$TMP/cluster.out" 2>&1 || die "cluster: $(cat "$TMP/cluster.out")"
source "$base/cluster/env"

current=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$RELAYBUS_ROOT/relaybus.control")

# Catalog rows of every object the extension owns, by name (never by oid).
catalog_rows() {
    psql -X -q -At -v ON_ERROR_STOP=1 -d "$1" <<'SQL'
SELECT 'function', p.oid::regprocedure, pg_get_functiondef(p.oid), p.provolatile, p.proisstrict,
       p.proparallel, p.prosecdef, p.proleakproof, p.procost, p.prorows, p.proconfig, p.proacl,
       obj_description(p.oid, 'pg_proc')
  FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'relaybus')
 ORDER BY p.oid::regprocedure::text;
SELECT 'relation', c.oid::regclass, c.relkind, c.relacl, c.reloptions, obj_description(c.oid, 'pg_class'),
       CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) END,
       (SELECT string_agg(format('%s %s %s %s %s', a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
                                 a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid)), ', ' ORDER BY a.attnum)
          FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       (SELECT string_agg(pg_get_constraintdef(k.oid) || ' ' || k.conname, ', ' ORDER BY k.conname)
          FROM pg_constraint k WHERE k.conrelid = c.oid),
       (SELECT string_agg(pg_get_indexdef(i.indexrelid), ', ' ORDER BY 1)
          FROM pg_index i WHERE i.indrelid = c.oid),
       (SELECT string_agg(pg_get_triggerdef(t.oid), ', ' ORDER BY t.tgname)
          FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'relay' ORDER BY c.oid::regclass::text;
SELECT 'config_dump', x.cfg::regclass, x.cond
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS x(cfg, cond)
 WHERE e.extname = 'relaybus' ORDER BY x.cfg::regclass::text;
SELECT 'extension', e.extversion, e.extrelocatable, e.extnamespace::regnamespace, n.nspacl,
       obj_description(n.oid, 'pg_namespace')
  FROM pg_extension e, pg_namespace n WHERE e.extname = 'relaybus' AND n.nspname = 'relay';
SELECT 'init_privs', pg_describe_object(i.classoid, i.objoid, i.objsubid), i.privtype, i.initprivs
  FROM pg_init_privs i ORDER BY 2, 3;
SQL
}

# The relay_* roles: attributes and memberships.
role_rows() {
    psql -X -q -At -v ON_ERROR_STOP=1 -d postgres <<'SQL'
SELECT 'role', r.rolname, r.rolsuper, r.rolinherit, r.rolcreaterole, r.rolcreatedb, r.rolcanlogin,
       r.rolreplication, r.rolbypassrls, r.rolconnlimit
  FROM pg_roles r WHERE r.rolname LIKE 'relay\_%' ORDER BY 2;
SELECT 'member', g.rolname, m.rolname, a.admin_option
  FROM pg_auth_members a JOIN pg_roles g ON g.oid = a.roleid JOIN pg_roles m ON m.oid = a.member
 WHERE g.rolname LIKE 'relay\_%' OR m.rolname LIKE 'relay\_%' ORDER BY 2, 3;
SQL
}

# The binary-upgrade dump without what differs between any two databases.
dump() {
    pg_dump --schema-only --binary-upgrade -d "$1" 2>&1 \
        | grep -v -e 'binary_upgrade_set_next_' -e 'binary_upgrade_set_missing_value' -e '^-- set missing value' \
                  -e '^SET relfrozenxid = ' -e "^WHERE oid = '[0-9]*';\$" -e '^\\restrict ' -e '^\\unrestrict ' \
        | sed -E "/binary_upgrade_create_empty_extension/s/'\{[0-9,]*\}'/'{CONFIG OIDS}'/" | cat -s
}

# snapshot DB NAME: $TMP/NAME.dump, .catalog and .roles.
snapshot() {
    dump "$1" >"$TMP/$2.dump"
    catalog_rows "$1" >"$TMP/$2.catalog" 2>&1
    role_rows >"$TMP/$2.roles" 2>&1
}

drop_roles() {
    psql_q -d postgres -c "DROP ROLE relay_admin" -c "DROP ROLE relay_monitor" \
        -c "DROP ROLE relay_publisher" -c "DROP ROLE relay_consumer"
}

# differs WHAT A B: one assertion that files A and B are equal, the diff if not.
same() {
    local d
    d=$(diff -u "$TMP/$2" "$TMP/$3")
    if [[ -z "$d" ]]; then pass "$1"; else fail "$1" "$(head -c 6000 <<<"$d")"; fi
}

log "fresh install of $current"
psql_q -d postgres -c "CREATE DATABASE cat_fresh" || die "CREATE DATABASE"
psql_q -d cat_fresh -c "CREATE EXTENSION relaybus" || die "CREATE EXTENSION"
check_eq "the fresh install is $current" "$current" "$(psql_q -d cat_fresh -c \
    "SELECT extversion FROM pg_extension WHERE extname = 'relaybus'")"
snapshot cat_fresh fresh
check "the dump of the fresh install names the extension's objects" \
    grep -q "ALTER EXTENSION relaybus ADD FUNCTION public.relay_nack" "$TMP/fresh.dump"
check "the catalog rows were read" grep -q '^function|relay_publish' "$TMP/fresh.catalog"
check "the fresh install created the four roles" test "$(grep -c '^role|' "$TMP/fresh.roles")" = 4

# The comparison must see a change of one definition (guards the filters).
psql_q -d cat_fresh -c "ALTER FUNCTION relay_payload(bigint) VOLATILE" || die "ALTER FUNCTION"
dump cat_fresh >"$TMP/altered.dump"
catalog_rows cat_fresh >"$TMP/altered.catalog" 2>&1
check "the dump comparison sees one function's volatility changed" \
    bash -c "! diff -q '$TMP/fresh.dump' '$TMP/altered.dump'"
check "the catalog comparison sees it too" bash -c "! diff -q '$TMP/fresh.catalog' '$TMP/altered.catalog'"

psql_q -d postgres -c "DROP DATABASE cat_fresh WITH (FORCE)" || die "DROP DATABASE"
drop_roles || die "could not drop the roles"

log "0.1.0, then ALTER EXTENSION relaybus UPDATE"
psql_q -d postgres -c "CREATE DATABASE cat_updated" || die "CREATE DATABASE"
psql_q -d cat_updated -c "CREATE EXTENSION relaybus VERSION '0.1.0'" -c "ALTER EXTENSION relaybus UPDATE" \
    || die "0.1.0 + update"
snapshot cat_updated updated

same "pg_dump --schema-only --binary-upgrade: the same objects, definitions, privileges and comments" \
    fresh.dump updated.dump
same "pg_proc, pg_class, pg_extension, pg_init_privs: the same rows" fresh.catalog updated.catalog
same "the same roles and memberships" fresh.roles updated.roles
finish
