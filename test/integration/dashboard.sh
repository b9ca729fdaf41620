#!/usr/bin/env bash
# The Grafana dashboard docs/grafana/relaybus.json against real parts: events
# flow to an http handler (rate-limited to 5/s; some requests answered 500,
# then retried), a
# handler whose deliveries are dead-lettered (410) and a notify handler;
# prometheus-postgres-exporter with docs/postgres_exporter.yml scrapes the
# database as a relay_monitor role, a Prometheus server scrapes the exporter,
# and every query of every panel (and of the dashboard's variables), sent to
# that Prometheus as Grafana would with "All" selected, returns series.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/prometheus_lib.sh"

DASHBOARD=$RELAYBUS_ROOT/docs/grafana/relaybus.json
check "the dashboard is JSON with panels and queries" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["panels"] and all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in d["panels"])' "$DASHBOARD"

http_test_db dashboard
scraper="it_dash_$$"
psql_q -d postgres -c "CREATE ROLE $scraper LOGIN IN ROLE relay_monitor" >/dev/null || die "role"
drop_scraper() { psql_q -d postgres -c "DROP ROLE IF EXISTS $scraper" >/dev/null 2>&1; }
http_handler "$db" d_http "$URL/ok" '{"backoff_base": "100ms", "backoff_max": "200ms", "rate": 5, "burst": 1}' 'd.h.#' ||
    die "handler d_http"
http_handler "$db" d_gone "$URL/gone" '{"max_attempts": 1}' 'd.g.#' || die "handler d_gone"
notify_handler "$db" d_fire it_d_fire '{}' 'd.n.#' || die "handler d_fire"
recv_plan "$RECV_PORT" /ok '[{"status": 500}, {"status": 500}, {"status": 500}]' || die "receiver control"
recv_plan "$RECV_PORT" /gone '[{"status": 410, "repeat": true}]' || die "receiver control"

start_exporter "host=$PGHOST port=$PGPORT user=$scraper dbname=$db sslmode=disable"
check_eq "the exporter serves /metrics" 0 "$?"
start_prometheus "127.0.0.1:$EXPORTER_PORT"
check_eq "Prometheus is ready" 0 "$?"

# ~12 s of traffic, so that rate() over 10 s has samples to work with.
for i in $(seq 1 24); do
    sql "$db" "SELECT relay_publish('d.h.x', jsonb_build_object('i', $i), 'k' || ($i % 3))" \
        "SELECT relay_publish('d.n.x', jsonb_build_object('i', $i))" >/dev/null
    ((i % 6 == 0)) && sql "$db" "SELECT relay_publish('d.g.x', jsonb_build_object('i', $i))" >/dev/null
    sleep 0.5
done
check "the http deliveries arrive (3 answered 500 and retried)" wait_requests "$LOG" /ok 27 30
check "4 dead letters" wait_until 30 dead_is "$db" d_gone 4
scraped() {
    [[ $(curl -sf "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/query?query=relay_handler_dead_lettered_total%7Bhandler%3D%22d_gone%22%7D" |
        python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")') == 4 ]]
}
check "Prometheus scraped the final counts" wait_until 20 scraped
sleep 2

dashboard_queries "$DASHBOARD" >"$TMP/queries.txt"
while IFS='|' read -r n title expr; do
    check "panel \"$title\": $expr returns series ($n)" test "$n" -gt 0
done <"$TMP/queries.txt"
check_eq "every panel's query was run" "$(python3 -c 'import json, sys; print(sum(len(p["targets"]) for p in json.load(open(sys.argv[1]))["panels"]))' "$DASHBOARD")" \
    "$(wc -l <"$TMP/queries.txt")"
labels() {
    curl -sf "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/label/$1/values" --data-urlencode "match[]=$2" -G |
        python3 -c 'import json, sys; print(" ".join(sorted(json.load(sys.stdin)["data"])))'
}
check_eq "the variable \$database lists the database" "$db" "$(labels database relay_handler_delivered_total)"
check_eq "the variable \$handler lists its handlers" "d_fire d_gone d_http" \
    "$(labels handler "relay_handler_delivered_total{database=~\"$db\"}")"
check_eq "the exporter logged no query error" 0 "$(grep -ci 'level=error' "$TMP/exporter.log")"

drop_scraper
finish
