#!/usr/bin/env bash
# A poison delivery is isolated across all handlers, one delivery at a time:
#  - two fire-mode notify handlers; the first delivery of the second one is
#    made unsendable (a superuser sets its wire topic to 9000 bytes, so even its
#    by-reference NOTIFY is longer than PostgreSQL's 8000-byte limit:
#    "payload string too long", SQLSTATE 22023, a data error);
#  - the poison delivery is dead-lettered (max_attempts 1) with that error and
#    every other delivery of both handlers arrives;
#  - the same with the poison delivery in the other handler, published after
#    the good ones: isolated, the good ones go alone first, the handlers taking
#    turns, until the poison one fails alone.
# On 0.1.0 the dispatcher stalled for ever: its poison mode took one delivery
# per handler, so two were always in flight and none was ever nacked.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new_db db poison || die "could not create a database"
notify_handler "$db" first it_poison_a '{"max_attempts": 1}' 'pa.#' || die "handler first"
notify_handler "$db" second it_poison_b '{"max_attempts": 1}' 'pb.#' || die "handler second"
check "a dispatcher serves the database" wait_workers "$db" 1 20
start_client a "$db" it_poison_a || die "client a"
start_client b "$db" it_poison_b || die "client b"

log "publishing the poison delivery and 10 good ones per handler in one transaction"
sql "$db" "BEGIN" \
    "SELECT relay_publish('pb.bad', '{\"poison\": true}', 'bad-key')" \
    "UPDATE relay.deliveries SET wire_topic = repeat('t', 9000) WHERE topic = 'pb.bad'" \
    "SELECT relay_publish('pa.good', jsonb_build_object('n', g), 'a' || (g % 3)) FROM generate_series(1, 10) g" \
    "SELECT relay_publish('pb.good', jsonb_build_object('n', g), 'b' || (g % 3)) FROM generate_series(1, 10) g" \
    "COMMIT" >/dev/null || die "could not publish"

check "the first handler's 10 deliveries arrive" wait_lines "$TMP/a.out" 10 20
check "the second handler's 10 good deliveries arrive" wait_lines "$TMP/b.out" 10 20
dead_poison() {
    [[ $(sql "$db" "SELECT count(*) FROM relay.dead_letters WHERE topic = 'pb.bad'") == 1 ]]
}
check "the poison delivery is dead-lettered" wait_until 20 dead_poison
check_eq "its dead letter: handler second, 1 attempt, the NOTIFY error" "second|1|t" \
    "$(sql "$db" "SELECT handler, attempts, last_error LIKE '%payload string too long%'
                  FROM relay.dead_letters WHERE topic = 'pb.bad'")"
check_eq "no delivery is left" 0 "$(sql "$db" "SELECT count(*) FROM relay.deliveries")"
check_eq "no good delivery was dead-lettered" 0 \
    "$(sql "$db" "SELECT count(*) FROM relay.dead_letters WHERE topic <> 'pb.bad'")"
check_eq "each good delivery arrived once" "10 10" \
    "$(cut -f2 "$TMP/a.out" | sort -u | wc -l) $(cut -f2 "$TMP/b.out" | sort -u | wc -l)"

log "after the poison delivery, batches again: 200 deliveries flow"
sql "$db" "SELECT relay_publish('pa.more', jsonb_build_object('n', g), 'm' || (g % 7)) FROM generate_series(1, 200) g" \
    >/dev/null
check "the 200 further deliveries arrive" wait_lines "$TMP/a.out" 210 20

log "the poison delivery in the other handler"
# Published last this time: isolated, the good deliveries before it go alone
# first, the handlers taking turns.
sql "$db" "BEGIN" \
    "SELECT relay_publish('pa.good', jsonb_build_object('n', g), 'a' || (g % 3)) FROM generate_series(11, 20) g" \
    "SELECT relay_publish('pb.good', jsonb_build_object('n', g), 'b' || (g % 3)) FROM generate_series(11, 20) g" \
    "SELECT relay_publish('pa.bad', '{\"poison\": true}', 'bad-key')" \
    "UPDATE relay.deliveries SET wire_topic = repeat('t', 9000) WHERE topic = 'pa.bad'" \
    "COMMIT" >/dev/null || die "could not publish"
check "the first handler's 10 good deliveries arrive" wait_lines "$TMP/a.out" 220 20
check "the second handler's 10 deliveries arrive" wait_lines "$TMP/b.out" 20 20
dead_poison_a() {
    [[ $(sql "$db" "SELECT count(*) FROM relay.dead_letters WHERE topic = 'pa.bad'") == 1 ]]
}
check "the poison delivery is dead-lettered" wait_until 20 dead_poison_a
check_eq "its dead letter: handler first, 1 attempt" "first|1" \
    "$(sql "$db" "SELECT handler, attempts FROM relay.dead_letters WHERE topic = 'pa.bad'")"
check_eq "no delivery is left" 0 "$(sql "$db" "SELECT count(*) FROM relay.deliveries")"
check_eq "two dead letters in all" 2 "$(sql "$db" "SELECT count(*) FROM relay.dead_letters")"

finish
