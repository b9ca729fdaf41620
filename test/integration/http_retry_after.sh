#!/usr/bin/env bash
# Retry-After is clamped to the handler's backoff_max and saturates: a real
# receiver answers 429 once per delivery with a Retry-After of a year, an
# absurd number (beyond int64 milliseconds) and an HTTP-date in the year 9999;
# each delivery is retried after backoff_max (1 s): not parked for years, and
# not retried at once through an overflow. A Retry-After within backoff_max is
# honoured as it is (http_failures.sh (2)).
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

http_test_db http_retry_after

http_handler "$db" ra "$URL/ra" \
    '{"backoff_base": "100ms", "backoff_max": "1s", "timeout": "2s", "max_attempts": 5}' 'ra.t' || die "handler ra"
recv_plan "$RECV_PORT" /ra '[
    {"status": 429, "retry_after": "31536000", "match": "\"n\": \"year\""},
    {"status": 429, "retry_after": "99999999999999999999999999", "match": "\"n\": \"absurd\""},
    {"status": 429, "retry_after": "Fri, 31 Dec 9999 23:59:59 GMT", "match": "\"n\": \"date\""}]' ||
    die "receiver control"
sql "$db" "SELECT relay_publish('ra.t', jsonb_build_object('n', n), n)
           FROM unnest(ARRAY['year', 'absurd', 'date']) n" >/dev/null
check "each of the 3 deliveries is sent twice (429, then 200)" wait_requests "$LOG" /ra 6 15
check "... and completed" wait_until 10 none_pending "$db" ra
py_facts ra "$LOG" <<'EOF'
import sys, http_log
recs = http_log.records(sys.argv[1], "/ra")
out = {}
for n in ("year", "absurd", "date"):
    rs = [r for r in recs if r["env"]["payload"]["n"] == n]
    out[n + "_statuses"] = ",".join(str(r["answered"].get("status", 200)) for r in rs)
    out[n + "_gap_ms"] = int((rs[1]["t"] - rs[0]["t"]) * 1000) if len(rs) > 1 else -1
http_log.facts(out)
EOF
for n in year absurd date; do
    log "$n: retried after $(r ${n}_gap_ms) ms"
    check_eq "$n: answered 429 then 200" "429,200" "$(r ${n}_statuses)"
    check "$n: retried after backoff_max (0.9 s <= $(r ${n}_gap_ms) ms < 2.5 s)" \
        test "$(r ${n}_gap_ms)" -ge 900 -a "$(r ${n}_gap_ms)" -lt 2500
done
finish
