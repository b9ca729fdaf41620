#!/usr/bin/env bash
# A handler's max_concurrency and rate across two relaybus-mongo instances of
# one database on FerretDB (docs/mongo.md, "Rate and concurrency limits"):
# each instance takes its share (core::split_limits by its rank among the
# live instances), each with `concurrency` 4; the real receiver records how
# many requests of a path it is serving at each arrival.
#   - max_concurrency 2: never more than 2 in flight, where the same handler
#     without it reaches 3 or more (the measure can fail); each key in order
#   - rate 8, burst 2, over 80 events: arrivals per second over the tail at
#     most 8 (a ceiling: docs/mongo.md), each key in order; `relaybus-mongo
#     stats` and /metrics count the deliveries held back
#   - `handler alter` lowering the rate to 2 takes effect
# Ignores the PostgreSQL cluster. Prints "N passed, N failed".
SUITE=mongo_limits
source "$(dirname "${BASH_SOURCE[0]}")/mongo_lib.sh"
declare -A R
DB=t_limits
"$BIN" init --database $DB >/dev/null
for h in uncapped:'{"concurrency": 4}' capped:'{"concurrency": 4, "max_concurrency": 2}' \
    paced:'{"concurrency": 4, "rate": 8, "burst": 2}'; do
    "$BIN" handler create "${h%%:*}" http "$HOOK/${h%%:*}" --options "${h#*:}" --database $DB >/dev/null ||
        die "handler ${h%%:*}"
    "$BIN" route "${h%%:*}.#" "${h%%:*}" --database $DB >/dev/null
done
# publish HANDLER FROM TO KEYS: one insertMany of events i = FROM..TO, keys k(i % KEYS).
publish() {
    seq "$2" "$3" | $PY -c "
import json, sys
for l in sys.stdin:
    i = int(l)
    print(json.dumps({'topic': '$1.t', 'payload': {'i': i}, 'key': 'k%d' % (i % $4)}))" |
        "$BIN" publish --batch - --database $DB >/dev/null || die "publish $1"
}
# facts NAME PATH: n, max_active, disorder of PATH's requests, into R.
facts() {
    while IFS= read -r line; do R[$1_${line%%=*}]=${line#*=}; done < <($PY - "$TMP/requests.log" "$2" <<'PY'
import sys, http_log
recs = http_log.records(sys.argv[1], sys.argv[2])
http_log.facts(dict(n=len(recs), max_active=max(r["active"] for r in recs), disorder=http_log.disorder(recs)))
PY
)
}
start_instance i1 $DB
start_instance i2 $DB
wait_metrics_addr i1 && wait_metrics_addr i2 || die "the instances did not start"
both_live() { [[ $(metric i1 relaybus_mongo_lanes_held) -gt 0 && $(metric i2 relaybus_mongo_lanes_held) -gt 0 ]]; }
wait_until 60 both_live || fail "both instances hold lanes" "$(tail -3 "$TMP/i2.err")"

for h in uncapped capped; do
    control "/$h" '[{"delay": 0.3, "repeat": true}]'
    publish "$h" 1 40 8
    wait_until 90 has_requests "/$h" 40 || fail "$h: the 40 deliveries arrive ($(count_path "/$h"))"
    facts "$h" "/$h"
    log "$h: at most ${R[${h}_max_active]} requests at once"
done
((R[uncapped_max_active] >= 3)) && pass "without max_concurrency the instances' concurrency adds up (${R[uncapped_max_active]})" ||
    fail "without max_concurrency the instances' concurrency adds up (>= 3)" "${R[uncapped_max_active]}"
((R[capped_max_active] >= 1 && R[capped_max_active] <= 2)) && pass "max_concurrency 2: never more than 2 at once" ||
    fail "max_concurrency 2: never more than 2 at once" "${R[capped_max_active]}"
check_eq "max_concurrency 2: each key's events in order" 0 "${R[capped_disorder]}"

publish paced 1 80 16
wait_until 90 has_requests /paced 80 || fail "paced: the 80 deliveries arrive ($(count_path /paced))"
while IFS= read -r line; do R[${line%%=*}]=${line#*=}; done < <($PY - "$TMP/requests.log" <<'PY'
import sys, http_log
paced = http_log.records(sys.argv[1], "/paced")
t = [r["t"] for r in paced]
tail = [x for x in t if x >= t[0] + 2.0] or t
http_log.facts(dict(rate=f"{(len(tail) - 1) / max(tail[-1] - tail[0], 1e-3):.1f}", span=f"{t[-1] - t[0]:.1f}",
                    disorder=http_log.disorder(paced)))
PY
)
log "rate 8, burst 2: ${R[rate]} arrivals/s over the tail, ${R[span]} s in all"
# A ceiling: below it where one instance's lanes run out of ready keys first
# or the loop waits on FerretDB (each sends at most its half: docs/mongo.md).
awk -v v="${R[rate]}" 'BEGIN { exit !(v >= 2.5 && v <= 9.5) }' && pass "rate 8: the tail's arrivals per second (2.5 to 9.5: ${R[rate]})" ||
    fail "rate 8: the tail's arrivals per second (2.5 to 9.5)" "${R[rate]}"
check_eq "rate 8: each key's events in order" 0 "${R[disorder]}"
held=$("$BIN" stats --database $DB | $PY -c "import json,sys; print(sum(h.get('held_back', 0) for h in json.load(sys.stdin) if h['handler'] == 'paced'))")
((held > 0)) && pass "relaybus-mongo stats counts paced's deliveries held back ($held)" ||
    fail "relaybus-mongo stats counts paced's deliveries held back" "$held"
held_of() { local v; v=$(metric "$1" 'relaybus_mongo_held_back_total{handler="paced"}'); echo "${v:-0}"; }
m=$(($(held_of i1) + $(held_of i2)))
((m > 0)) && pass "... and the instances' /metrics ($m)" || fail "... and the instances' /metrics" "$m"

# Lowered live: 20 more at rate 2 (1 a second per instance) take about 10 s.
"$BIN" handler alter paced --options '{"rate": 2, "burst": 1}' --database $DB >/dev/null || fail "handler alter"
sleep 1  # the next lease tick reads the catalog
publish paced 81 100 16
wait_until 90 has_requests /paced 100 || fail "paced: the 20 more arrive ($(count_path /paced))"
after=$($PY - "$TMP/requests.log" <<'PY'
import sys, http_log
t = [r["t"] for r in http_log.records(sys.argv[1], "/paced")][80:]
print(f"{(len(t) - 1) / max(t[-1] - t[0], 1e-3):.1f}")
PY
)
log "paced: after lowering the rate to 2, $after arrivals/s"
awk -v v="$after" 'BEGIN { exit !(v > 0 && v <= 2.6) }' && pass "handler alter lowering rate to 2 takes effect ($after/s)" ||
    fail "handler alter lowering rate to 2 takes effect (at most 2.6/s)" "$after"
finish
