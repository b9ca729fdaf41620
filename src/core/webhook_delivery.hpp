#pragma once

// One webhook delivery attempt, shared by the PostgreSQL dispatchers and
// relaybus-mongo: the request (Standard Webhooks headers, signature, the
// handler's headers), the envelope body, what a result means for the delivery
// (success, retry after a delay, dead letter) and the per-handler circuit
// breaker. docs/webhooks.md is the user-facing description of these rules.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "handler_config.hpp"
#include "http_engine.hpp"
#include "trace_context.hpp"

namespace relaybus::core {

// The POST of delivery `delivery_id` to `target`: webhook-id (the options'
// message_id_prefix and the delivery id: the same on every attempt, unique
// across databases), webhook-timestamp (timestamp_s), webhook-signature (when the handler
// has secrets), then the handler's own headers; timeout and redirects from
// the options.
HttpRequest make_webhook_request(const HandlerOptions& options, std::string_view target, int handler_key,
                                 int64_t delivery_id, std::string body, int64_t timestamp_s);

// One claimed webhook delivery, as the request of this attempt is made from it.
struct WebhookMessage {
  int64_t id = 0;  // the delivery id: webhook-id and the envelope's id
  int64_t event_id = 0;
  std::string topic;     // the route's wire name where it has one
  bool has_key = false;  // unkeyed: key and seq are null in the envelope
  std::string key;
  int64_t seq = 0;
  int64_t published_at_ms = 0;  // the event's publish time, Unix ms; <= 0: unknown (null)
  int attempt = 1;              // this attempt, 1 = the first
  std::string headers_json;     // JSON text; empty = null
  std::string payload_json;     // JSON text, inserted as it is
  // This attempt's trace context (traceparent with its own span id, the
  // stored tracestate): set as the attempt goes out (DeliveryPipeline), sent
  // by every sink; empty for an event published without one.
  TraceContext trace;
};

// THE request of a webhook attempt, for the PostgreSQL dispatchers and
// relaybus-mongo alike: the body (the envelope, or with "envelope": false the
// payload text alone, or with "cloudevents" the CloudEvent's, its headers
// added: cloudevents.hpp) and make_webhook_request's headers, the attempt's
// traceparent and tracestate in place of any the handler sets, with timestamp_s as
// webhook-timestamp and the signature over it. Call it when the request is
// sent (the engine starts it at once), not when it was claimed: a request that
// waited in a queue still carries the time it went out. The same message,
// options and timestamp give the same bytes on both sides.
HttpRequest build_webhook_request(const HandlerOptions& options, std::string_view target, int handler_key,
                                  const WebhookMessage& message, int64_t timestamp_s);

// The envelope {"id","event_id","topic","key","seq","published_at","attempt",
// "headers","payload"} as compact JSON. topic is the wire name where the route
// has one; key and seq are null for an unkeyed delivery (key == nullptr);
// published_at is RFC 3339 UTC with milliseconds (null when published_at_ms
// <= 0); attempt counts this one
// (1 = first). headers_json and payload_json are JSON texts inserted as they
// are (headers_json empty = null). For callers that do not build it with
// their database's JSON functions (the PostgreSQL side uses jsonb_build_object).
std::string webhook_envelope_json(int64_t id, int64_t event_id, std::string_view topic, const std::string* key,
                                  std::optional<int64_t> seq, int64_t published_at_ms, int attempt,
                                  std::string_view headers_json, std::string_view payload_json);

// A JSON string literal, as nlohmann's dump writes it (invalid UTF-8
// replaced); printable ASCII with nothing to escape is copied as is.
void append_json_string(std::string* out, std::string_view s);

// Unix milliseconds as RFC 3339 UTC: "2023-11-14T22:13:20.123Z".
std::string format_rfc3339_ms(int64_t unix_ms);

// A failed result that goes to dead letters at once, whatever the attempt:
// HttpOutcome::Fail (other 4xx, 3xx when not following, refused address, bad
// request), unless the handler retries 4xx ("retry_4xx") and it was a 4xx.
bool webhook_failure_is_permanent(const HandlerOptions& options, const HttpResult& result);

// After a failed attempt that made `attempts_now` attempts in all: dead
// (permanent, or attempts_now >= max_attempts) or retry after retry_in_ms
// (retry_after_ms when >= 0, else the handler's backoff with full jitter from
// random64).
struct FailureDecision {
  bool dead = false;
  int64_t retry_in_ms = 0;
};
FailureDecision decide_failure(const HandlerOptions& options, bool permanent, int attempts_now, int64_t retry_after_ms,
                               uint64_t random64);

// Per-handler circuit breaker: after kThreshold consecutive network-type
// failures (status 0, 408, 429, 5xx with a retry outcome) the handler gets no
// requests for min(backoff_max, backoff_base * 2^opens), then one probe at a
// time; a success closes it. Failures of requests that were in flight while it
// was open do not reopen it or grow the backoff (the PostgreSQL dispatcher's rule).
class CircuitBreaker {
 public:
  static constexpr int kThreshold = 5;
  void record(const HttpResult& result, const HandlerOptions& options, int64_t now_ms);
  // Requests that may be in flight now: concurrency when closed, 0 while
  // open, 1 (a probe) once the open period ended.
  int limit(int concurrency, int64_t now_ms) const;
  bool is_open() const { return consecutive_ >= kThreshold; }
  int64_t open_until_ms() const { return open_until_ms_; }

 private:
  int consecutive_ = 0;
  int opens_ = 0;
  int64_t open_until_ms_ = 0;
};

}  // namespace relaybus::core
