#include "kafka_config.hpp"

#include <arpa/inet.h>
#include <librdkafka/rdkafka.h>

#include <memory>

#include "text_util.hpp"

namespace relaybus::core {

namespace {

using text::quote;
using text::set_why;

constexpr size_t kMaxTargetBytes = 2048;
constexpr size_t kMaxBrokers = 32;
constexpr size_t kMaxTopicBytes = 249;  // Kafka's own limit
constexpr size_t kMaxValueBytes = 65536;

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool valid_host_name(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  size_t label = 0;
  for (size_t i = 0; i <= host.size(); ++i) {
    if (i < host.size() && host[i] != '.') {
      const char c = host[i];
      if (!is_alpha(c) && !is_digit(c) && c != '-' && c != '_') return false;
      continue;
    }
    if (i == label || i - label > 63) return false;
    label = i + 1;
  }
  return true;
}

bool parse_port(std::string_view s, int* out) {
  if (s.empty() || s.size() > 5) return false;
  int p = 0;
  for (char c : s) {
    if (!is_digit(c)) return false;
    p = p * 10 + (c - '0');
  }
  if (p < 1 || p > 65535) return false;
  *out = p;
  return true;
}

bool parse_broker(std::string_view b, std::string* why) {
  std::string_view host, port;
  if (!b.empty() && b[0] == '[') {
    const size_t close = b.find(']');
    if (close == std::string_view::npos || close + 1 >= b.size() || b[close + 1] != ':') {
      set_why(why, "broker " + quote(b) + " must be [IPv6]:port");
      return false;
    }
    const std::string addr(b.substr(1, close - 1));
    unsigned char buf[16];
    if (addr.empty() || inet_pton(AF_INET6, addr.c_str(), buf) != 1) {
      set_why(why, "broker " + quote(b) + " has an invalid IPv6 address");
      return false;
    }
    port = b.substr(close + 2);
  } else {
    const size_t colon = b.rfind(':');
    if (colon == std::string_view::npos) {
      set_why(why, "broker " + quote(b) + " needs a port (host:port)");
      return false;
    }
    host = b.substr(0, colon);
    port = b.substr(colon + 1);
    if (!valid_host_name(host)) {
      set_why(why, "broker " + quote(b) + " has an invalid host");
      return false;
    }
  }
  int p = 0;
  if (!parse_port(port, &p)) {
    set_why(why, "broker " + quote(b) + ": port must be a number between 1 and 65535");
    return false;
  }
  return true;
}

bool valid_topic(std::string_view t, std::string* why) {
  if (t.empty()) {
    set_why(why, "a kafka target needs a topic: kafka://host:port/topic");
    return false;
  }
  if (t.size() > kMaxTopicBytes) {
    set_why(why, "topic is longer than 249 bytes");
    return false;
  }
  if (t == "." || t == "..") {
    set_why(why, "topic must not be \".\" or \"..\"");
    return false;
  }
  for (char c : t) {
    if (is_alpha(c) || is_digit(c) || c == '.' || c == '_' || c == '-') continue;
    set_why(why, "topic " + quote(t) + ": " + text::describe_char(static_cast<unsigned char>(c)) +
                     " is not allowed (only A-Z, a-z, 0-9, '.', '_' and '-')");
    return false;
  }
  return true;
}

// Code loaded into the server process or commands run by it: never from a
// handler's options, whoever may alter them.
bool is_forbidden(std::string_view name) {
  static constexpr std::string_view kForbidden[] = {
      "plugin.library.paths", "sasl.kerberos.kinit.cmd",      "ssl.engine.location",      "ssl.engine.id",
      "ssl.providers",        "oauthbearer_token_refresh_cb", "ssl_engine_callback_data",
  };
  for (auto f : kForbidden)
    if (name == f) return true;
  return false;
}

struct ConfDeleter {
  void operator()(rd_kafka_conf_t* c) const { rd_kafka_conf_destroy(c); }
};

}  // namespace

bool parse_kafka_target(std::string_view target, KafkaTarget* out, std::string* why) {
  constexpr std::string_view kScheme = "kafka://";
  if (target.size() > kMaxTargetBytes) {
    set_why(why, "target is longer than 2048 bytes");
    return false;
  }
  for (char ch : target) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f) {
      set_why(why, "target must be ASCII without whitespace or control characters");
      return false;
    }
  }
  if (target.substr(0, kScheme.size()) != kScheme) {
    set_why(why, "target must be kafka://host:port[,host:port...]/topic");
    return false;
  }
  const std::string_view rest = target.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) {
    set_why(why, "a kafka target needs a topic: kafka://host:port/topic");
    return false;
  }
  const std::string_view brokers = rest.substr(0, slash);
  const std::string_view topic = rest.substr(slash + 1);
  if (brokers.empty()) {
    set_why(why, "a kafka target needs at least one broker: kafka://host:port/topic");
    return false;
  }
  if (brokers.find('@') != std::string_view::npos) {
    set_why(why, "target must not contain credentials (use the producer option's sasl.* properties)");
    return false;
  }
  size_t count = 0, start = 0;
  while (start <= brokers.size()) {
    size_t comma = brokers.find(',', start);
    if (comma == std::string_view::npos) comma = brokers.size();
    const std::string_view b = brokers.substr(start, comma - start);
    if (b.empty()) {
      set_why(why, "target has an empty broker in its list");
      return false;
    }
    if (!parse_broker(b, why)) return false;
    if (++count > kMaxBrokers) {
      set_why(why, "target names more than 32 brokers");
      return false;
    }
    start = comma + 1;
  }
  if (!valid_topic(topic, why)) return false;
  if (out) {
    out->bootstrap = std::string(brokers);
    out->topic = std::string(topic);
  }
  return true;
}

bool kafka_property_is_pinned(std::string_view name) {
  static constexpr std::string_view kPinned[] = {
      "bootstrap.servers",
      "metadata.broker.list",
      "enable.idempotence",
      "acks",
      "request.required.acks",
      "message.timeout.ms",
      "delivery.timeout.ms",
      "transactional.id",
      "transaction.timeout.ms",
      "enable.gapless.guarantee",
      "max.in.flight.requests.per.connection",
      "max.in.flight",
      "retries",
      "message.send.max.retries",
      "dr_cb",
      "dr_msg_cb",
      "error_cb",
      "log_cb",
      "log.queue",
      "throttle_cb",
      "stats_cb",
      "background_event_cb",
      "opaque",
      "default_topic_conf",
      "enabled_events",
      "client.software.name",
      "client.software.version",
  };
  for (auto p : kPinned)
    if (name == p) return true;
  return false;
}

bool kafka_property_is_secret(std::string_view name) {
  return name.find("password") != std::string_view::npos || name.find("secret") != std::string_view::npos ||
         name == "ssl.key.pem" || name == "sasl.oauthbearer.config" || name == "ssl.keystore.location" ||
         name == "sasl.username";
}

bool validate_kafka_property(std::string_view name, std::string_view value, std::string* why) {
  if (name.empty() || name.size() > 128) {
    set_why(why, "option \"producer\": property names are 1 to 128 bytes");
    return false;
  }
  if (kafka_property_is_pinned(name)) {
    set_why(why, "option \"producer\": property " + quote(name) + " is set by relaybus");
    return false;
  }
  if (is_forbidden(name)) {
    set_why(why, "option \"producer\": property " + quote(name) +
                     " is not allowed (it loads code or runs a command in the server)");
    return false;
  }
  if (value.size() > kMaxValueBytes || value.find('\0') != std::string_view::npos) {
    set_why(why, "option \"producer\": value of " + quote(name) + " is too long or contains NUL");
    return false;
  }
  std::unique_ptr<rd_kafka_conf_t, ConfDeleter> conf(rd_kafka_conf_new());
  char err[512] = "";
  const std::string n(name), v(value);
  const rd_kafka_conf_res_t res = rd_kafka_conf_set(conf.get(), n.c_str(), v.c_str(), err, sizeof err);
  if (res == RD_KAFKA_CONF_OK) return true;
  // librdkafka's text names the property; values of secret properties are
  // never echoed (it does not echo values either, but be sure).
  std::string msg = err[0] ? err : "invalid value";
  if (res == RD_KAFKA_CONF_UNKNOWN)
    set_why(why, "option \"producer\": unknown librdkafka property " + quote(name));
  else if (kafka_property_is_secret(name))
    set_why(why, "option \"producer\": property " + quote(name) + ": invalid value");
  else
    set_why(why, "option \"producer\": property " + quote(name) + ": " + msg);
  return false;
}

}  // namespace relaybus::core
