# A real OpenTelemetry Collector for the span export suites (sourced after
# lib.sh): test/otelcol/build.sh's binary (the otlp receiver, the contrib file
# exporter), listening for OTLP/HTTP on a free loopback port and writing what
# it receives, one ExportTraceServiceRequest per line in OTLP JSON, to a file.
#
#     otel_build                     # test/otelcol/build.sh (a cache hit after the first)
#     otel_pick_port                 # OTEL_PORT, OTEL_ENDPOINT
#     otel_start NAME                # the collector, its spans in $TMP/NAME.spans.json
#     otel_stop                      # kill it (the port stays OTEL_PORT)
#     otel_spans FILE...             # every span of those files, one JSON object a line

# lib.sh names the root RELAYBUS_ROOT and tracks processes with bg_track;
# mongo_lib.sh has ROOT and PIDS.
OTEL_ROOT=${RELAYBUS_ROOT:-$ROOT}
OTELCOL=$OTEL_ROOT/test/otelcol/bin/otelcol-test

otel_build() { bash "$OTEL_ROOT/test/otelcol/build.sh"; }
otel_track() { if declare -F bg_track >/dev/null; then bg_track "$1"; else PIDS+=("$1"); fi; }

otel_pick_port() {
    OTEL_PORT=$(python3 "$OTEL_ROOT/scripts/free-port.py")
    OTEL_ENDPOINT=http://127.0.0.1:$OTEL_PORT
}

# The receiver answers an empty export with 200 once it listens.
otel_ready() {
    [[ $(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d '{}' \
        "$OTEL_ENDPOINT/v1/traces") == 200 ]]
}

# Up, or exited (wait_until then stops waiting; otel_ready tells which).
otel_up() { otel_ready || ! kill -0 "$OTEL_PID" 2>/dev/null; }

otel_start() {
    local name=$1
    # The collector's own telemetry off: its default metrics listener (:8888)
    # would collide with another suite's collector.
    cat >"$TMP/$name.otelcol.yaml" <<YAML
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:$OTEL_PORT
exporters:
  file:
    path: $TMP/$name.spans.json
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
YAML
    "$OTELCOL" --config "$TMP/$name.otelcol.yaml" >"$TMP/$name.otelcol.log" 2>&1 &
    OTEL_PID=$!
    otel_track "$OTEL_PID"
    if ! wait_until 60 otel_up || ! otel_ready; then
        echo "the collector did not start:" >&2
        tail -20 "$TMP/$name.otelcol.log" >&2
        return 1
    fi
}

otel_stop() {
    kill "$OTEL_PID" 2>/dev/null
    wait "$OTEL_PID" 2>/dev/null
    return 0
}

otel_spans() {
    python3 - "$@" <<'PY'
import json, sys
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        continue
    for line in lines:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except ValueError:
            continue  # a line being written
        for rs in req.get("resourceSpans", []):
            res = {a["key"]: list(a["value"].values())[0] for a in rs.get("resource", {}).get("attributes", [])}
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    s["resource"] = res
                    s["attrs"] = {a["key"]: list(a["value"].values())[0] for a in s.get("attributes", [])}
                    print(json.dumps(s))
PY
}

# otel_check_attempts SPANS SEEN TP EDITION HANDLER: the checks of a traced
# event answered 500 then 200 (otel_facts.py): SPANS is otel_spans' output,
# SEEN the traceparents the receiver saw on the event's attempts, one a line.
otel_check_attempts() {
    local line
    R=()
    while IFS= read -r line; do R[${line%%=*}]=${line#*=}; done < <(PYTHONPATH="$OTEL_ROOT/test/integration" python3 -c '
import sys
from otel_facts import attempt_facts
attempt_facts(sys.argv[1], open(sys.argv[2]).read().split(), *sys.argv[3:6])' "$@")
    check_eq "one span per attempt, none for the untraced event" "${R[attempts]:-?}" "${R[spans]:-}"
    check_eq "two attempts (500, then 200)" 2 "${R[attempts]:-}"
    check_eq "every span is in the publisher's trace, a child of the publisher's span" 1 "${R[trace]:-}"
    check_eq "each span's id is the traceparent the receiver saw on that attempt" 1 "${R[span_ids]:-}"
    check_eq "attempt 1: HTTP 500, outcome retry, status ERROR" 1 "${R[first]:-}"
    check_eq "attempt 2: HTTP 200, outcome delivered, status unset" 1 "${R[second]:-}"
    check_eq "handler, kind CLIENT, resource service.name relaybus ($4), times, queue wait and send time" 1 \
        "$((R[handler] && R[resource] && R[times]))"
}

# otel_seen_http LOG PATH: the traceparents http_receiver.py logged for
# requests of PATH whose payload's n is 1 (the traced event), in order.
otel_seen_http() {
    PYTHONPATH="$OTEL_ROOT/test/integration" python3 -c '
import sys
from http_log import records
for r in records(sys.argv[1], sys.argv[2]):
    if r["env"]["payload"]["n"] == 1:
        print(r["headers"]["traceparent"])' "$@"
}

# otel_has_spans N FILE...: at least N spans arrived.
otel_has_spans() {
    local n=$1
    shift
    (($(otel_spans "$@" | wc -l) >= n))
}
