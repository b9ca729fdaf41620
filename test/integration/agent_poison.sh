#!/usr/bin/env bash
# relaybus-agent's poison isolation (docs/managed.md, "relaybus-agent"), the
# extension's poison_isolation.sh against the managed SQL edition on a cluster
# without relaybus:
#  - two fire-mode notify handlers; the first delivery of the second one is
#    made unsendable (a superuser sets its wire topic to 9000 bytes, so even its
#    by-reference NOTIFY is longer than PostgreSQL's 8000-byte limit:
#    "payload string too long", SQLSTATE 22023, a data error), in the same
#    transaction as 10 good deliveries per handler;
#  - the poison delivery is dead-lettered (max_attempts 1) with that error and
#    every other delivery of both handlers arrives; then batches again;
#  - a poison delivery of a handler with max_attempts 2: retried once
#    (attempt 1, last_error set), then dead-lettered with 2 attempts;
#  - an environmental error (the agent's role loses EXECUTE on the notify
#    function: 42501): backed off, no attempt charged, delivered once the
#    grant is back.
# Without isolation the agent retried the failing iteration as a whole every
# second: the second handler's good deliveries never arrived.
export PGHOST=${PGHOST:-/nonexistent} PGPORT=${PGPORT:-1}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/managed_lib.sh"
managed_traps

DB=poisondb
OWNER=relay_owner
log "building relaybus-agent and the managed script; a cluster without relaybus"
agent_database "$OWNER" "$DB"
own() { psql_q -U "$OWNER" -d "$DB" "$@"; }
su() { psql_q -U postgres -d "$DB" "$@"; }

own -c "SELECT relay_create_handler('first', 'notify', 'it_poison_a', '{\"max_attempts\": 1}')" \
    -c "SELECT relay_route('pa.#', 'first')" \
    -c "SELECT relay_create_handler('second', 'notify', 'it_poison_b', '{\"max_attempts\": 1}')" \
    -c "SELECT relay_route('pb.#', 'second')" \
    -c "SELECT relay_create_handler('third', 'notify', 'it_poison_c',
                                    '{\"max_attempts\": 2, \"backoff_base\": \"200ms\", \"backoff_max\": \"200ms\"}')" \
    -c "SELECT relay_route('pc.#', 'third')" >/dev/null || die "could not create the handlers"
start_client a "$DB" it_poison_a || die "client a"
start_client b "$DB" it_poison_b || die "client b"
start_client c "$DB" it_poison_c || die "client c"

"$RELAYBUS_ROOT/relaybus-agent" --database "host=$PGHOST port=$PGPORT dbname=$DB user=agent_login" \
    --log-level debug --metrics-addr 127.0.0.1:0 2>"$TMP/agent.log" &
AGENT_PID=$!
bg_track "$AGENT_PID"
check "the agent connects" wait_until 30 grep -q '"msg":"handlers loaded"' "$TMP/agent.log"

log "publishing the poison delivery and 10 good ones per handler in one transaction"
su -c "BEGIN" \
    -c "SELECT relay_publish('pb.bad', '{\"poison\": true}', 'bad-key')" \
    -c "UPDATE relay.deliveries SET wire_topic = repeat('t', 9000) WHERE topic = 'pb.bad'" \
    -c "SELECT relay_publish('pa.good', jsonb_build_object('n', g), 'a' || (g % 3)) FROM generate_series(1, 10) g" \
    -c "SELECT relay_publish('pb.good', jsonb_build_object('n', g), 'b' || (g % 3)) FROM generate_series(1, 10) g" \
    -c "COMMIT" >/dev/null || die "could not publish"

check "the first handler's 10 deliveries arrive" wait_lines "$TMP/a.out" 10 30
check "the second handler's 10 good deliveries arrive" wait_lines "$TMP/b.out" 10 30
# logged FROM TEXT...: a line of the agent's log from line FROM on has every TEXT
# (a line's keys are in alphabetical order).
logged() {
    local from=$1 line t
    shift
    while IFS= read -r line; do
        for t in "$@"; do [[ $line == *"$t"* ]] || continue 2; done
        return 0
    done < <(tail -n +"$from" "$TMP/agent.log")
    return 1
}
dead_is() { [[ $(su -c "SELECT count(*) FROM relay.dead_letters WHERE topic = '$1'") == "$2" ]]; }
check "the poison delivery is dead-lettered" wait_until 30 dead_is pb.bad 1
check_eq "its dead letter: handler second, 1 attempt, the NOTIFY error" "second|1|t" \
    "$(su -c "SELECT handler, attempts, last_error LIKE '%payload string too long%'
              FROM relay.dead_letters WHERE topic = 'pb.bad'")"
check_eq "no delivery is left" 0 "$(su -c "SELECT count(*) FROM relay.deliveries")"
check_eq "no good delivery was dead-lettered" 0 \
    "$(su -c "SELECT count(*) FROM relay.dead_letters WHERE topic <> 'pb.bad'")"
check_eq "each good delivery arrived once" "10 10 10 10" \
    "$(wc -l <"$TMP/a.out") $(cut -f2 "$TMP/a.out" | sort -u | wc -l) $(wc -l <"$TMP/b.out") $(cut -f2 "$TMP/b.out" | sort -u | wc -l)"
check "the agent logged the iteration's error as the delivery's (22023)" \
    logged 1 '"msg":"notify iteration failed"' '"cause":"delivery"' '"sqlstate":"22023"'
check "and the delivery that failed alone" logged 1 '"msg":"delivery failed alone"' '"handler":"second"'
check "and its dead letter" logged 1 '"msg":"dead letter"' '"handler":"second"'

log "after the poison delivery, batches again: 200 deliveries flow"
mark=$(wc -l <"$TMP/agent.log")
su -c "SELECT relay_publish('pb.more', jsonb_build_object('n', g), 'm' || (g % 7)) FROM generate_series(1, 200) g" \
    >/dev/null
check "the 200 further deliveries arrive" wait_lines "$TMP/b.out" 210 30
check "in batches (an iteration sent more than one)" \
    bash -c "tail -n +$((mark + 1)) '$TMP/agent.log' | grep '\"msg\":\"notified\"' | grep -qv '\"count\":1[,}]'"

log "a poison delivery of a handler with max_attempts 2, published after good ones"
su -c "BEGIN" \
    -c "SELECT relay_publish('pc.good', jsonb_build_object('n', g), 'c' || (g % 3)) FROM generate_series(1, 10) g" \
    -c "SELECT relay_publish('pc.bad', '{\"poison\": true}', 'bad-key')" \
    -c "UPDATE relay.deliveries SET wire_topic = repeat('t', 9000) WHERE topic = 'pc.bad'" \
    -c "COMMIT" >/dev/null || die "could not publish"
check "the third handler's 10 good deliveries arrive" wait_lines "$TMP/c.out" 10 30
check "the poison delivery is dead-lettered after its second attempt" wait_until 30 dead_is pc.bad 1
check_eq "its dead letter: handler third, 2 attempts, the NOTIFY error" "third|2|t" \
    "$(su -c "SELECT handler, attempts, last_error LIKE '%payload string too long%'
              FROM relay.dead_letters WHERE topic = 'pc.bad'")"
check "its first failure was a retry" logged 1 '"msg":"retry"' '"handler":"third"'
check "/metrics: the third handler retried 1, dead 1" \
    bash -c "port=\$(grep -o '\"port\":[0-9]*' '$TMP/agent.log' | head -1 | cut -d: -f2);
             m=\$(curl -s http://127.0.0.1:\$port/metrics);
             grep -qx 'relaybus_agent_retried_total{handler=\"third\"} 1' <<<\"\$m\" &&
             grep -qx 'relaybus_agent_dead_total{handler=\"third\"} 1' <<<\"\$m\""

log "an environmental error: the agent's role may not execute the notify function for a while"
su -c "REVOKE EXECUTE ON FUNCTION relay._agent_notify FROM relay_agent" >/dev/null || die "could not revoke"
mark=$(wc -l <"$TMP/agent.log")
su -c "SELECT relay_publish('pa.env', '{\"n\": 1}', 'env')" >/dev/null
check "the agent logs an environmental error (42501)" wait_until 30 \
    logged $((mark + 1)) '"msg":"notify iteration failed"' '"cause":"environment"' '"sqlstate":"42501"'
sleep 2
check_eq "nothing charged: attempt 0, no last_error, not delivered" "0||10" \
    "$(su -c "SELECT attempt, coalesce(last_error, '') FROM relay.deliveries WHERE topic = 'pa.env'")|$(wc -l <"$TMP/a.out")"
check "and it backs off (fewer than 30 failed iterations in 2 s)" \
    bash -c "(( \$(tail -n +$((mark + 1)) '$TMP/agent.log' | grep -c '\"msg\":\"notify iteration failed\"') < 30 ))"
su -c "GRANT EXECUTE ON FUNCTION relay._agent_notify TO relay_agent" >/dev/null || die "could not grant"
check "delivered once the grant is back" wait_lines "$TMP/a.out" 11 30
check_eq "no dead letter for it" 0 "$(su -c "SELECT count(*) FROM relay.dead_letters WHERE topic = 'pa.env'")"

kill -TERM "$AGENT_PID"
wait_pid "$AGENT_PID" 30
check_eq "SIGTERM: exit 0" 0 "$WAIT_RC"
finish
