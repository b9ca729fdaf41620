#!/usr/bin/env bash
# Suite core-kafka: KafkaSink against a real broker. Starts a single-node
# broker (scripts/kafka-broker.sh) on a free loopback port, runs
# `make -C test/core check-kafka` with KAFKA_BOOTSTRAP pointing at it, stops it.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd "$HERE/../../.." && pwd -P)
BROKER=$(mktemp -d /tmp/relaybus-kafka.XXXXXX)
trap 'bash "$ROOT/scripts/kafka-broker.sh" stop "$BROKER"; rm -rf "$BROKER"' EXIT
PORT=$(python3 "$ROOT/scripts/free-port.py")
bash "$ROOT/scripts/kafka-broker.sh" start "$BROKER" "$PORT" || exit 1
KAFKA_BOOTSTRAP=127.0.0.1:$PORT make -C "$ROOT/test/core" -j"${JOBS:-2}" check-kafka
