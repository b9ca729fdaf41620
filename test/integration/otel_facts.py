"""Facts about a traced event's attempt spans, for the span export suites
(otel_lib.sh's otel_attempt_facts): the spans otel_spans printed, against
the traceparents the receiver saw on the event's attempts (a 500, then a
200), printed as name=value lines."""
import json


def attempt_facts(spans_path, seen, tp, edition, handler):
    spans = [json.loads(line) for line in open(spans_path) if line.strip()]
    spans = [s for s in spans if s["attrs"].get("relaybus.handler") == handler]
    by_attempt = {int(s["attrs"]["relaybus.attempt"]): s for s in spans}
    a1, a2 = by_attempt.get(1, {}), by_attempt.get(2, {})
    status = lambda s: s.get("status", {}).get("code", 0)
    facts = {
        "spans": len(spans),
        "attempts": len(seen),
        "trace": all(s["traceId"] == tp[3:35] and s["parentSpanId"] == tp[36:52] for s in spans),
        "span_ids": sorted(s["spanId"] for s in spans) == sorted(t[36:52] for t in seen),
        "first": bool(a1) and len(seen) == 2 and a1["attrs"].get("http.response.status_code") == "500"
        and a1["attrs"]["relaybus.outcome"] == "retry" and status(a1) in (2, "STATUS_CODE_ERROR")
        and a1["spanId"] == seen[0][36:52],
        "second": bool(a2) and len(seen) == 2 and a2["attrs"].get("http.response.status_code") == "200"
        and a2["attrs"]["relaybus.outcome"] == "delivered" and status(a2) in (0, "STATUS_CODE_UNSET")
        and a2["spanId"] == seen[1][36:52],
        "handler": all(s["attrs"]["relaybus.handler.kind"] == "http" and s["name"] == "deliver " + handler
                       and s["kind"] in (3, "SPAN_KIND_CLIENT") for s in spans),
        "resource": all(s["resource"].get("service.name") == "relaybus"
                        and s["resource"].get("relaybus.edition") == edition for s in spans),
        "times": all(int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]) > 0
                     and "relaybus.queue_wait_ms" in s["attrs"] and "relaybus.send_ms" in s["attrs"] for s in spans),
    }
    for k, v in facts.items():
        print(f"{k}={int(v) if isinstance(v, bool) else v}")
