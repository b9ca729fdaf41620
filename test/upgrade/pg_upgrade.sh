#!/usr/bin/env bash
# pg_upgrade from one PostgreSQL major to a newer one with relaybus inside
# (docs/DESIGN guarantee 11; the procedure it follows: docs/operations.md,
# "PostgreSQL major upgrade (pg_upgrade)").
#
#   bash test/upgrade/pg_upgrade.sh OLD NEW        e.g. 15 17 (Debian 13 root), 15 18 (sid root)
#
# As root on Debian; both majors' binaries in one system (Debian's
# /usr/lib/postgresql/NN). Steps:
#   deps     scripts/install-deps.sh with RELAYBUS_DEPS=server PG=NEW
#            RELAYBUS_UPGRADE_FROM=OLD (idempotent: installs only what is missing;
#            PostgreSQL 15 on Debian 13/sid comes from bookworm, pinned low)
#   build    relaybus built and installed for each major, each in its own tree
#            under test/upgrade/build/pgNN (git-ignored, kept: incremental)
#   old      a cluster of OLD (test/cluster.sh) preloading relaybus; a database
#            with handlers of every kind (notify ack / fire-and-forget, http with
#            a secret and headers, pull, kafka; two paused), routes with wire
#            names, roles, ALTER SYSTEM / ALTER DATABASE / ALTER ROLE settings,
#            and, with the dispatchers off (relaybus.enabled = off), a backlog of
#            ready, leased (claimed, not acked), retrying, delayed and
#            dead-lettered deliveries, 20 keys x 10 events half acked
#   upgrade  the old cluster stopped; a new cluster initdb'd with relaybus in
#            shared_preload_libraries and the old relaybus.* lines of
#            postgresql.conf and postgresql.auto.conf; pg_upgrade --check, then
#            pg_upgrade --link (RELAYBUS_UPGRADE_MODE=copy for --copy)
#   new      the same catalog and rows (pg_dump of both, by the new pg_dump),
#            deliveries and dead letters by state, settings; leases gone and
#            the leased deliveries claimed again; new publishes continue every
#            key's seq (previous max + 1); the dispatchers deliver the notify
#            backlog to LISTEN clients in key order; pull consumers drain the
#            rest with relay_claim / relay_ack in key order
# Everything it starts (clusters, clients, temp dirs) is removed on exit; the
# last line is "N passed, N failed".
#
# Environment: RELAYBUS_UPGRADE_MODE (link | copy; default link),
# RELAYBUS_UPGRADE_BUILD=0 (use the relaybus installed for both majors as is;
# skips deps and build), RELAYBUS_UPGRADE_DELAY (seconds the delayed
# deliveries wait; default 30).
set -uo pipefail

OLD=${1:-}
NEW=${2:-}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
MODE=${RELAYBUS_UPGRADE_MODE:-link}
DELAY=${RELAYBUS_UPGRADE_DELAY:-30}

if [[ ! "$OLD" =~ ^[0-9]+$ || ! "$NEW" =~ ^[0-9]+$ ]] || ((OLD >= NEW)); then
    echo "usage: $0 OLD NEW   (PostgreSQL majors, OLD < NEW, e.g. 15 17)" >&2
    exit 2
fi
case "$MODE" in link | copy) ;; *) echo "RELAYBUS_UPGRADE_MODE must be link or copy" >&2; exit 2 ;; esac
((EUID == 0)) || { echo "$0: run as root (the clusters run as user postgres)" >&2; exit 2; }

OLD_PGC=$(PG=$OLD PG_CONFIG= bash "$ROOT/scripts/pg-config.sh") || exit 2
NEW_PGC=$(PG=$NEW PG_CONFIG= bash "$ROOT/scripts/pg-config.sh") || exit 2
OLD_BIN=$(dirname "$OLD_PGC")
NEW_BIN=$(dirname "$NEW_PGC")

# Clusters and pg_upgrade's working directory: outside lib.sh's $TMP (mode
# 700), since user postgres must reach them; both on one file system (--link).
BASE=$(mktemp -d /tmp/relaybus-pgup.XXXXXX)
chmod 755 "$BASE"
OLDC=$BASE/old
NEWC=$BASE/new
WORK=$BASE/work
T_START=$(date +%s)

early_log() { printf '# [pg_upgrade %ds] %s\n' $(($(date +%s) - T_START)) "$*"; }
early_fail() {
    echo "FAIL - $1"
    shift
    (($# > 0)) && printf '    %s\n' "$@"
    bash "$ROOT/test/cluster.sh" destroy "$OLDC" >/dev/null 2>&1
    rm -rf "$BASE"
    echo "0 passed, 1 failed"
    exit 1
}

# ---------------------------------------------------------------- deps and build
# build_install MAJOR PG_CONFIG: builds relaybus in test/upgrade/build/pgMAJOR
# (a copy of the sources: PGXS builds in the source tree, and two majors'
# objects must not mix) and installs it into that major.
build_install() {
    local major=$1 pgc=$2 dir=$ROOT/test/upgrade/build/pg$1 list f
    mkdir -p "$dir"
    list=$(cd "$ROOT" && find Makefile relaybus.control sql src/core src/pg scripts/check-boundary.sh -type f \
        ! -name '*.o' ! -name '*.d' ! -name '*.so' ! -name '*.bc' ! -name '.boundary-checked' | sort)
    # Sources deleted since the last build must not be built from the copy.
    while IFS= read -r f; do
        grep -qxF "$f" <<<"$list" || rm -f "$dir/$f"
    done < <(cd "$dir" && find sql src -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.sql' \) 2>/dev/null | sort)
    # tar keeps the sources' mtimes: make rebuilds only what changed.
    (cd "$ROOT" && tar -cf - $list) | tar -xf - -C "$dir" || return 1
    make -C "$dir" -s -j"$(nproc)" PG_CONFIG="$pgc" >"$dir.log" 2>&1 &&
        make -C "$dir" -s PG_CONFIG="$pgc" install >>"$dir.log" 2>&1
}

if [[ "${RELAYBUS_UPGRADE_BUILD:-1}" != 0 ]]; then
    early_log "deps: PostgreSQL $NEW and $OLD (scripts/install-deps.sh, RELAYBUS_UPGRADE_FROM=$OLD)"
    RELAYBUS_DEPS=server PG=$NEW PG_CONFIG= RELAYBUS_UPGRADE_FROM=$OLD bash "$ROOT/scripts/install-deps.sh" \
        >"$BASE/deps.log" 2>&1 || early_fail "install-deps" "$(tail -n 20 "$BASE/deps.log")"
    for m in "$OLD" "$NEW"; do
        early_log "build: relaybus for PostgreSQL $m (test/upgrade/build/pg$m)"
        pgc=$OLD_PGC
        [[ $m == "$NEW" ]] && pgc=$NEW_PGC
        build_install "$m" "$pgc" ||
            early_fail "relaybus builds and installs for PostgreSQL $m" "$(tail -n 30 "$ROOT/test/upgrade/build/pg$m.log")"
    done
fi
for pgc in "$OLD_PGC" "$NEW_PGC"; do
    [[ -f "$("$pgc" --pkglibdir)/relaybus.so" ]] || early_fail "relaybus is installed for $("$pgc" --version)"
done

# ---------------------------------------------------------------- the old cluster
early_log "old: a PostgreSQL $OLD cluster in $OLDC"
export RELAYBUS_PRELOAD=relaybus
PG_CONFIG=$OLD_PGC RELAYBUS_EXTRA_CONF="relaybus.max_leases = 4096" \
    bash "$ROOT/test/cluster.sh" start "$OLDC" >"$BASE/old-start.log" 2>&1 ||
    early_fail "the PostgreSQL $OLD cluster starts" "$(tail -n 30 "$BASE/old-start.log")"
# shellcheck disable=SC1091
source "$OLDC/env"

# lib.sh: check/check_eq/finish, the LISTEN client, deliveries.py. Its psql is
# the new major's (it talks to both servers).
export PG_CONFIG=$NEW_PGC RELAYBUS_ROOT=$ROOT
# shellcheck source=../integration/lib.sh
source "$ROOT/test/integration/lib.sh"
T0=$((T_START * 1000000000))

# Everything is removed on exit: lib.sh's cleanup (clients, $TMP), then the clusters.
eval "lib_cleanup() $(declare -f cleanup | tail -n +2)"
cleanup() {
    lib_cleanup
    bash "$ROOT/test/cluster.sh" destroy "$NEWC" >/dev/null 2>&1
    bash "$ROOT/test/cluster.sh" destroy "$OLDC" >/dev/null 2>&1
    rm -rf "$BASE"
}

DB=shop
SECRET="whsec_$(printf '0123456789abcdef01234567' | base64)"
sql postgres "CREATE DATABASE $DB" "CREATE ROLE app LOGIN" >/dev/null || die "could not create $DB"
sql "$DB" "CREATE EXTENSION relaybus" "GRANT relay_publisher, relay_consumer TO app" \
    "ALTER DATABASE $DB SET relaybus.dedupe_window = '1h'" \
    "ALTER DATABASE $DB SET relaybus.max_key_bytes = 256" \
    "ALTER ROLE app IN DATABASE $DB SET relaybus.dedupe_window = '10min'" >/dev/null ||
    die "could not install relaybus"
# The dispatchers stay off until the new cluster runs (docs/operations.md,
# "Stopping delivery"): the backlog must reach the upgrade undelivered.
sql postgres "ALTER SYSTEM SET relaybus.enabled = off" "ALTER SYSTEM SET relaybus.batch_size = 200" \
    "ALTER SYSTEM SET relaybus.http_allowlist = '127.0.0.1'" "SELECT pg_reload_conf()" >/dev/null ||
    die "ALTER SYSTEM"
no_dispatcher() { [[ -z $(dispatcher_pids "$DB") ]]; }
wait_until 20 no_dispatcher || die "the dispatchers did not stop"

log "old: handlers of every kind, routes with wire names"
sql "$DB" \
    "SELECT relay_create_handler('n_ff', 'notify', 'up_ff', '{\"ack\": false}')" \
    "SELECT relay_route('order.*', 'n_ff', 'orders')" \
    "SELECT relay_create_handler('n_ack', 'notify', 'up_ack', '{\"ack\": true, \"lease\": \"20s\"}')" \
    "SELECT relay_route('invoice.#', 'n_ack', 'invoices')" \
    "SELECT relay_create_handler('h_http', 'http', 'http://127.0.0.1:9/hooks/billing',
        jsonb_build_object('secret', '$SECRET', 'headers', '{\"X-Tenant\": \"t1\"}'::jsonb,
                           'timeout', '2s', 'max_attempts', 3))" \
    "SELECT relay_route('billing.#', 'h_http', 'billing_events')" \
    "SELECT relay_create_handler('k_kafka', 'kafka', 'kafka://127.0.0.1:9/relay-audit',
        '{\"timeout\": \"5s\", \"producer\": {\"linger.ms\": \"5\"}}')" \
    "SELECT relay_route('audit.#', 'k_kafka')" \
    "SELECT relay_create_handler('p_keys', 'pull', NULL, '{\"max_attempts\": 5, \"backoff_base\": \"2s\"}')" \
    "SELECT relay_route('stock.#', 'p_keys', 'stock_events')" \
    "SELECT relay_create_handler('p_dead', 'pull', NULL, '{\"max_attempts\": 1}')" \
    "SELECT relay_route('mail.#', 'p_dead')" \
    "SELECT relay_pause_handler('h_http')" "SELECT relay_pause_handler('k_kafka')" >/dev/null ||
    die "could not create the handlers"
create_pub_log "$DB"
sql "$DB" "CREATE TABLE leased_before (id bigint PRIMARY KEY, handler text, lease uuid)" \
    "CREATE TABLE drained (n serial PRIMARY KEY, id bigint, key text, seq bigint, topic text, attempt int,
                           at timestamptz DEFAULT clock_timestamp())" \
    >/dev/null || die "could not create the test's tables"

log "old: the backlog"
sql "$DB" \
    "INSERT INTO pub_log SELECT relay_publish('order.created', jsonb_build_object('n', g), 'o-' || (g % 10)), 'o-' || (g % 10)
       FROM generate_series(0, 199) g" \
    "INSERT INTO pub_log SELECT relay_publish('order.late', jsonb_build_object('n', g), 'o-late-' || g,
       not_before => now() + interval '$DELAY seconds'), 'o-late-' || g FROM generate_series(1, 3) g" \
    "INSERT INTO pub_log SELECT relay_publish('invoice.issued', jsonb_build_object('n', g), 'i-' || (g % 5)), 'i-' || (g % 5)
       FROM generate_series(0, 49) g" \
    "SELECT relay_publish('stock.moved', jsonb_build_object('n', g), 's-' || lpad((g % 20)::text, 2, '0'))
       FROM generate_series(0, 199) g" \
    "SELECT relay_publish('mail.sent', jsonb_build_object('n', g), 'm-' || g) FROM generate_series(1, 4) g" \
    "SELECT relay_publish('billing.charged', jsonb_build_object('n', g), 'b-1') FROM generate_series(1, 3) g" \
    "SELECT relay_publish('audit.logged', jsonb_build_object('n', g), 'a-1') FROM generate_series(1, 3) g" \
    >/dev/null || die "could not publish"
# Half of every stock key consumed: seqs 1-5 of each of the 20 keys claimed and acked.
check_eq "a pull consumer claims and acks seqs 1-5 of the 20 keys" "100|100|100" \
    "$(sql "$DB" "WITH c AS (SELECT * FROM relay_claim('p_keys', 100, per_key => 5))
                  SELECT count(*), count(*) FILTER (WHERE seq <= 5), relay_ack(array_agg(id), array_agg(lease)) FROM c")"
# Leased and never acked: the heads (seq 6) of 8 stock keys, and 5 invoice
# heads taken from the ack-mode notify handler, with leases far longer than the test.
sql "$DB" \
    "INSERT INTO leased_before SELECT id, 'p_keys', lease FROM relay_claim('p_keys', 8, lease => '10 min')" \
    "INSERT INTO leased_before SELECT id, 'n_ack', lease FROM relay_claim('n_ack', 5, lease => '10 min')" >/dev/null ||
    die "could not lease"
# Retrying: one stock head failed once (ready again at once); dead letters:
# three mail deliveries failed for good, one cancelled.
sql "$DB" \
    "SELECT relay_nack(id, 'downstream said no', retry_in => '0 s', lease => lease)
       FROM relay_claim('p_keys', 1)" \
    "SELECT relay_nack(id, 'mailbox full', lease => lease) FROM relay_claim('p_dead', 3, per_key => 1)" \
    "SELECT relay_cancel(array_agg(id)) FROM relay.deliveries
       WHERE handler_id = (SELECT id FROM relay.handlers WHERE name = 'p_dead')" >/dev/null ||
    die "could not fail deliveries"
# Unkeyed (one with a dedupe key) and delayed stock events, after the claims above.
sql "$DB" \
    "SELECT relay_publish('stock.counted', jsonb_build_object('n', g)) FROM generate_series(1, 5) g" \
    "SELECT relay_publish('stock.counted', '{\"n\": 6}', dedupe_key => 'count-6')" \
    "SELECT relay_publish('stock.later', jsonb_build_object('n', g), 'sd-' || g,
       not_before => now() + interval '$DELAY seconds') FROM generate_series(1, 2) g" \
    "CREATE TABLE delayed_before AS SELECT id, not_before FROM relay.deliveries
       WHERE not_before > published_at AND attempt = 0" \
    >/dev/null || die "could not publish the unkeyed and delayed events"
sql "$DB" "CREATE TABLE seq_before AS SELECT key, seq FROM relay.key_seqs" \
    "CREATE TABLE ids_before AS SELECT (SELECT last_value FROM relay.event_id_seq) AS event_id,
                                       (SELECT last_value FROM relay.delivery_id_seq) AS delivery_id" >/dev/null ||
    die "could not note the counters"

# state(): deliveries by handler and state, and dead letters by handler and reason.
STATE_Q="SELECT string_agg(x, ' ' ORDER BY x) FROM (
    SELECT st || '=' || count(*) AS x FROM (
      SELECT h.name || ':' || CASE WHEN l.delivery_id IS NOT NULL THEN 'leased'
                                   WHEN d.attempt > 0 THEN 'retrying'
                                   WHEN d.not_before > d.published_at THEN 'delayed'
                                   ELSE 'ready' END AS st
        FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
        LEFT JOIN relay._leases() l ON l.delivery_id = d.id) s GROUP BY st
    UNION ALL
    SELECT handler || ':dead_' || reason || '=' || count(*) FROM relay.dead_letters GROUP BY handler, reason) s"
# The same with leased counted as ready: what a restart makes of them.
STATE_NOLEASE_Q=$(sed 's/WHEN l.delivery_id IS NOT NULL THEN .leased.//' <<<"$STATE_Q")
SETTINGS_Q="SELECT string_agg(name || '=' || setting || '(' || source || ')', ' ' ORDER BY name)
              FROM pg_settings WHERE name LIKE 'relaybus.%' AND source <> 'default'"
CAT_Q="SELECT (SELECT extversion FROM pg_extension WHERE extname = 'relaybus'),
              (SELECT count(*) FROM relay.handlers), (SELECT count(*) FROM relay.routes),
              (SELECT count(*) FROM relay.deliveries), (SELECT count(*) FROM relay.dead_letters),
              (SELECT count(*) FROM relay.key_seqs), (SELECT count(*) FROM relay.dedupe)"
HANDLERS_Q="SELECT string_agg(name || ' ' || kind || ' ' || coalesce(target, '-') || ' ' || options::text
                              || ' secrets=' || coalesce(array_length(secrets, 1), 0) || ' paused=' || paused, E'\n' ORDER BY id)
              FROM relay.handlers"
ROUTES_Q="SELECT string_agg(pattern || '->' || h.name || '/' || coalesce(wire_name, '-'), ' ' ORDER BY pattern)
            FROM relay.routes r JOIN relay.handlers h ON h.id = r.handler_id"

state_before=$(sql "$DB" "$STATE_Q")
state_before_nolease=$(sql "$DB" "$STATE_NOLEASE_Q")
log "old: deliveries by state: $state_before"
check_eq "the backlog by state (13 leased, 1 retrying, 5 delayed, 3 + 1 dead)" \
    "h_http:ready=3 k_kafka:ready=3 n_ack:leased=5 n_ack:ready=45 n_ff:delayed=3 n_ff:ready=200 p_dead:dead_cancelled=1 p_dead:dead_failed=3 p_keys:delayed=2 p_keys:leased=8 p_keys:ready=97 p_keys:retrying=1" \
    "$state_before"
check_eq "13 leases held in shared memory" 13 "$(sql "$DB" "SELECT count(*) FROM relay._leases()")"
cat_before=$(sql "$DB" "$CAT_Q")
handlers_before=$(sql "$DB" "$HANDLERS_Q")
routes_before=$(sql "$DB" "$ROUTES_Q")
settings_before=$(sql "$DB" "$SETTINGS_Q")
settings_app_before=$(psql_q -U app -d "$DB" -c "$SETTINGS_Q")
seqs_before=$(sql "$DB" "SELECT string_agg(key || '=' || seq, ',' ORDER BY key) FROM relay.key_seqs")
log "old: catalog (extversion|handlers|routes|deliveries|dead|keys|dedupe): $cat_before"
log "old: settings: $settings_before; as app: $settings_app_before"
log "old: key seqs: $seqs_before"
"$NEW_BIN/pg_dump" -C -f "$TMP/dump_before.sql" -d "$DB" || die "pg_dump of the old cluster"
"$NEW_BIN/pg_dumpall" -g -f "$TMP/globals_before.sql" || die "pg_dumpall -g of the old cluster"

# ---------------------------------------------------------------- pg_upgrade
log "upgrade: stop the PostgreSQL $OLD cluster (its leases die with it)"
check "the old cluster stops (fast shutdown)" bash "$ROOT/test/cluster.sh" stop "$OLDC"
log "upgrade: a PostgreSQL $NEW cluster, relaybus in shared_preload_libraries"
initdb_opts=
# 18's initdb enables data checksums; pg_upgrade needs the old cluster's setting.
[[ $(sed -n 's/^Data page checksum version: *//p' < <("$OLD_BIN/pg_controldata" "$OLDC/data")) == 0 ]] &&
    ((NEW >= 18)) && initdb_opts=--no-data-checksums
PG_CONFIG=$NEW_PGC RELAYBUS_INITDB_OPTS=$initdb_opts bash "$ROOT/test/cluster.sh" start "$NEWC" >"$TMP/new-start.log" 2>&1 &&
    PG_CONFIG=$NEW_PGC bash "$ROOT/test/cluster.sh" stop "$NEWC" >>"$TMP/new-start.log" 2>&1 ||
    die "the new cluster: $(tail -n 20 "$TMP/new-start.log")"
# The settings are not in the data pg_upgrade moves: the operator carries the
# relaybus.* lines of postgresql.conf and postgresql.auto.conf (ALTER SYSTEM).
for f in postgresql.conf postgresql.auto.conf; do
    grep -E '^[[:space:]]*relaybus\.' "$OLDC/data/$f" >>"$NEWC/data/$f"
done
check "the new cluster's postgresql.conf preloads relaybus" \
    grep -qE "^shared_preload_libraries = '([^']*,)?relaybus(,[^']*)?'" "$NEWC/data/postgresql.conf"
log "upgrade: carried: $(grep -hE '^[[:space:]]*relaybus\.' "$NEWC/data/postgresql.conf" "$NEWC/data/postgresql.auto.conf" | tr '\n' ';')"

mkdir -p "$WORK"
chown postgres:postgres "$WORK"
old_port=$(sed -n 's/^port = \([0-9]*\)$/\1/p' "$OLDC/data/postgresql.conf" | tail -n 1)
new_port=$(sed -n 's/^port = \([0-9]*\)$/\1/p' "$NEWC/data/postgresql.conf" | tail -n 1)
# pg_upgrade starts each server (with -b, binary upgrade mode) a few times.
# relaybus.enabled = on there (-o/-O), whatever the configuration files say:
# relaybus must not run its workers in binary upgrade mode by itself, since a
# dispatcher there would deliver (and delete) deliveries while pg_upgrade reads
# the old cluster and moves its files.
pg_upgrade_run() {
    (cd "$WORK" && runuser -u postgres -- "$NEW_BIN/pg_upgrade" -b "$OLD_BIN" -B "$NEW_BIN" \
        -d "$OLDC/data" -D "$NEWC/data" -p "$old_port" -P "$new_port" -s "$WORK" -U postgres \
        -o "-c relaybus.enabled=on" -O "-c relaybus.enabled=on" "$@")
}
log "upgrade: pg_upgrade --check with the new cluster not preloading relaybus"
pg_upgrade_run --check -O "-c shared_preload_libraries=''" >"$TMP/check-nopreload.out" 2>&1
rc=$?
libs=$(find "$NEWC/data/pg_upgrade_output.d" -name loadable_libraries.txt 2>/dev/null | head -n 1)
log "upgrade: it said: $(grep -m1 -i 'loadable libraries' "$TMP/check-nopreload.out"); $(cat "$libs" 2>/dev/null | tr '\n' ' ' | cut -c1-200)"
check "it fails, naming relaybus's library" test "$rc" -ne 0 -a -n "$libs" -a "$(grep -c relaybus "$libs" 2>/dev/null)" -gt 0
rm -rf "$NEWC/data/pg_upgrade_output.d"
log "upgrade: pg_upgrade --check"
pg_upgrade_run --check >"$TMP/check.out" 2>&1
rc=$?
check_eq "pg_upgrade --check passes" 0 "$rc"
((rc == 0)) || cat "$TMP/check.out"
check "it found the clusters compatible" grep -q 'Clusters are compatible' "$TMP/check.out"
log "upgrade: pg_upgrade --$MODE $OLD -> $NEW"
t=$(date +%s)
pg_upgrade_run --"$MODE" --retain >"$TMP/upgrade.out" 2>&1
rc=$?
log "upgrade: pg_upgrade took $(($(date +%s) - t)) s: $(grep -m1 'Upgrade Complete' "$TMP/upgrade.out")"
check_eq "pg_upgrade --$MODE passes" 0 "$rc"
if ((rc != 0)); then
    tail -n 30 "$TMP/upgrade.out"
    for f in $(find "$NEWC/data/pg_upgrade_output.d" -name '*.log' 2>/dev/null); do
        echo "---- $f"; tail -n 20 "$f"
    done
    die "pg_upgrade failed"
fi
# Its servers (started with -b) ran no relaybus worker: nothing was delivered
# or written while the files moved.
upgrade_logs=$(find "$NEWC/data/pg_upgrade_output.d" -name 'pg_upgrade_server*.log' 2>/dev/null)
log "upgrade: relaybus worker lines in pg_upgrade's server logs: $(cat $upgrade_logs /dev/null | grep -cE 'relaybus (launcher|dispatcher)')"
check "no relaybus worker (launcher, dispatcher) ran in pg_upgrade's servers, relaybus.enabled on" \
    bash -c "! cat $upgrade_logs /dev/null | grep -qE 'relaybus (launcher|dispatcher)'"
rm -rf "$NEWC/data/pg_upgrade_output.d"

# ---------------------------------------------------------------- the new cluster
log "new: start PostgreSQL $NEW"
PG_CONFIG=$NEW_PGC bash "$ROOT/test/cluster.sh" start "$NEWC" >"$TMP/new-start2.log" 2>&1 ||
    die "the upgraded cluster does not start: $(tail -n 30 "$TMP/new-start2.log")"
# shellcheck disable=SC1091
source "$NEWC/env"
check_eq "the server is PostgreSQL $NEW, relaybus preloaded" "$NEW|relaybus" \
    "$(sql "$DB" "SELECT current_setting('server_version_num')::int / 10000, current_setting('shared_preload_libraries')")"
check_eq "the extension's version is unchanged" "${cat_before%%|*}" \
    "$(sql "$DB" "SELECT extversion FROM pg_extension WHERE extname = 'relaybus'")"
check_eq "catalog counts (extversion|handlers|routes|deliveries|dead|keys|dedupe)" "$cat_before" "$(sql "$DB" "$CAT_Q")"
check_eq "every handler, kind, target, option, secret and pause" "$handlers_before" "$(sql "$DB" "$HANDLERS_Q")"
check_eq "every route and wire name" "$routes_before" "$(sql "$DB" "$ROUTES_Q")"
check_eq "the http handler's secret itself" "{$SECRET}" \
    "$(sql "$DB" "SELECT secrets FROM relay.handlers WHERE name = 'h_http'")"
check_eq "settings (ALTER SYSTEM carried, ALTER DATABASE kept)" "$settings_before" "$(sql "$DB" "$SETTINGS_Q")"
check_eq "settings of role app in $DB (ALTER ROLE ... IN DATABASE kept)" "$settings_app_before" \
    "$(psql_q -U app -d "$DB" -c "$SETTINGS_Q")"
"$NEW_BIN/pg_dump" -C -f "$TMP/dump_after.sql" -d "$DB" || fail "pg_dump of the new cluster"
"$NEW_BIN/pg_dumpall" -g -f "$TMP/globals_after.sql" || fail "pg_dumpall -g of the new cluster"
# A dump names the server's version and (17.6+, 18) a random \restrict key.
# From 16 on, pg_dumpall writes a role membership's options (inherit, grantor)
# that a 15 server leaves implicit.
dump_filter() {
    grep -vE '^-- Dumped from database version|^\\(un)?restrict ' "$1" |
        sed -E 's/^(GRANT [a-z_]+ TO [a-z_]+)( WITH INHERIT TRUE)?( GRANTED BY postgres)?;$/\1;/'
}
check "pg_dump of $DB: the same before and after (catalog, rows, sequences, grants)" \
    diff <(dump_filter "$TMP/dump_before.sql") <(dump_filter "$TMP/dump_after.sql")
check "pg_dumpall --globals-only: the same roles, memberships and role settings" \
    diff <(dump_filter "$TMP/globals_before.sql") <(dump_filter "$TMP/globals_after.sql")
log "new: dump of $DB: $(wc -l <"$TMP/dump_after.sql") lines, $(grep -c '^COPY ' "$TMP/dump_after.sql") tables' data"

state_after=$(sql "$DB" "$STATE_Q")
log "new: deliveries by state: $state_after"
check_eq "nothing lost: deliveries and dead letters by state (the leased ones now ready)" \
    "$state_before_nolease" "$state_after"
check_eq "no lease survived the restart" 0 "$(sql "$DB" "SELECT count(*) FROM relay._leases()")"
check_eq "key counters unchanged" "$seqs_before" \
    "$(sql "$DB" "SELECT string_agg(key || '=' || seq, ',' ORDER BY key) FROM relay.key_seqs")"

log "new: publishes continue every key's seq"
sql "$DB" \
    "INSERT INTO pub_log SELECT relay_publish('order.created', jsonb_build_object('n', 1000 + g), 'o-' || g), 'o-' || g
       FROM generate_series(0, 9) g" \
    "INSERT INTO pub_log SELECT relay_publish('invoice.issued', jsonb_build_object('n', 1000 + g), 'i-' || g), 'i-' || g
       FROM generate_series(0, 4) g" \
    "SELECT relay_publish('stock.moved', jsonb_build_object('n', 1000 + g), 's-' || lpad(g::text, 2, '0'))
       FROM generate_series(0, 19) g" >/dev/null || fail "publishing on the new cluster"
check_eq "35 new deliveries, each at its key's previous seq + 1 (o-*: 21, i-*: 11, s-*: 11)" "35|35|10|5|20" \
    "$(sql "$DB" "SELECT count(*), count(*) FILTER (WHERE d.seq = b.seq + 1),
                         count(*) FILTER (WHERE d.seq = 21 AND d.key LIKE 'o-%'),
                         count(*) FILTER (WHERE d.seq = 11 AND d.key LIKE 'i-%'),
                         count(*) FILTER (WHERE d.seq = 11 AND d.key LIKE 's-%')
                    FROM relay.deliveries d JOIN seq_before b ON b.key = d.key
                   WHERE d.event_id > (SELECT event_id FROM ids_before)")"
check_eq "their delivery ids are above every earlier one too" "35|35" \
    "$(sql "$DB" "SELECT count(*), count(*) FILTER (WHERE id > i.delivery_id)
                    FROM relay.deliveries d, ids_before i WHERE d.event_id > i.event_id")"
check_eq "no key has a seq twice or a gap among its pending deliveries" 0 \
    "$(sql "$DB" "SELECT count(*) FROM (SELECT handler_id, key FROM relay.deliveries WHERE key IS NOT NULL
                   GROUP BY 1, 2 HAVING count(DISTINCT seq) <> count(*) OR max(seq) - min(seq) + 1 <> count(*)) x")"
check_eq "the counters moved by one" "35" \
    "$(sql "$DB" "SELECT count(*) FROM relay.key_seqs k JOIN seq_before b USING (key) WHERE k.seq = b.seq + 1")"
check_eq "a dedupe key of the old cluster still names its event" \
    "$(sql "$DB" "SELECT event_id FROM relay.dedupe WHERE key = 'count-6'")" \
    "$(sql "$DB" "SELECT relay_publish('stock.counted', '{\"n\": 6}', dedupe_key => 'count-6')")"

log "new: a pull consumer claims the leased deliveries again"
out=$(psql -X -At -d "$DB" -c '\set VERBOSITY sqlstate' -c "SELECT relay_ack(array_agg(id), array_agg(lease))
        FROM leased_before WHERE handler = 'p_keys'" </dev/null 2>&1)
check_eq "an ack with a lease of the old server is refused (55P03: not held), nothing acked" "ERROR:  55P03|107" \
    "$out|$(sql "$DB" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                       WHERE h.name = 'p_keys' AND d.event_id <= (SELECT event_id FROM ids_before) AND d.attempt = 0")"
# claim_round: one relay_claim of p_keys (per key: the head), noted in drained, acked.
claim_round() {
    sql "$DB" "WITH c AS (SELECT * FROM relay_claim('p_keys', 1000)),
                    n AS (INSERT INTO drained (id, key, seq, topic, attempt)
                          SELECT id, key, seq, topic, attempt FROM c ORDER BY key, seq)
               SELECT count(*), relay_ack(array_agg(id), array_agg(lease)) FROM c HAVING count(*) > 0"
}
claim_round >/dev/null
check_eq "the first claim hands over every ready head: 20 keys' and 6 unkeyed" "20|6" \
    "$(sql "$DB" "SELECT count(*) FILTER (WHERE key LIKE 's-%'), count(*) FILTER (WHERE key IS NULL) FROM drained")"
check_eq "the 8 deliveries leased before the upgrade are among them, still at attempt 1 (nothing charged)" "8|8" \
    "$(sql "$DB" "SELECT count(*), count(*) FILTER (WHERE d.attempt = 1)
                    FROM leased_before l JOIN drained d USING (id) WHERE l.handler = 'p_keys'")"
check_eq "the delivery nacked before the upgrade comes as attempt 2" 1 "$(sql "$DB" "SELECT count(*) FROM drained WHERE attempt = 2")"
check_eq "the wire name is the topic they see" "stock_events" \
    "$(sql "$DB" "SELECT string_agg(DISTINCT topic, ',') FROM drained")"

log "new: the dispatchers deliver the notify backlog"
n_ff=$(sql "$DB" "SELECT count(*) FROM pub_log WHERE key LIKE 'o-%'")
n_ack=$(sql "$DB" "SELECT count(*) FROM pub_log WHERE key LIKE 'i-%'")
start_client ff "$DB" up_ff --timestamps --count "$n_ff" --idle-timeout $((DELAY + 30)) || die "the LISTEN client did not start"
start_client ack "$DB" up_ack --ack --count "$n_ack" --idle-timeout 30 || die "the LISTEN client did not start"
sql postgres "ALTER SYSTEM RESET relaybus.enabled" "SELECT pg_reload_conf()" >/dev/null
check "a dispatcher serves $DB" wait_workers "$DB" 1 30
check "the acked notify backlog arrives ($n_ack, the 5 leased before included) and is acked" \
    wait_lines "$TMP/ack.out" "$n_ack" 30
log "new: the pull consumers drain the rest (the delayed deliveries are due $DELAY s after they were published)"
drained_all() {
    claim_round >/dev/null
    sql "$DB" "SELECT relay_replay('p_dead')" >/dev/null
    sql "$DB" "SELECT relay_ack(array_agg(id), array_agg(lease)) FROM relay_claim('p_dead', 100)
               HAVING count(*) > 0" >/dev/null
    [[ $(sql "$DB" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                     WHERE h.kind = 'pull'") == 0 &&
       $(sql "$DB" "SELECT count(*) FROM relay.dead_letters") == 0 ]]
}
check "p_keys and p_dead (its dead letters replayed) drain" wait_until $((DELAY + 30)) drained_all
check_eq "p_keys: every key's seqs claimed in order, each once: 6..11 for s-*, 1 for sd-*" "20|2|0" \
    "$(sql "$DB" "SELECT count(*) FILTER (WHERE key LIKE 's-%' AND seqs = ARRAY(SELECT generate_series(6, 11))::bigint[]),
                         count(*) FILTER (WHERE key LIKE 'sd-%' AND seqs = '{1}'),
                         count(*) FILTER (WHERE seqs <> ARRAY(SELECT generate_series(seqs[1], seqs[1] + cardinality(seqs) - 1))::bigint[])
                    FROM (SELECT key, array_agg(seq ORDER BY n) AS seqs FROM drained WHERE key IS NOT NULL GROUP BY key) k")"
check_eq "p_keys: 128 deliveries claimed after the upgrade (100 + 20 new + 6 unkeyed + 2 delayed), none twice" "128|128" \
    "$(sql "$DB" "SELECT count(*), count(DISTINCT id) FROM drained")"
check_eq "no delayed pull delivery was handed over before its time" "2|0" \
    "$(sql "$DB" "SELECT count(*), count(*) FILTER (WHERE d.at < b.not_before) FROM drained d JOIN delayed_before b USING (id)")"
check "the fire-and-forget backlog arrives ($n_ff, the delayed ones once due)" \
    wait_lines "$TMP/ff.out" "$n_ff" $((DELAY + 30))
for c in ff ack; do
    prefix=o
    [[ $c == ack ]] && prefix=i
    sql "$DB" "SELECT id, key FROM pub_log WHERE key LIKE '$prefix-%' ORDER BY id" >"$TMP/published_$c"
    analyze --published "$TMP/published_$c" "$TMP/$c.out" || die "could not analyze"
    check_eq "$c: each event once, in key order, seqs 1..n per key" "${R[published]}|0|0|0|0|0" \
        "${R[distinct]}|${R[missing]}|${R[dups]}|${R[order_violations]}|${R[seq_gap_keys]}|${R[key_mismatch]}"
done
sql "$DB" "SELECT id, extract(epoch FROM not_before) FROM delayed_before" >"$TMP/delayed_before"
check_eq "no delayed notify delivery was sent before its time" "3|0" "$(python3 - "$TMP/delayed_before" "$TMP/ff.out" <<'PY'
import json, sys
due = dict((int(l.split("|")[0]), float(l.split("|")[1])) for l in open(sys.argv[1]) if l.strip())
seen = early = 0
for line in open(sys.argv[2]):
    f = line.rstrip("\n").split("\t")
    d = json.loads(f[1])
    recv = float([x for x in f[2:] if x.startswith("recv=")][0][5:])
    if d["id"] in due:
        seen += 1
        early += recv < due[d["id"]]
print(f"{seen}|{early}")
PY
)"
check_eq "the LISTEN clients see the wire names" "orders|invoices" \
    "$(cut -f2 "$TMP/ff.out" | grep -o '"topic": *"[^"]*"' | sort -u | sed 's/.*"\([^"]*\)"$/\1/' | paste -sd,)|$(
       cut -f2 "$TMP/ack.out" | grep -o '"topic": *"[^"]*"' | sort -u | sed 's/.*"\([^"]*\)"$/\1/' | paste -sd,)"
notify_left() {
    [[ $(sql "$DB" "SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                     WHERE h.kind = 'notify'") == 0 ]]
}
check "no notify delivery is left" wait_until 10 notify_left
check_eq "the paused http and kafka handlers' deliveries wait, still paused" "h_http:ready=3 k_kafka:ready=3" \
    "$(sql "$DB" "$STATE_Q")"
log "new: deliveries by state at the end: $(sql "$DB" "$STATE_Q")"
finish
