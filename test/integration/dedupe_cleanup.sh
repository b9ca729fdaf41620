#!/usr/bin/env bash
# relay.dedupe rows past their window are removed by the dispatchers (every
# relaybus.dedupe_cleanup_interval, a bounded batch); live ones stay and keep
# deduping.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# 10 s by default: the wait below ends when the rows are gone, so a shorter
# interval only shortens the wait.
set_conf relaybus.dedupe_cleanup_interval 1s || die "could not set relaybus.dedupe_cleanup_interval"
new_db db dedupe || die "could not create a database"
check "a dispatcher serves the database" wait_workers "$db" 1 20
sql "$db" "SELECT relay_publish('dd.x', jsonb_build_object('n', g), dedupe_key => 'old' || g) FROM generate_series(1, 50) g" \
    "SELECT relay_publish('dd.x', '{}', dedupe_key => 'live')" >/dev/null || die "could not publish"
live=$(sql "$db" "SELECT event_id FROM relay.dedupe WHERE key = 'live'")
sql "$db" "UPDATE relay.dedupe SET expires_at = now() - interval '1 second' WHERE key LIKE 'old%'" >/dev/null
expired_gone() { [[ $(sql "$db" "SELECT count(*) FROM relay.dedupe WHERE key LIKE 'old%'") == 0 ]]; }
check "the 50 expired rows are removed" wait_until 25 expired_gone
check_eq "the live row stays and still dedupes" "$live" "$(sql "$db" "SELECT relay_publish('dd.x', '{}', dedupe_key => 'live')")"
finish
