#!/usr/bin/env bash
# The kafka handler kind end to end, with a real broker and a real consumer
# (kcat): every committed event arrives (rolled-back ones do not), each key in
# one partition and in seq order there, with relaybus's headers and the
# event's own; a message too large for its topic is dead-lettered with the
# broker's error; bad targets and options are refused with SQLSTATE 22023;
# producer credentials are readable by relay_admin only.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

kafka_start || die "the broker did not start"
# scripts/free-port.py: outside the range outgoing connections take theirs from.
below_ephemeral() { (($1 < $(cut -f1 /proc/sys/net/ipv4/ip_local_port_range))); }
check "the broker's port ($KAFKA_PORT) is below the ephemeral range" below_ephemeral "$KAFKA_PORT"
controller_port=$(sed -n 's/^listeners=.*CONTROLLER:\/\/127.0.0.1:\([0-9]*\)$/\1/p' "$KAFKA_DIR/server.properties")
check "so is its controller's ($controller_port)" below_ephemeral "${controller_port:-99999}"
new_db db kafka || die "could not create a database"
create_pub_log "$db"
check "a dispatcher serves the new database" wait_workers "$db" 1 20

# (e) refused targets and options, before anything else.
bad() {  # NAME EXPECTED_PREFIX QUERY
    local got
    got=$(sqlstate_of "$db" "$3")
    if [[ "$got" == "$2"* ]]; then pass "$1"; else fail "$1" "expected: $2..." "actual:   $got"; fi
}
bad "a target without a topic" "22023: invalid target for a kafka handler" \
    "relay_create_handler('k1', 'kafka', 'kafka://127.0.0.1:9092')"
bad "a target without a port" "22023: invalid target for a kafka handler" \
    "relay_create_handler('k1', 'kafka', 'kafka://127.0.0.1/t')"
bad "an http URL as a kafka target" "22023: invalid target for a kafka handler" \
    "relay_create_handler('k1', 'kafka', 'http://127.0.0.1:9092/t')"
bad "no target" "22023: invalid target for a kafka handler" \
    "relay_create_handler('k1', 'kafka', NULL)"
if edition_exception "librdkafka's own check of a property's name and value: no librdkafka in the server (docs/managed.md, difference 7)"; then
    check "an unknown property and a bad value are accepted at create time" \
        sql "$db" "SELECT relay_create_handler('k1', 'kafka', 'kafka://127.0.0.1:1/t', '{\"producer\": {\"no.such\": \"1\", \"linger.ms\": \"x\"}}')" \
        "SELECT relay_drop_handler('k1')"
else
    bad "an unknown librdkafka property" \
        '22023: invalid option: option "producer": unknown librdkafka property "no.such"' \
        "relay_create_handler('k1', 'kafka', 'kafka://127.0.0.1:1/t', '{\"producer\": {\"no.such\": \"1\"}}')"
    bad "a bad property value" '22023: invalid option: option "producer": property "linger.ms"' \
        "relay_create_handler('k1', 'kafka', 'kafka://127.0.0.1:1/t', '{\"producer\": {\"linger.ms\": \"x\"}}')"
fi
bad "a pinned property" '22023: invalid option: option "producer": property "acks" is set by relaybus' \
    "relay_create_handler('k1', 'kafka', 'kafka://127.0.0.1:1/t', '{\"producer\": {\"acks\": \"1\"}}')"
bad "a command-running property" \
    '22023: invalid option: option "producer": property "sasl.kerberos.kinit.cmd" is not allowed' \
    "relay_create_handler('k1', 'kafka', 'kafka://127.0.0.1:1/t', '{\"producer\": {\"sasl.kerberos.kinit.cmd\": \"id\"}}')"
bad "a webhook secret on a kafka handler" '22023: invalid option: option "secret" is only valid for http handlers' \
    "relay_create_handler('k1', 'kafka', 'kafka://127.0.0.1:1/t', '{\"secret\": \"whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3\"}')"
sql "$db" "SELECT relay_create_handler('creds', 'kafka', 'kafka://127.0.0.1:1/t',
             '{\"producer\": {\"security.protocol\": \"SASL_PLAINTEXT\", \"sasl.mechanism\": \"PLAIN\",
                              \"sasl.username\": \"u\", \"sasl.password\": \"hunter2\"}}')" >/dev/null
bad "altering to a pinned property" '22023: invalid option: option "producer": property "enable.idempotence"' \
    "relay_alter_handler('creds', NULL, '{\"producer\": {\"enable.idempotence\": \"false\"}}')"
check_eq "relay_admin reads the producer credentials" hunter2 \
    "$(sql "$db" "SET ROLE relay_admin" "SELECT options->'producer'->>'sasl.password' FROM relay.handlers WHERE name = 'creds'")"
for role in relay_monitor relay_publisher relay_consumer; do
    got=$(psql_q -d "$db" -c "SET ROLE $role" -c "SELECT options FROM relay.handlers" 2>&1)
    check "$role cannot read the handlers' options (permission denied)" \
        grep -qE "permission denied for (table handlers|schema relay)" <<<"$got"
done
sql "$db" "SELECT relay_drop_handler('creds')" >/dev/null

# (a) committed events arrive, rolled-back ones do not; key order; headers.
kafka_handler "$db" k "relay-it" '{"backoff_base": "100ms", "backoff_max": "1s", "concurrency": 64}' 'ka.#' ||
    die "could not create the handler"
sql "$db" "INSERT INTO pub_log SELECT relay_publish('ka.ev', jsonb_build_object('i', i), 'k-' || (i % 5),
                                                    jsonb_build_object('trace', 't-' || i, 'n', i)), 'k-' || (i % 5)
             FROM generate_series(1, 100) i" \
    "INSERT INTO pub_log SELECT relay_publish('ka.unkeyed', jsonb_build_object('u', i)), NULL
             FROM generate_series(1, 10) i" >/dev/null
psql_q -d "$db" -c "BEGIN" -c "SELECT relay_publish('ka.ev', '{\"rolled\": \"back\"}', 'k-rb') FROM generate_series(1, 10)" \
    -c "ROLLBACK" >/dev/null
check "every delivery is completed (acknowledged by the broker)" wait_until 60 none_pending "$db" k
check_eq "nothing is dead" 0 "$(dead_of "$db" k)"
check_topic_has "the topic holds 110 messages" "$db" k relay-it 110 30
kafka_consume relay-it "$TMP/a.json"
dump_pub_log "$db" "$TMP/pub.txt"
py_facts order "$TMP/a.json" "$TMP/pub.txt" <<'PY'
import json, sys
pub = {}
for line in open(sys.argv[2]):
    eid, _, key = line.rstrip("\n").partition("|")
    pub[int(eid)] = key or None
msgs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
msgs.sort(key=lambda m: (m["partition"], m["offset"]))
seen, parts, last_seq, bad_order, bad_headers = {}, {}, {}, 0, 0
for m in msgs:
    h = dict(zip(m["headers"][0::2], m["headers"][1::2])) if m.get("headers") else {}
    eid = int(h["relay-event-id"])
    seen[eid] = seen.get(eid, 0) + 1
    key = m.get("key")
    if key != pub.get(eid) or h.get("relay-key") != pub.get(eid):
        bad_headers += 1
    if not h.get("relay-id") or h.get("relay-attempt") != "1" or "relay-published-at" not in h:
        bad_headers += 1
    if key is None:
        if h.get("relay-topic") != "ka.unkeyed" or json.loads(m["payload"]).get("u") is None:
            bad_headers += 1
        continue
    if h.get("relay-topic") != "ka.ev" or h.get("trace") != "t-%d" % json.loads(m["payload"])["i"] or "n" in h:
        bad_headers += 1
    parts.setdefault(key, set()).add(m["partition"])
    seq = int(h["relay-seq"])
    if seq != last_seq.get(key, 0) + 1:
        bad_order += 1
    last_seq[key] = seq
print("messages=%d" % len(msgs))
print("missing=%d" % len(set(pub) - set(seen)))
print("extra=%d" % len(set(seen) - set(pub)))
print("duplicates=%d" % sum(c - 1 for c in seen.values()))
print("keys_in_one_partition=%s" % all(len(p) == 1 for p in parts.values()))
print("out_of_order=%d" % bad_order)
print("bad_headers=%d" % bad_headers)
PY
check_eq "every committed event arrived" 0 "${R[missing]:-?}"
check_eq "no rolled-back (or other) event arrived" 0 "${R[extra]:-?}"
check_eq "no duplicates" 0 "${R[duplicates]:-?}"
check_eq "each key in one partition" True "${R[keys_in_one_partition]:-?}"
check_eq "per key in seq order" 0 "${R[out_of_order]:-?}"
check_eq "message key, relay-* and the event's headers" 0 "${R[bad_headers]:-?}"
await_counters "$db"
check_eq "handler_metrics counts them delivered" 110 \
    "$(sql "$db" "SELECT delivered FROM relay.handler_metrics WHERE handler = 'k'")"

# (d) too large for the topic: dead at once with the broker's error.
kafka_create_topic relay-small 1 max.message.bytes=1000 || die "could not create topic relay-small"
kafka_handler "$db" small "relay-small" \
    '{"backoff_base": "100ms", "max_attempts": 10, "producer": {"batch.size": "1000"}}' 'kb.#' ||
    die "could not create the handler"
sql "$db" "SELECT relay_publish('kb.big', jsonb_build_object('blob', repeat('x', 5000)), 'big')" \
    "SELECT relay_publish('kb.small', '{\"s\": 1}', 'small')" >/dev/null
check "the large one is dead" wait_until 30 dead_is "$db" small 1
check "the small one is delivered" wait_until 30 none_pending "$db" small
check_eq "dead on its first attempt with the broker's error" \
    "1|kafka: Broker: Message size too large (MSG_SIZE_TOO_LARGE)" \
    "$(sql "$db" "SELECT attempts, last_error FROM relay.dead_letters WHERE handler = 'small'")"
check_topic_has "the small one is in its topic" "$db" small relay-small 1 20
finish
