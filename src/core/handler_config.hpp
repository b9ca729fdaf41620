#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backoff.hpp"
#include "handler_kind.hpp"

namespace relaybus::core {

// "notify" | "http" | "pull" | "kafka" (exact, lower case).
bool parse_handler_kind(std::string_view text, HandlerKind* out, std::string* why);

// [a-z0-9_.-]{1,63}
bool is_valid_handler_name(std::string_view name, std::string* why);

// 1..63 bytes, [A-Za-z_][A-Za-z0-9_]* (a LISTEN channel that needs no quoting,
// except that LISTEN folds unquoted upper case to lower case).
bool is_valid_channel(std::string_view channel, std::string* why);

// Components of an http(s) URL. host is lower-cased; an IPv6 literal keeps its
// brackets ("[::1]") so that scheme://host:port/path reassembles a valid URL.
// port is filled in (80/443) when absent. path includes the query and is "/"
// when empty.
struct HttpUrl {
  std::string scheme;
  std::string host;
  int port = 0;
  std::string path;
};

// http/https only, host required, no userinfo, port 1..65535, no fragment,
// ASCII only without whitespace/control characters, '%' followed by two hex
// digits, <= 2048 bytes. *out is written only on success.
bool parse_http_url(std::string_view url, HttpUrl* out, std::string* why);

// notify: a valid channel; http: a valid URL; pull: null or empty; kafka:
// kafka://host:port[,host:port...]/topic (parse_kafka_target).
bool validate_target(HandlerKind kind, std::string_view target, bool target_is_null, std::string* why);

// 128: one hot key drains ~3x faster than with 32 (docs/performance.md, "Kafka
// throughput tuned"), for at most 128 repeats per key after a crash.
inline constexpr int kDefaultKeyWindow = 128;
inline constexpr int kMaxKeyWindow = 1000;
inline constexpr int kMaxLimitValue = 100000;

// http, kafka: today's messages (Off), or CloudEvents 1.0 in the binding's
// binary or structured mode (src/core/cloudevents.hpp).
enum class CloudEventsMode { Off, Binary, Structured };

struct HandlerOptions {
  int max_attempts = 10;            // 1..1000
  int64_t backoff_base_ms = 1000;   // 1ms..1d
  int64_t backoff_max_ms = 600000;  // >= backoff_base, <= 7d
  int64_t timeout_ms = 30000;       // http, kafka (message.timeout.ms); 1ms..1h
  int concurrency = 16;             // notify, http, kafka; 1..1024
  // http only: the "whsec_..." strings exactly as given (option "secret": a
  // string or an array of 1..10 strings, more than one during rotation).
  std::vector<std::string> secrets;
  // http only: extra request headers, names as given.
  std::vector<std::pair<std::string, std::string>> headers;
  bool ack = false;            // notify only
  bool inline_payload = true;  // notify only: the payload in the NOTIFY, or only the reference
  // http, kafka: send the envelope (id, topic, key, seq, ...) or just the
  // payload. Default true for http, false for kafka (its headers carry the rest).
  bool envelope = true;
  bool retry_4xx = false;         // http only: retry 4xx other than 408/429 instead of dead-lettering
  bool follow_redirects = false;  // http only
  // kafka only: librdkafka properties (option "producer"), names as given,
  // each checked by validate_kafka_property.
  std::vector<std::pair<std::string, std::string>> producer;
  // kafka only: how many deliveries of one key may be in flight at once, as
  // a run produced without waiting for each acknowledgement; 1..kMaxKeyWindow.
  // Only a host that turns pipelining on (KafkaSink::set_pipelined) honours
  // it; 1 waits for each message's acknowledgement before the next.
  int key_window = kDefaultKeyWindow;
  int64_t lease_ms = 30000;  // all; 1s..1d
  // http, kafka: limits that hold across every dispatcher of a database
  // (docs/sql-api.md). max_concurrency: attempts in flight, 0 = none;
  // rate: attempts per second (a token bucket of `burst` tokens), 0 = none;
  // burst 0 = the default, max(1, ceil(rate)) (effective_burst).
  int max_concurrency = 0;                             // 1..kMaxLimitValue
  double rate = 0;                                     // > 0, <= kMaxLimitValue
  int burst = 0;                                       // 1..kMaxLimitValue, only with rate
  CloudEventsMode cloudevents = CloudEventsMode::Off;  // http, kafka
  // http, kafka: the events' source attribute, a URI-reference; empty: the
  // host's default_cloudevents_source.
  std::string cloudevents_source;
  // Not an option: set by the host that loads the handler, naming its
  // database (default_cloudevents_source in cloudevents.hpp).
  std::string default_cloudevents_source;
  // Not an option: set by the host that loads the handler, so a webhook-id is
  // unique across databases (PostgreSQL: "msg_<system identifier>_<database
  // oid>_"; relaybus-mongo: "msg_mongo_<database name>_"). Followed by the delivery id.
  std::string message_id_prefix;
  BackoffPolicy backoff() const;
};

// The deliveries of one key a dispatcher may have in flight: a kafka
// handler's key_window, one for every other kind.
inline int effective_key_window(HandlerKind kind, const HandlerOptions& o) {
  return kind == HandlerKind::Kafka && o.key_window > 1 ? o.key_window : 1;
}

// Whether a handler has a limit shared by the dispatchers (rate or max_concurrency).
inline bool has_shared_limit(const HandlerOptions& o) { return o.max_concurrency > 0 || o.rate > 0; }

// The token bucket's size: burst, or max(1, ceil(rate)).
int effective_burst(const HandlerOptions& o);

// json_text is a JSON object (jsonb's text output). Unknown option names,
// wrong types, out-of-range values and options not allowed for the kind fail
// with a message in *why. A key whose value is null means "the default", so
// alter can merge the stored options with the new ones and validate the
// result. *out is written only on success (defaults for absent options).
bool parse_handler_options(HandlerKind kind, std::string_view json_text, HandlerOptions* out, std::string* why);

// A pipelining host's bound on a handler's messages in flight: a kafka
// handler's concurrency counts keys' runs, each up to key_window messages
// (librdkafka batches them, so a hot key is not held to the handful of
// requests an http handler has out); at most kMaxHandlerInFlight.
inline constexpr int kMaxHandlerInFlight = 4096;
int handler_in_flight_limit(HandlerKind kind, const HandlerOptions& o);

// Standard Webhooks' minimum: every signing key has at least 24 bytes.
// Apart from parse_handler_options so that a stored shorter key (0.1.0 took
// any length) still signs; creating or altering a handler refuses it.
bool check_secret_strength(const HandlerOptions& o, std::string* why);

// Compact JSON object, keys sorted, of every option that applies to `kind`
// with defaults filled in; intervals as format_duration_ms text. Without the
// secrets, and with header values replaced by "[redacted]" (they commonly
// carry credentials such as Authorization), and likewise the kafka producer
// properties that hold credentials (kafka_property_is_secret), so it is safe
// for non-admins.
std::string options_public_json(HandlerKind kind, const HandlerOptions& o);

}  // namespace relaybus::core
