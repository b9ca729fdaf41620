#!/usr/bin/env bash
# What a failed attempt becomes when the handler's options change while it is
# out (docs/guarantees.md, "Failed attempts"): the same scenarios run against
# relaybus-mongo in mongo_parity.sh ("settle rules") and must give the same
# outcomes there.
#  (1) A webhook attempt is judged by the options it was sent with: sent with
#      max_attempts 5, answered 500 after max_attempts was lowered to 1, it is
#      retried once more, and that attempt (sent with max_attempts 1) is the
#      last: a dead letter with attempts = 2.
#  (2) A pull consumer's nack is judged by the options when it nacks: claimed
#      with max_attempts 5, nacked after max_attempts was lowered to 1, it is
#      dead at once (relay_nack says 'dead'; attempts = 1).
#  (3) An expired lease is charged with the options when it is charged:
#      claimed with max_attempts 5, lowered to 1, lease lapsed: the next claim
#      dead-letters it instead of handing it out.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

http_test_db settle_rules

# ================================================================ (1) judged by the options it was sent with
log "(1) a webhook attempt is judged by the options it was sent with"
http_handler "$db" lowered "$URL/lowered" \
    '{"max_attempts": 5, "backoff_base": "100ms", "backoff_max": "200ms", "timeout": "10s"}' 'sr.http' ||
    die "handler lowered"
recv_plan "$RECV_PORT" /lowered '[{"status": 500, "delay": 3}, {"status": 500}]' || die "receiver control"
sql "$db" "SELECT relay_publish('sr.http', '{\"n\": 1}', 'k')" >/dev/null
check "(1) attempt 1 reaches the receiver" wait_requests "$LOG" /lowered 1 20
sql "$db" "SELECT relay_alter_handler('lowered', options => '{\"max_attempts\": 1}')" >/dev/null
check "(1) the delivery ends as a dead letter" wait_until 30 dead_is "$db" lowered 1
check_eq "(1) two attempts: the first judged with max_attempts 5 (retry), the second with 1 (dead)" "2|HTTP 500|500" \
    "$(sql "$db" "SELECT attempts || '|' || last_error || '|' || last_status FROM relay.dead_letters WHERE handler = 'lowered'")"
check_eq "(1) the receiver saw both attempts" 2 "$(recv_count "$LOG" /lowered)"

# ================================================================ (2) a nack: the options when it nacks
log "(2) a pull consumer's nack is judged by the options when it nacks"
sql "$db" "SELECT relay_create_handler('pulled', 'pull', NULL, '{\"max_attempts\": 5}')" \
    "SELECT relay_route('sr.pull', 'pulled')" \
    "SELECT relay_publish('sr.pull', '{\"n\": 2}', 'k')" >/dev/null || die "handler pulled"
claim=$(sql "$db" "SELECT id || ' ' || lease FROM relay_claim('pulled', 1)")
read -r cid clease <<<"$claim"
[[ -n "$clease" ]] || die "no claim: $claim"
sql "$db" "SELECT relay_alter_handler('pulled', options => '{\"max_attempts\": 1}')" >/dev/null
check_eq "(2) relay_nack after max_attempts was lowered to 1: dead" dead \
    "$(sql "$db" "SELECT relay_nack($cid, 'boom', NULL, '$clease')")"
check_eq "(2) the dead letter: one attempt, the nack's error" "1|boom" \
    "$(sql "$db" "SELECT attempts || '|' || last_error FROM relay.dead_letters WHERE handler = 'pulled'")"

# ================================================================ (3) an expiry: the options when it is charged
log "(3) an expired lease is charged with the options when it is charged"
sql "$db" "SELECT relay_alter_handler('pulled', options => '{\"max_attempts\": 5}')" \
    "SELECT relay_publish('sr.pull', '{\"n\": 3}', 'k3')" >/dev/null
check_eq "(3) claimed with a 1 s lease" 1 \
    "$(sql "$db" "SELECT count(*) FROM relay_claim('pulled', 1, interval '1 second')")"
sql "$db" "SELECT relay_alter_handler('pulled', options => '{\"max_attempts\": 1}')" >/dev/null
sleep 1.5
check_eq "(3) after the lease lapsed, the next claim hands out nothing" 0 \
    "$(sql "$db" "SELECT count(*) FROM relay_claim('pulled', 1)")"
check_eq "(3) it dead-lettered the expired delivery: one attempt, 'lease expired'" "1|lease expired" \
    "$(sql "$db" "SELECT attempts || '|' || last_error FROM relay.dead_letters WHERE handler = 'pulled' AND id <> $cid")"

finish
