#pragma once

// What a kafka handler's target and its "producer" option may say, checked
// when the handler is created or altered (handler_config) and again when the
// sink builds its producer (kafka_sink).

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace relaybus::core {

// kafka://host:port[,host:port...]/topic. One topic per handler: a topic per
// wire name is a handler per route.
struct KafkaTarget {
  std::string bootstrap;  // "host:port,host:port", as librdkafka's bootstrap.servers
  std::string topic;
};

// Hosts: names, IPv4 or [IPv6] literals, each with a port 1..65535 (no
// default: Kafka listeners vary); at most 32 of them. Topic: 1..249 of
// [A-Za-z0-9._-], not "." or "..". *out is written only on success.
bool parse_kafka_target(std::string_view target, KafkaTarget* out, std::string* why);

// One librdkafka property of the "producer" option: refused if relaybus sets
// it itself (kafka_property_is_pinned), or if it loads code or runs a command
// in the server; else checked by rd_kafka_conf_set on a scratch
// configuration (unknown property, bad value: librdkafka's message).
bool validate_kafka_property(std::string_view name, std::string_view value, std::string* why);

// Properties relaybus sets for every producer: bootstrap.servers (the
// target), enable.idempotence and acks (no loss, no duplicate or reordering
// from the producer's own retries), message.timeout.ms (the "timeout"
// option), the delivery report routing, and what would break ordering or
// idempotence (transactions, retries, in-flight requests).
bool kafka_property_is_pinned(std::string_view name);

// Properties whose value is a credential: shown as "[redacted]".
bool kafka_property_is_secret(std::string_view name);

}  // namespace relaybus::core
