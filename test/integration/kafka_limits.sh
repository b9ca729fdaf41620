#!/usr/bin/env bash
# A kafka handler's rate and max_concurrency hold across the dispatchers of its
# database (relaybus.workers_per_database = 2), with a real broker and kcat as
# the consumer: 300 events on 8 keys with `rate` 40, `burst` 4,
# `max_concurrency` 4 and `key_window` 4: every message in the topic once,
# each key in seq order, the messages' produce timestamps at 40 per second
# (within 10 %), the deliveries held back counted.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

kafka_start || die "the broker did not start"
set_conf relaybus.workers_per_database 2 || die "workers_per_database"
new_db db kafka_limits || die "could not create a database"
create_pub_log "$db"
check "two dispatchers serve the database" wait_workers "$db" 2 20

kafka_create_topic relay-paced 3 || die "could not create topic relay-paced"
kafka_handler "$db" paced relay-paced \
    '{"rate": 40, "burst": 4, "max_concurrency": 4, "key_window": 4, "concurrency": 4}' 'kp.#' ||
    die "could not create the handler"
sql "$db" "INSERT INTO pub_log SELECT relay_publish('kp.ev', jsonb_build_object('i', i), 'k' || (i % 8)), 'k' || (i % 8)
             FROM generate_series(1, 300) i" >/dev/null
check "the 300 deliveries are completed" wait_until 60 none_pending "$db" paced
check_topic_has "the topic holds 300 messages" "$db" paced relay-paced 300 30
kafka_consume relay-paced "$TMP/paced.json"
dump_pub_log "$db" "$TMP/pub.txt"
kafka_order_facts "$TMP/paced.json" "$TMP/pub.txt"
check_eq "nothing is missing" 0 "${R[missing]}"
check_eq "each key in seq order" 0 "${R[out_of_order]}"
py_facts ts "$TMP/paced.json" <<'EOF'
import sys, json, http_log
ts = sorted(json.loads(line)["ts"] / 1000.0 for line in open(sys.argv[1]) if line.strip())
later = [t for t in ts if t >= ts[0] + 1.0] or ts
http_log.facts(dict(n=len(ts), rate=f"{(len(later) - 1) / max(later[-1] - later[0], 1e-3):.1f}",
                    span=f"{ts[-1] - ts[0]:.1f}"))
EOF
log "rate 40, burst 4: $(r rate) messages/s by their timestamps over $(r span) s"
check "rate 40: messages per second within 10 % of 40 ($(r rate))" \
    awk -v v="$(r rate)" 'BEGIN { exit !(v >= 36 && v <= 44) }'
check "relay.handler_stats counts the deliveries held back" test "$(handler_stat "$db" paced held_back)" -gt 0
finish
