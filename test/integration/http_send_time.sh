#!/usr/bin/env bash
# webhook-timestamp and webhook-signature are made when a request is sent, not
# when its delivery was claimed: with concurrency 1 and a receiver that answers
# each request after 1.5 s, three deliveries claimed together wait in the
# dispatcher's queue (the third for ~3 s); each still carries the time it was
# sent (within a second of its arrival) and a signature over that timestamp.
# relay.handler_stats' send time is the same measure (from the sink taking a
# request to its response, 1.5 s each) where its publish-to-completion
# latency includes the queue (the third ~4.5 s).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

http_test_db http_send_time

SECRET=$(new_secret)
http_handler "$db" slow "$URL/slow" "{\"concurrency\": 1, \"timeout\": \"10s\", \"secret\": \"$SECRET\"}" 'st.t' ||
    die "handler slow"
recv_plan "$RECV_PORT" /slow '[{"delay": 1.5, "repeat": true}]' || die "receiver control"
sql "$db" "SELECT relay_publish('st.t', jsonb_build_object('i', i), 'k' || i) FROM generate_series(1, 3) i" >/dev/null
check "the 3 deliveries arrive" wait_requests "$LOG" /slow 3 20
py_facts st "$LOG" "$SECRET" <<'EOF'
import sys, http_log
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
recs = http_log.records(sys.argv[1], "/slow")
wh = Webhook(sys.argv[2])
ok = 0
for r in recs:
    try:
        wh.verify(r["body"].encode("utf-8"), r["headers"])
        ok += 1
    except WebhookVerificationError:
        pass
# The timestamp has whole seconds: arrival - timestamp is in [0, 1) plus the
# time on the wire.
age = [r["t"] - int(r["headers"]["webhook-timestamp"]) for r in recs]
http_log.facts(dict(n=len(recs), verified=ok, ages=",".join(f"{a:.2f}" for a in age),
                    stale=sum(not (-0.5 <= a < 1.3) for a in age),
                    spread_ms=int((recs[-1]["t"] - recs[0]["t"]) * 1000) if recs else -1))
EOF
log "arrival minus webhook-timestamp: $(r ages) s; first to last arrival $(r spread_ms) ms"
check "the requests went out one after the other (the last waited in the queue >= 2.5 s: $(r spread_ms) ms)" \
    test "$(r spread_ms)" -ge 2500
check_eq "every webhook-timestamp is the time of sending (within 1.3 s of arrival: $(r ages))" 0 "$(r stale)"
check_eq "every signature verifies (over that timestamp)" 3 "$(r verified)"

settled() { [[ $(sql "$db" "SELECT count(*) FROM relay.deliveries") == 0 ]]; }
check "the 3 deliveries are completed" wait_until 20 settled
stats=$(sql "$db" "SELECT sends, send_p50_ms, send_p99_ms, latency_p99_ms, round(send_sum_seconds::numeric, 1)
                     FROM relay.handler_stats JOIN relay.handler_metrics USING (handler) WHERE handler = 'slow'")
log "sends | send p50 | send p99 | latency p99 | send sum (s): $stats"
IFS='|' read -r sends p50 p99 lat99 sum <<<"$stats"
check_eq "3 sends counted" 3 "$sends"
# Log2 buckets: 1.5 s reads 2097.152 ms (the bucket's upper bound); 3 s or more would read 4194.304.
check_eq "send p50 and p99: each request's 1.5 s, not its wait in the queue" "2097.152|2097.152" "$p50|$p99"
check "publish-to-completion p99 includes the queue (>= 4194 ms: $lat99)" \
    awk -v v="$lat99" 'BEGIN { exit !(v >= 4194) }'
check "the send times sum to ~4.5 s ($sum)" awk -v v="$sum" 'BEGIN { exit !(v >= 4.5 && v < 6) }'
finish
