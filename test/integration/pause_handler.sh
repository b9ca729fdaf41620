#!/usr/bin/env bash
# relay_pause_handler / relay_resume_handler with the dispatchers running: two
# notify handlers receive the same events; while one is paused, the other gets
# every delivery and the paused one's wait (publishing goes on); resumed, it
# gets them all, in key order.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new_db db pause || die "could not create a database"
create_pub_log "$db"
notify_handler "$db" active it_pause_a '{"ack": false}' 'pz.#' || die "handler active"
notify_handler "$db" paused it_pause_b '{"ack": false}' 'pz.#' || die "handler paused"
check "a dispatcher serves the database" wait_workers "$db" 1 20
start_client a "$db" it_pause_a || die "client a"
start_client b "$db" it_pause_b || die "client b"

check "relay_pause_handler('paused')" sql "$db" "SELECT relay_pause_handler('paused')"
sql "$db" "INSERT INTO pub_log SELECT relay_publish('pz.x', jsonb_build_object('n', g), 'k' || (g % 3)), 'k' || (g % 3)
           FROM generate_series(1, 50) g" >/dev/null || die "could not publish"
check "the active handler receives all 50" wait_lines "$TMP/a.out" 50 20
active_drained() {
    [[ $(sql "$db" "SELECT pending FROM relay.handler_stats WHERE handler = 'active'") == 0 ]]
}
check "the active handler has nothing pending" wait_until 10 active_drained
check_eq "the paused handler received nothing; its 50 deliveries wait, shown paused" "0|50|t" \
    "$(line_count "$TMP/b.out")|$(sql "$db" "SELECT pending, paused FROM relay.handler_stats WHERE handler = 'paused'")"

check "relay_resume_handler('paused')" sql "$db" "SELECT relay_resume_handler('paused')"
check "the resumed handler receives all 50" wait_lines "$TMP/b.out" 50 20
dump_pub_log "$db" "$TMP/published"
analyze --published "$TMP/published" "$TMP/b.out" || die "could not analyze"
check_eq "each once, in key order" "50|0|0|0" "${R[distinct]}|${R[missing]}|${R[dups]}|${R[order_violations]}"
finish
