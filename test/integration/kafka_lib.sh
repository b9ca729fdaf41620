# Kafka helpers for the integration tests (sourced after lib.sh): a real
# single-node broker (scripts/kafka-broker.sh) stopped by the EXIT trap, and a
# real consumer (kcat, librdkafka's) that reads a topic back as JSON lines.

KAFKA_DIR=$TMP/kafka
KAFKA_PORT=
KAFKA_SCRIPT=$RELAYBUS_ROOT/scripts/kafka-broker.sh
# A kafka handler's key_window when it sets none (core::kDefaultKeyWindow).
DEFAULT_KEY_WINDOW=$(sed -n 's/.*kDefaultKeyWindow = \([0-9]*\);.*/\1/p' "$RELAYBUS_ROOT/src/core/handler_config.hpp")
[[ -n "$DEFAULT_KEY_WINDOW" ]] || die "kDefaultKeyWindow not found in src/core/handler_config.hpp"

command -v kcat >/dev/null 2>&1 || die "kcat is needed (scripts/install-deps.sh installs it)"

# The broker goes with everything else the test started.
eval "$(declare -f cleanup | sed '1s/^cleanup/lib_cleanup/')"
cleanup() {
    [[ -d "$KAFKA_DIR" ]] && bash "$KAFKA_SCRIPT" stop "$KAFKA_DIR" >/dev/null 2>&1
    lib_cleanup
}

# kafka_start: a fresh broker on a free loopback port (KAFKA_PORT, KAFKA_BOOTSTRAP).
# kafka_pick_port alone sets those, for a caller that starts the broker in the
# background (kafka_start &) beside its own setup.
kafka_pick_port() {
    KAFKA_PORT=$(python3 "$RELAYBUS_ROOT/scripts/free-port.py")
    KAFKA_BOOTSTRAP=127.0.0.1:$KAFKA_PORT
}
kafka_start() {
    [[ -n "$KAFKA_PORT" ]] || kafka_pick_port
    bash "$KAFKA_SCRIPT" start "$KAFKA_DIR" "$KAFKA_PORT"
}
# kafka_stop / kafka_restart: the same broker (its data and port kept).
kafka_stop() { bash "$KAFKA_SCRIPT" stop "$KAFKA_DIR"; }
kafka_restart() { bash "$KAFKA_SCRIPT" start "$KAFKA_DIR" "$KAFKA_PORT"; }

# kafka_create_topic TOPIC PARTITIONS [CONFIG=VALUE...]: through librdkafka's
# admin API (kafka_topic.cpp, built here once): Kafka's own TopicCommand
# would start a JVM, 2 s of CPU, for each topic.
KAFKA_TOPIC=$RELAYBUS_ROOT/test/integration/build/kafka_topic
source "$RELAYBUS_ROOT/test/integration/build_program.sh"
build_program "$KAFKA_TOPIC" "$RELAYBUS_ROOT/test/integration/kafka_topic.cpp" -lrdkafka ||
    die "could not build $KAFKA_TOPIC"
kafka_create_topic() {
    local topic=$1 partitions=$2
    shift 2
    "$KAFKA_TOPIC" "$KAFKA_BOOTSTRAP" "$topic" "$partitions" "$@"
}

# kafka_consume TOPIC FILE: every message now in the topic, one JSON object a
# line (kcat -J: partition, offset, key, payload, headers as [name, value, ...]).
# Bounded: a topic whose leader is still being elected can keep kcat waiting
# (fresh-root.sh saw kafka_outage hang for 20 minutes in its first kafka_has).
kafka_consume() {
    timeout -k 5 "${KCAT_TIMEOUT:-30}" kcat -C -b "$KAFKA_BOOTSTRAP" -t "$1" -J -e -q -o beginning >"$2" 2>"$2.err"
}
kafka_count() { kafka_consume "$1" "$TMP/count.json" && wc -l <"$TMP/count.json"; }
# kafka_has TOPIC N: the topic holds at least N messages. Reads at most N
# (-c N), so it needs no end-of-partition from every partition, and a read cut
# off by its bound still counts what it got: under a steady stream of
# produces, waiting for EOF on all partitions is what CI once saw stall.
kafka_has() {
    timeout -k 5 "${KCAT_HAS_TIMEOUT:-20}" kcat -C -b "$KAFKA_BOOTSTRAP" -t "$1" -J -e -q -o beginning -c "$2" \
        >"$TMP/has.json" 2>"$TMP/has.err"
    (($(wc -l <"$TMP/has.json") >= $2))
}
# kafka_diag DB HANDLER TOPIC: what a failed wait saw, as # lines (the
# handler's deliveries and errors, the consumer's and the broker's complaints).
kafka_diag() {
    log "diag: $(sql "$1" "SELECT format('pending=%s attempted=%s max_attempt=%s last_error=%s',
            count(*), count(*) FILTER (WHERE d.attempt > 0), max(d.attempt), max(d.last_error))
        FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = '$2'")"
    log "diag: stats $(sql "$1" "SELECT row_to_json(s) FROM relay.handler_stats s WHERE handler = '$2'")"
    log "diag: workers $(sql "$1" "SELECT string_agg(format('%s %s', pid, last_error), '; ') FROM relay.workers")"
    log "diag: kcat read $(wc -l <"$TMP/has.json" 2>/dev/null) lines; stderr: $(head -c 400 "$TMP/has.err" 2>/dev/null)"
    log "diag: topic metadata $(timeout 10 kcat -L -b "$KAFKA_BOOTSTRAP" -t "$3" -J 2>&1 | head -c 600)"
    log "diag: broker log $(grep -E 'WARN|ERROR' "$KAFKA_DIR/server.log" 2>/dev/null | tail -n 5 | cut -c1-300)"
}

# kafka_publish_loop DB SQL PAUSE: runs SQL (%B% in it is the round, 1 to
# 600) then sleeps PAUSE seconds, until $TMP/stop-publishing exists; a round
# that fails (the server crash-restarting) is skipped.
kafka_publish_loop() {
    local b
    for ((b = 1; b <= 600; b++)); do
        [[ -e "$TMP/stop-publishing" ]] && break
        psql_q -d "$1" -c "${2//%B%/$b}" >/dev/null 2>&1 || sleep 0.5
        sleep "$3"
    done
}

# pub_log_has DB N: at least N events committed in pub_log.
pub_log_has() { (($(sql "$1" "SELECT count(*) FROM pub_log") >= $2)); }

# kafka_kill_mid_stream DB OLD_PID PUBLISHER MORE [AFTER_KILL]: kill -9 of
# the dispatcher OLD_PID while PUBLISHER (a kafka_publish_loop) commits, then
# the command AFTER_KILL; once the server and a new dispatcher are back and
# MORE events more were committed, publishing stops.
kafka_kill_mid_stream() {
    local db=$1 old=$2 publisher=$3 at_kill
    at_kill=$(sql "$db" "SELECT count(*) FROM pub_log")
    kill -9 "$old"
    log "kill -9 of dispatcher $old with about $at_kill events committed"
    [[ -n "${5:-}" ]] && $5
    after_dispatcher_kill "$db" "$old"
    check "publishing goes on after the crash" wait_until 60 pub_log_has "$db" $((at_kill + $4))
    touch "$TMP/stop-publishing"
    wait "$publisher"
}

# kafka_order_facts TOPIC_JSON PUB_TXT: kafka_order.py's facts into R.
kafka_order_facts() {
    local line
    R=()
    while IFS= read -r line; do R[${line%%=*}]=${line#*=}; done < <(python3 "$INTEG_DIR/kafka_order.py" "$@")
}

# kafka_handler DB NAME TOPIC OPTIONS PATTERN
kafka_handler() {
    sql "$1" "SELECT relay_create_handler('$2', 'kafka', 'kafka://$KAFKA_BOOTSTRAP/$3', '$4')" \
        "SELECT relay_route('$5', '$2')" >/dev/null
}

# sqlstate_of DB QUERY: "SQLSTATE: message" of the error QUERY raises, or "no error".
sqlstate_of() {
    psql -X -q -At -d "$1" -v ON_ERROR_STOP=1 -c "DO \$do\$ BEGIN PERFORM ($2); RAISE NOTICE 'no error';
        EXCEPTION WHEN OTHERS THEN RAISE NOTICE '%: %', SQLSTATE, SQLERRM; END \$do\$" 2>&1 </dev/null |
        sed -n 's/^NOTICE:  //p'
}

# check_topic_has NAME DB HANDLER TOPIC N SECONDS: a check that TOPIC holds N
# messages within SECONDS; on failure it logs kafka_diag first.
check_topic_has() {
    if wait_until "$6" kafka_has "$4" "$5"; then
        pass "$1"
    else
        kafka_diag "$2" "$3" "$4"
        fail "$1" "fewer than $5 messages in $4 after $6 s"
    fi
}

# kafka_gap_case DB WINDOW [LABEL]: the gap rule (docs/kafka.md, "A busy key
# pipelined") with the real broker: handler gap on topic relay-gap, whose
# max.message.bytes seq 5 of a run of 10 of key g exceeds (batch.size below
# it keeps the broker's refusal to that one's batch). Checks that seq 5 is
# dead at its first attempt with the broker's error, the rest delivered, and
# the partition holding 1 2 3 4 6 7 8 9 10; LABEL starts each check's name.
kafka_gap_case() {
    local db=$1 window=$2 label=${3:-}
    kafka_create_topic relay-gap 1 max.message.bytes=2000 || die "could not create topic relay-gap"
    kafka_handler "$db" gap relay-gap \
        "{\"key_window\": $window, \"backoff_base\": \"100ms\", \"max_attempts\": 10, \"producer\": {\"batch.size\": \"1500\"}}" \
        'kg.#' || die "could not create the handler"
    # Paused while publishing, so that the ten are claimed as one run.
    sql "$db" "SELECT relay_pause_handler('gap')" \
        "SELECT relay_publish('kg.ev', CASE WHEN i = 5 THEN jsonb_build_object('i', i, 'blob', repeat('x', 5000))
                                            ELSE jsonb_build_object('i', i) END, 'g')
           FROM generate_series(1, 10) i" \
        "SELECT relay_resume_handler('gap')" >/dev/null
    check "${label}the large one is dead" wait_until 60 dead_is "$db" gap 1
    check "${label}the others are delivered" wait_until 60 none_pending "$db" gap
    check_eq "${label}dead on its first attempt with the broker's error, seq 5" \
        "1|5|kafka: Broker: Message size too large (MSG_SIZE_TOO_LARGE)" \
        "$(sql "$db" "SELECT attempts, seq, last_error FROM relay.dead_letters WHERE handler = 'gap'")"
    check_topic_has "${label}nine messages in the topic" "$db" gap relay-gap 9 20
    kafka_consume relay-gap "$TMP/gap.json"
    check_eq "${label}the key's seqs in the partition: the gap at 5, the later ones after it" "1 2 3 4 6 7 8 9 10" \
        "$(python3 -c 'import json,sys
ms=sorted((json.loads(l) for l in open(sys.argv[1]) if l.strip()), key=lambda m: m["offset"])
print(" ".join(dict(zip(m["headers"][0::2], m["headers"][1::2]))["relay-seq"] for m in ms))' "$TMP/gap.json")"
}

# kafka_deliveries_agg DB HANDLER EXPR [KEY]: EXPR (an aggregate over d) of
# HANDLER's pending deliveries, of KEY's alone if given.
kafka_deliveries_agg() {
    sql "$1" "SELECT $3 FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
              WHERE h.name = '$2'${4:+ AND d.key = '$4'}"
}
kafka_agg_at_least() { (($(kafka_deliveries_agg "$1" "$2" "$3" "${5:-}") >= $4)); }  # DB HANDLER EXPR MIN [KEY]

# kafka_backlog_flowing DB HANDLER MIN [LABEL [KEY STEP]]: with publishers
# committing, HANDLER is paused until more than MIN of its deliveries (of KEY)
# are pending, and resumed; it returns once the oldest of them is completed
# (KEY's head has moved STEP seqs) while others are pending, so that a kill or
# a freeze after it comes mid-stream. Waiting for a moment with a backlog
# instead fails on a loaded machine, where the deliverer drains each slowed
# publisher's transaction before a poll sees it.
kafka_backlog_flowing() {
    local head=d.id start
    [[ -n ${5:-} ]] && head=d.seq
    sql "$1" "SELECT relay_pause_handler('$2')" >/dev/null
    check "${4:-}paused, more than $3 deliveries${5:+ of key $5} are pending" \
        wait_until 60 kafka_agg_at_least "$1" "$2" "count(*)" $(($3 + 1)) "${5:-}"
    start=$(kafka_deliveries_agg "$1" "$2" "min($head)" "${5:-}")
    sql "$1" "SELECT relay_resume_handler('$2')" >/dev/null
    check "${4:-}resumed, ${6:-the oldest} of them completed while others are pending (the stream flows)" \
        wait_until 60 kafka_agg_at_least "$1" "$2" "coalesce(min($head), 0)" $((start + ${6:-1})) "${5:-}"
}

# kafka_freeze_mid_window DB HANDLER KEY WINDOW [LABEL [IN_FLIGHT CMD...]]:
# with publishers committing on KEY, once four windows of KEY were held back
# and a window of them is completed (kafka_backlog_flowing: the stream flows,
# so the broker has written some of what is in flight), the broker is frozen
# (SIGSTOP; BROKER_PID for the kill -CONT):
# the deliverer's runs go out and wait for their acknowledgements, so a kill
# then comes with whole windows in flight; thawed after it, the broker writes
# what it had received. A deliverer sends what it claimed before the freeze,
# which can be less than a window: until WINDOW are in flight (the command
# given prints the count; the extension's relay.handler_stats by default),
# the broker is thawed and frozen again, each time within the handlers'
# 5 s message timeout, at most ten times. KAFKA_IN_FLIGHT is the last count.
kafka_in_flight_of() { sql "$1" "SELECT in_flight FROM relay.handler_stats WHERE handler = '$2'"; }
kafka_freeze_mid_window() {
    kafka_backlog_flowing "$1" "$2" $((4 * $4)) "${5:-}" "$3" "$4"
    local db=$1 handler=$2 window=$4 try
    shift 4
    (($# > 0)) && shift  # the label
    (($# > 0)) || set -- kafka_in_flight_of "$db" "$handler"
    window_in_flight() { KAFKA_IN_FLIGHT=$("$@"); ((${KAFKA_IN_FLIGHT:-0} >= window)); }
    BROKER_PID=$(cat "$KAFKA_DIR/broker.pid")
    for ((try = 1; try <= 10; try++)); do
        kill -STOP "$BROKER_PID"
        wait_until 3 window_in_flight "$@" && return 0
        kill -CONT "$BROKER_PID"
        sleep 0.5
    done
    kill -STOP "$BROKER_PID"
    sleep 2
    KAFKA_IN_FLIGHT=$("$@")
}
