#!/usr/bin/env bash
# The NOTIFY a fire-mode notify handler sends is, byte for byte, the
# jsonb_build_object(...)::text of its delivery (the form consumers have always
# received; the dispatcher writes it itself since issue 14): keys in jsonb's
# order, escapes in keys and topics, NULL keys and headers, wire names, scalar,
# nested, unicode and big-number payloads, a retried delivery's attempt.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHANNEL=it_payload
new_db db payload || die "could not create a database"
notify_handler "$db" np "$CHANNEL" '{"ack": false}' 'np.#' || die "could not create the handler"
sql "$db" "SELECT relay_route('wt.#', 'np', 'wired.name')" >/dev/null || die "could not route the wire name"
check "a dispatcher serves the new database" wait_workers "$db" 1 20
sql "$db" "SELECT relay_pause_handler('np')" >/dev/null || die "could not pause the handler"

# Published while paused: nothing goes out until the expected texts are taken.
cat >"$TMP/publish.sql" <<'SQL'
SELECT relay_publish('np.a', '{"n": 1, "s": "é \"q\" \n tab\t", "deep": {"z": [1, 2.50, -3e2, null, true]}}', 'k "quoted" \ back');
SELECT relay_publish('np.b', '"just a string"');
SELECT relay_publish('np.c', '12345678901234567890123.000', 'ключ', headers => '{"h": "v", "a": [1]}');
SELECT relay_publish('np.d', '[]', E'line\nbreak', priority => 3);
SELECT relay_publish('wt.x', '{"big": 9223372036854775807, "neg": -0.0001}', 'wk');
SELECT relay_publish('np.e', 'null');
SELECT relay_publish('np.f', '{"u": "\u0001 ☃ \ud83d\ude00"}');
SQL
psql_q -d "$db" -f "$TMP/publish.sql" >/dev/null || die "could not publish"
# A delivery that failed once goes out with attempt 2.
sql "$db" "UPDATE relay.deliveries SET attempt = 1 WHERE topic = 'np.e'" >/dev/null
check_eq "7 deliveries wait" 7 "$(sql "$db" "SELECT count(*) FROM relay.deliveries")"

sql "$db" "SELECT pg_catalog.jsonb_build_object('id', d.id, 'event_id', d.event_id,
                  'topic', coalesce(d.wire_topic, d.topic), 'key', d.key, 'seq', d.seq,
                  'attempt', d.attempt + 1, 'headers', d.headers, 'payload', d.payload)::text
             FROM relay.deliveries d ORDER BY d.id" | sort >"$TMP/expected"

start_client main "$db" "$CHANNEL" || die "the LISTEN client did not start"
sql "$db" "SELECT relay_resume_handler('np')" >/dev/null
check "all 7 arrive" wait_lines "$TMP/main.out" 7 20
cut -f2 "$TMP/main.out" | sort >"$TMP/received"
check "each payload is the delivery's jsonb_build_object text, byte for byte" cmp "$TMP/expected" "$TMP/received"
if ! cmp -s "$TMP/expected" "$TMP/received"; then diff "$TMP/expected" "$TMP/received" | head -20 >&2; fi
check "the wire name is the topic" grep -q '"topic": "wired.name"' "$TMP/received"
check "the retried delivery says attempt 2" grep -q '"attempt": 2, "headers": null, "payload": null' "$TMP/received"
check_eq "nothing is left" 0 "$(sql "$db" "SELECT count(*) FROM relay.deliveries")"

finish
