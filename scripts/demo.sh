#!/usr/bin/env bash
# `make demo`: builds and installs relaybus, starts a throwaway PostgreSQL
# cluster in a temporary directory, walks through publish / rollback / claim /
# ack / stats with psql, and removes the cluster at the end. Exits non-zero if
# any step fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"

echo "== install dependencies =="
bash scripts/install-deps.sh

PG_CONFIG=${PG_CONFIG:-$(bash "$ROOT/scripts/pg-config.sh")}
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
    SELECT id, key, seq, topic, payload, lease FROM relay_claim('billing', 10, per_key => 10);
SELECT id, key, seq, topic, payload FROM demo_claimed;
-- leased deliveries are not handed out again
SELECT count(*) AS claimable_now FROM relay_claim('billing', 10, per_key => 10);
SQL

echo
echo "== ack =="
sql <<'SQL'
-- another session than the claim's: each ack names its lease (the receipt)
SELECT relay_ack(array_agg(id), array_agg(lease)) AS acked FROM demo_claimed;
SELECT count(*) AS deliveries_left FROM relay.deliveries;
SQL

echo
echo "== notify: a LISTEN consumer prints deliveries as they are published =="
CLIENT_DIR=$(mktemp -d /tmp/relaybus-demo-bin.XXXXXX)
g++ -std=c++17 -O2 -o "$CLIENT_DIR/listen_client" test/integration/listen_client.cpp \
    -I"$("$PG_CONFIG" --includedir)" -L"$("$PG_CONFIG" --libdir)" -lpq
sql <<'SQL'
SELECT relay_create_handler('mailer', 'notify', 'demo_events');
SELECT relay_route('shipment.#', 'mailer');
SQL
"$CLIENT_DIR/listen_client" --channel demo_events --count 3 --idle-timeout 10 \
    --ready-file "$CLIENT_DIR/ready" >"$CLIENT_DIR/received" &
client=$!
for _ in $(seq 100); do [[ -e "$CLIENT_DIR/ready" ]] && break; sleep 0.1; done
sql <<'SQL'
SELECT relay_publish('shipment.packed', '{"order": 10}', key => 'order-10');
SELECT relay_publish('shipment.sent', '{"order": 10}', key => 'order-10');
SELECT relay_publish('shipment.delivered', '{"order": 10}', key => 'order-10');
SQL
wait "$client"
echo "-- the LISTEN consumer received, one delivery per line, in key order:"
cut -f2 "$CLIENT_DIR/received"

echo
echo "== http: signed webhooks to a local receiver =="
python3 test/integration/http_receiver.py --port-file "$CLIENT_DIR/port" &
receiver=$!
trap 'kill "$receiver" 2>/dev/null || true; rm -rf "$CLIENT_DIR"; cleanup' EXIT
for _ in $(seq 100); do [[ -s "$CLIENT_DIR/port" ]] && break; sleep 0.1; done
port=$(cat "$CLIENT_DIR/port")
sql <<SQL
-- loopback is refused unless the allow-list opens it
ALTER SYSTEM SET relaybus.http_allowlist = '127.0.0.1';
SELECT pg_reload_conf();
SELECT relay_create_handler('billing-hook', 'http', 'http://127.0.0.1:$port/hooks',
       '{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}');
SELECT relay_route('invoice.*', 'billing-hook');
SELECT relay_publish('invoice.issued', '{"invoice": 7, "total": 1999}', key => 'customer-3');
SELECT relay_publish('invoice.paid', '{"invoice": 7}', key => 'customer-3');
SQL
for _ in $(seq 100); do
    n=$(python3 -c "import json,urllib.request;print(len(json.load(urllib.request.urlopen('http://127.0.0.1:$port/_requests'))))")
    [[ "$n" -ge 2 ]] && break
    sleep 0.1
done
echo "-- the receiver got (verified with the standardwebhooks package):"
python3 - "$port" <<'PY'
import json, sys, urllib.request
from standardwebhooks.webhooks import Webhook
reqs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/_requests"))
hook = Webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
for r in reqs:
    h = r["headers"]
    hook.verify(r["body"], {k: h[k] for k in ("webhook-id", "webhook-timestamp", "webhook-signature")})
    print(f"POST {r['path']}  webhook-id={h['webhook-id']}  signature ok  body={r['body']}")
PY

echo
echo "== stats =="
sql <<'SQL'
SELECT handler, kind, pending, delivered, http_2xx, latency_p50_ms FROM relay.handler_stats;
SELECT pid, lanes_held, delivered FROM relay.workers;
SQL

echo
echo "== done (the cluster is removed) =="
