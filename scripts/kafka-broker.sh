#!/usr/bin/env bash
# A real Apache Kafka broker for the tests: single node, KRaft (broker and
# controller in one JVM), loopback only.
#
#   kafka-broker.sh fetch               jars into the cache (once; a second run downloads nothing)
#   kafka-broker.sh start DIR PORT      formats DIR, starts the broker on 127.0.0.1:PORT
#                                       (controller on a second free port), waits until it serves
#   kafka-broker.sh stop DIR            stops the broker started in DIR (its pid, no other)
#   kafka-broker.sh classpath           prints the class path (kafka-producer-perf-test etc.)
#
# The jars come from Maven Central through Maven's ordinary client
# (dependency:copy-dependencies on a generated pom) into
# ${RELAYBUS_CACHE:-$HOME/.cache/relaybus}/kafka-$KAFKA_VERSION.
# Environment: KAFKA_VERSION (default 4.1.1), KAFKA_HEAP (default -Xmx512m),
# KAFKA_BROKER_OPTS (extra server.properties lines, newline separated).
set -euo pipefail

KAFKA_VERSION=${KAFKA_VERSION:-4.1.1}
LOG4J_VERSION=2.24.3
SLF4J_VERSION=2.0.17
CACHE=${RELAYBUS_CACHE:-$HOME/.cache/relaybus}/kafka-$KAFKA_VERSION

die() { echo "kafka-broker: $*" >&2; exit 1; }

fetch() {
    [[ -f "$CACHE/.complete" ]] && return 0
    command -v mvn >/dev/null || die "maven is missing (scripts/install-deps.sh installs it)"
    mkdir -p "$CACHE"
    # One fetch at a time (run_all.sh runs several suites that start a broker
    # side by side): the others wait, then find the cache complete.
    exec 9>"$CACHE.lock"
    flock 9
    [[ -f "$CACHE/.complete" ]] && { exec 9>&-; return 0; }
    local pom_dir
    pom_dir=$(mktemp -d)
    cat >"$pom_dir/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>relaybus.test</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-server</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version></dependency>
    <!-- Kafka's own jars pull slf4j-api 1.7; log4j-slf4j2-impl binds only 2.x. -->
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>$SLF4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
    echo "kafka-broker: fetching Kafka $KAFKA_VERSION into $CACHE"
    mvn -q -B -f "$pom_dir/pom.xml" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$CACHE/libs" >"$pom_dir/mvn.log" 2>&1 ||
        { cat "$pom_dir/mvn.log" >&2; rm -rf "$pom_dir"; die "mvn dependency:copy-dependencies failed"; }
    rm -rf "$pom_dir"
    ls "$CACHE/libs"/kafka_2.13-*.jar >/dev/null 2>&1 || die "no kafka_2.13 jar in $CACHE/libs"
    touch "$CACHE/.complete"
    exec 9>&-
}

classpath() { fetch; printf '%s' "$CACHE/libs/*"; }

free_port() { python3 "$(dirname "${BASH_SOURCE[0]}")/free-port.py"; }

port_open() {  # PORT
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# write_config DIR PORT CONTROLLER: DIR's server.properties and log4j2.properties.
write_config() {
    local dir=$1 port=$2 controller=$3
    cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=3
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
# An idle test broker's controller appends a no-op record every 500 ms by
# default: a third of the broker's CPU while idle (8.9 against 5.2 ticks a
# second with this), and a run starts a dozen brokers.
metadata.max.idle.interval.ms=10000
${KAFKA_BROKER_OPTS:-}
EOF
    cat >"$dir/log4j2.properties" <<EOF
rootLogger.level=WARN
rootLogger.appenderRef.file.ref=file
appender.file.type=File
appender.file.name=file
appender.file.fileName=$dir/server.log
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
EOF
}

# formatted_data: prints the directory of a formatted, empty log directory in
# the cache, formatting it the first time. Formatting is a JVM of its own (1.6
# CPU-s); what it writes (the cluster id, node 1, the metadata version) holds
# no port and no path, so every test broker starts from a copy of one.
formatted_data() {
    local tpl=$CACHE/formatted
    if [[ ! -f "$tpl/.complete" ]]; then
        exec 8>"$tpl.lock"
        flock 8
        if [[ ! -f "$tpl/.complete" ]]; then
            local tmp cluster_id=-
            tmp=$(mktemp -d "$CACHE/formatting.XXXXXX")
            write_config "$tmp" 1 2
            # The cluster id as StorageTool random-uuid makes it (16 random
            # bytes, URL-safe base64 without padding), without a JVM of its
            # own. Like Kafka's Uuid.randomUuid, never one that starts with
            # "-": format's argument parser takes that for an option.
            while [[ $cluster_id == -* ]]; do
                cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
            done
            java -Xshare:auto -XX:TieredStopAtLevel=1 -cp "$CACHE/libs/*" \
                -Dlog4j2.configurationFile="$tmp/log4j2.properties" \
                kafka.tools.StorageTool format -t "$cluster_id" \
                -c "$tmp/server.properties" >"$tmp/format.log" 2>&1 ||
                { cat "$tmp/format.log" >&2; rm -rf "$tmp"; die "formatting a log directory failed"; }
            rm -rf "$tpl"
            mkdir -p "$tpl"
            mv "$tmp/data" "$tpl/data"
            rm -rf "$tmp"
            touch "$tpl/.complete"
        fi
        exec 8>&-
    fi
    printf '%s' "$tpl/data"
}

start() {
    local dir=$1 port=$2
    fetch
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd -P)
    [[ -f "$dir/broker.pid" ]] && kill -0 "$(cat "$dir/broker.pid")" 2>/dev/null &&
        die "a broker already runs in $dir"
    local controller
    controller=$(free_port)
    [[ "$controller" != "$port" ]] || controller=$(free_port)
    # The same DIR restarted keeps its data (a test stops and starts the broker)
    # and the ports it was given first.
    if [[ ! -f "$dir/formatted" ]]; then
        write_config "$dir" "$port" "$controller"
        local data
        data=$(formatted_data)
        rm -rf "$dir/data"
        cp -r "$data" "$dir/data"
        touch "$dir/formatted"
    fi
    port=$(sed -n 's/^listeners=PLAINTEXT:\/\/127.0.0.1:\([0-9]*\),.*/\1/p' "$dir/server.properties")
    # Small and quick to start: a test broker holds little.
    setsid java ${KAFKA_HEAP:--Xmx512m} -Xms128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        -Xshare:auto -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$dir/log4j2.properties" \
        -cp "$CACHE/libs/*" kafka.Kafka "$dir/server.properties" \
        >"$dir/stdout.log" 2>&1 </dev/null &
    echo $! >"$dir/broker.pid"
    local i
    for ((i = 0; i < 600; i++)); do
        kill -0 "$(cat "$dir/broker.pid")" 2>/dev/null ||
            { tail -n 30 "$dir/stdout.log" "$dir/server.log" >&2 2>/dev/null; die "the broker exited"; }
        # The broker listener opens once the node has started.
        port_open "$port" && return 0
        sleep 0.1
    done
    die "the broker did not start within 60 s (see $dir/server.log)"
}

stop() {
    local dir=$1 pid
    [[ -f "$dir/broker.pid" ]] || return 0
    pid=$(cat "$dir/broker.pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 300; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/broker.pid"
}

case "${1:-}" in
    fetch) fetch ;;
    classpath) classpath ;;
    start) [[ $# -eq 3 ]] || die "usage: $0 start DIR PORT"; start "$2" "$3" ;;
    stop) [[ $# -eq 2 ]] || die "usage: $0 stop DIR"; stop "$2" ;;
    *) die "usage: $0 {fetch|start DIR PORT|stop DIR|classpath}" ;;
esac
