# Prometheus helpers for the integration tests (sourced after lib.sh): Debian's
# prometheus-postgres-exporter with docs/postgres_exporter.yml, and a real
# Prometheus server scraping it (both from scripts/install-deps.sh).

# The relaybus-mongo scripts track their background processes in PIDS.
declare -F bg_track >/dev/null || bg_track() { PIDS+=("$1"); }

free_tcp_port() { python3 "$RELAYBUS_ROOT/scripts/free-port.py"; }

# start_exporter DSN: the exporter serving only relaybus's queries for DSN
# (comma-separated for several databases) on EXPORTER_PORT; waits until it
# serves /metrics.
start_exporter() {
    local exporter c no_collectors=()
    exporter=$(command -v prometheus-postgres-exporter) || die "no prometheus-postgres-exporter (scripts/install-deps.sh)"
    EXPORTER_PORT=$(free_tcp_port)
    # Every collector of the exporter's own off, by the names its version has
    # (Debian 12's 0.11 has database and bgwriter; Debian 13's 0.17 has a
    # dozen, on by default, among them locks and stat_database, whose series
    # promtool rejects and whose queries the scraper role may not run).
    for c in $("$exporter" --help 2>&1 | grep -oE -- '--(\[no-\])?collector\.[a-z_]+' | sed -E 's/.*collector\.//' | sort -u); do
        no_collectors+=("--no-collector.$c")
    done
    DATA_SOURCE_NAME="$1" "$exporter" --web.listen-address="127.0.0.1:$EXPORTER_PORT" \
        --extend.query-path="$RELAYBUS_ROOT/docs/postgres_exporter.yml" --disable-default-metrics \
        --disable-settings-metrics "${no_collectors[@]}" >"$TMP/exporter.log" 2>&1 &
    bg_track $!
    wait_until 20 curl -sf -o /dev/null "http://127.0.0.1:$EXPORTER_PORT/metrics"
}

# start_prometheus TARGET...: a Prometheus server on PROMETHEUS_PORT scraping
# each host:port every second; waits until it is ready.
start_prometheus() {
    local targets
    command -v prometheus >/dev/null || die "no prometheus (scripts/install-deps.sh)"
    PROMETHEUS_PORT=$(free_tcp_port)
    targets=$(printf '"%s",' "$@")
    cat >"$TMP/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: relaybus
    static_configs:
      - targets: [${targets%,}]
YML
    prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/prometheus-data" \
        --web.listen-address="127.0.0.1:$PROMETHEUS_PORT" >"$TMP/prometheus.log" 2>&1 &
    bg_track $!
    wait_until 30 curl -sf -o /dev/null "http://127.0.0.1:$PROMETHEUS_PORT/-/ready"
}

# dashboard_queries DASHBOARD: each panel's queries of a Grafana dashboard
# evaluated by the Prometheus server, one line per query:
#   "<series>|<panel title>|<expr>" (the dashboard's variables $database and
#   $handler as "all" (.*), $__rate_interval 10s, $__range 5m).
dashboard_queries() {
    python3 - "$1" "http://127.0.0.1:$PROMETHEUS_PORT" <<'PY'
import json, sys, urllib.parse, urllib.request
dash, base = json.load(open(sys.argv[1])), sys.argv[2]
for panel in dash["panels"]:
    for t in panel.get("targets", []):
        q = (t["expr"].replace("$database", ".*").replace("$handler", ".*")
             .replace("$__rate_interval", "10s").replace("$__range", "5m"))
        url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            r = json.load(urllib.request.urlopen(url, timeout=10))
            n = len(r["data"]["result"]) if r.get("status") == "success" else -1
        except Exception as e:  # a query Prometheus refuses (400) is a failure
            n = -1
        print(f"{n}|{panel['title']}|{t['expr']}")
PY
}
