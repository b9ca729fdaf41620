#!/usr/bin/env bash
# `make demo`: builds and installs relaybus, starts a throwaway PostgreSQL 15
# cluster in a temporary directory, walks through publish / rollback / claim /
# ack / stats with psql, and removes the cluster at the end. Exits non-zero if
# any step fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"

echo "== install dependencies =="
bash scripts/install-deps.sh

if [[ -z "${PG_CONFIG:-}" ]]; then
    if [[ -x /usr/lib/postgresql/15/bin/pg_config ]]; then
        PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
    else
        PG_CONFIG=pg_config
    fi
fi
export PG_CONFIG
PATH="$("$PG_CONFIG" --bindir):$PATH"
export PATH

echo "== build and install =="
make -j"$(nproc 2>/dev/null || echo 2)" PG_CONFIG="$PG_CONFIG"
make install PG_CONFIG="$PG_CONFIG"

DEMO_DIR=$(mktemp -d /tmp/relaybus-demo.XXXXXX)
cleanup() { bash "$ROOT/test/cluster.sh" destroy "$DEMO_DIR" >/dev/null 2>&1 || true; }
trap cleanup EXIT

echo "== start a throwaway cluster in $DEMO_DIR =="
bash test/cluster.sh start "$DEMO_DIR"
# shellcheck disable=SC1091
source "$DEMO_DIR/env"

sql() {
    psql -X -q -v ON_ERROR_STOP=1 --echo-queries -P pager=off -d postgres
}

echo
echo "== install the extension, a pull handler and a route =="
sql <<'SQL'
CREATE EXTENSION relaybus;
SELECT relay_create_handler('billing', 'pull');
SELECT relay_route('order.*', 'billing');
SQL

echo
echo "== publish: one transaction, 3 events for key order-1, 2 for order-2, 1 unkeyed =="
sql <<'SQL'
BEGIN;
SELECT relay_publish('order.created', '{"order": 1, "total": 42}', key => 'order-1');
SELECT relay_publish('order.created', '{"order": 2, "total": 7}', key => 'order-2');
SELECT relay_publish('order.paid', '{"order": 1}', key => 'order-1');
SELECT relay_publish('order.paid', '{"order": 2}', key => 'order-2');
SELECT relay_publish('order.shipped', '{"order": 1}', key => 'order-1');
SELECT relay_publish('order.audited', '{"note": "no ordering key"}');
COMMIT;
SELECT count(*) AS deliveries FROM relay.deliveries;
SQL

echo
echo "== rollback: a published event exists only if its transaction commits =="
sql <<'SQL'
BEGIN;
SELECT relay_publish('order.created', '{"order": 3}', key => 'order-3');
SELECT count(*) AS deliveries_inside_the_transaction FROM relay.deliveries;
ROLLBACK;
SELECT count(*) AS deliveries_after_rollback FROM relay.deliveries;
SQL

echo
echo "== claim: each key's deliveries in publish order (seq) =="
sql <<'SQL'
CREATE TABLE demo_claimed AS
    SELECT id, key, seq, topic, payload FROM relay_claim('billing', 10, per_key => 10);
TABLE demo_claimed;
-- leased deliveries are not handed out again
SELECT count(*) AS claimable_now FROM relay_claim('billing', 10, per_key => 10);
SQL

echo
echo "== ack =="
sql <<'SQL'
SELECT relay_ack(array_agg(id)) AS acked FROM demo_claimed;
SELECT count(*) AS deliveries_left FROM relay.deliveries;
SQL

echo
echo "== stats =="
sql <<'SQL'
SELECT * FROM relay.handler_stats;
SQL

echo
echo "== done (the cluster is removed) =="
