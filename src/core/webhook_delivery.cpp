#include "webhook_delivery.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "backoff.hpp"
#include "cloudevents.hpp"
#include "text_util.hpp"
#include "webhook_signature.hpp"

namespace relaybus::core {

HttpRequest make_webhook_request(const HandlerOptions& options, std::string_view target, int handler_key,
                                 int64_t delivery_id, std::string body, int64_t timestamp_s) {
  HttpRequest r;
  r.tag = static_cast<uint64_t>(delivery_id);
  r.handler_key = handler_key;
  r.url = std::string(target);
  r.body = std::move(body);
  r.timeout_ms = options.timeout_ms;
  r.follow_redirects = options.follow_redirects;
  r.max_retry_after_ms = options.backoff_max_ms;  // Retry-After waits no longer than the backoff would
  std::string msg_id = options.message_id_prefix + std::to_string(delivery_id);
  r.headers.emplace_back("webhook-id", msg_id);
  r.headers.emplace_back("webhook-timestamp", std::to_string(timestamp_s));
  if (!options.secrets.empty())
    r.headers.emplace_back("webhook-signature", webhook_signature(options.secrets, msg_id, timestamp_s, r.body));
  for (const auto& kv : options.headers) r.headers.push_back(kv);
  return r;
}

std::string format_rfc3339_ms(int64_t unix_ms) {
  // Civil date from days since 1970-01-01 (Howard Hinnant's days_from_civil
  // inverse): no gmtime_r, whose time_t range and locale are the host's.
  int64_t days = unix_ms >= 0 ? unix_ms / 86400000 : -((-unix_ms + 86399999) / 86400000);
  int64_t ms_of_day = unix_ms - days * 86400000;
  int64_t z = days + 719468;
  int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  int64_t doe = z - era * 146097;
  int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  int64_t mp = (5 * doy + 2) / 153;
  int64_t d = doy - (153 * mp + 2) / 5 + 1;
  int64_t m = mp < 10 ? mp + 3 : mp - 9;
  int64_t y = yoe + era * 400 + (m <= 2 ? 1 : 0);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lld.%03lldZ", static_cast<long long>(y),
                static_cast<long long>(m), static_cast<long long>(d), static_cast<long long>(ms_of_day / 3600000),
                static_cast<long long>(ms_of_day / 60000 % 60), static_cast<long long>(ms_of_day / 1000 % 60),
                static_cast<long long>(ms_of_day % 1000));
  return buf;
}

void append_json_string(std::string* out, std::string_view s) {
  bool plain = true;
  for (char c : s) plain = plain && c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
  if (!plain) {
    *out += nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return;
  }
  *out += '"';
  out->append(s);
  *out += '"';
}

std::string webhook_envelope_json(int64_t id, int64_t event_id, std::string_view topic, const std::string* key,
                                  std::optional<int64_t> seq, int64_t published_at_ms, int attempt,
                                  std::string_view headers_json, std::string_view payload_json) {
  std::string out;
  out.reserve(128 + topic.size() + payload_json.size() + headers_json.size());
  out += "{\"id\":";
  out += std::to_string(id);
  out += ",\"event_id\":";
  out += std::to_string(event_id);
  out += ",\"topic\":";
  append_json_string(&out, topic);
  out += ",\"key\":";
  if (key != nullptr)
    append_json_string(&out, *key);
  else
    out += "null";
  out += ",\"seq\":";
  out += seq ? std::to_string(*seq) : "null";
  out += ",\"published_at\":";
  out += published_at_ms > 0 ? "\"" + format_rfc3339_ms(published_at_ms) + "\"" : std::string("null");
  out += ",\"attempt\":";
  out += std::to_string(attempt);
  out += ",\"headers\":";
  out += headers_json.empty() ? std::string_view("null") : headers_json;
  out += ",\"payload\":";
  out += payload_json.empty() ? std::string_view("null") : payload_json;
  out += "}";
  return out;
}

namespace {

void add_trace_headers(HttpRequest* r, const TraceContext& trace) {
  if (!trace.present()) return;
  // A handler's own trace headers would name a span that is not this attempt.
  r->headers.erase(std::remove_if(r->headers.begin(), r->headers.end(),
                                  [](const auto& kv) {
                                    return text::iequals(kv.first, "traceparent") ||
                                           text::iequals(kv.first, "tracestate");
                                  }),
                   r->headers.end());
  r->headers.emplace_back("traceparent", trace.traceparent);
  if (!trace.tracestate.empty()) r->headers.emplace_back("tracestate", trace.tracestate);
}

}  // namespace

HttpRequest build_webhook_request(const HandlerOptions& options, std::string_view target, int handler_key,
                                  const WebhookMessage& m, int64_t timestamp_s) {
  if (options.cloudevents != CloudEventsMode::Off) {
    CloudEventMessage ce = make_cloudevent(options, m, CloudEventsBinding::Http);
    HttpRequest r = make_webhook_request(options, target, handler_key, m.id, std::move(ce.body), timestamp_s);
    // The handler's own ce-* headers would forge or repeat the event's attributes.
    r.headers.erase(std::remove_if(r.headers.begin(), r.headers.end(),
                                   [](const auto& kv) { return text::iequals(kv.first.substr(0, 3), "ce-"); }),
                    r.headers.end());
    r.headers.insert(r.headers.end(), ce.headers.begin(), ce.headers.end());
    add_trace_headers(&r, m.trace);
    return r;
  }
  std::string body = options.envelope
                         ? webhook_envelope_json(m.id, m.event_id, m.topic, m.has_key ? &m.key : nullptr,
                                                 m.has_key ? std::optional<int64_t>(m.seq) : std::nullopt,
                                                 m.published_at_ms, m.attempt, m.headers_json, m.payload_json)
                         : m.payload_json;
  HttpRequest r = make_webhook_request(options, target, handler_key, m.id, std::move(body), timestamp_s);
  add_trace_headers(&r, m.trace);
  return r;
}

bool webhook_failure_is_permanent(const HandlerOptions& options, const HttpResult& result) {
  if (result.outcome != HttpOutcome::Fail) return false;
  return !(options.retry_4xx && result.status >= 400 && result.status < 500);
}

FailureDecision decide_failure(const HandlerOptions& options, bool permanent, int attempts_now, int64_t retry_after_ms,
                               uint64_t random64) {
  FailureDecision d;
  if (permanent || attempts_now >= options.max_attempts) {
    d.dead = true;
    return d;
  }
  d.retry_in_ms = retry_after_ms >= 0 ? retry_after_ms : backoff_delay_ms(options.backoff(), attempts_now, random64);
  return d;
}

void CircuitBreaker::record(const HttpResult& r, const HandlerOptions& options, int64_t now_ms) {
  if (r.outcome == HttpOutcome::Success) {
    *this = CircuitBreaker{};
    return;
  }
  bool network = r.status == 0 || r.status == 408 || r.status == 429 || r.status >= 500;
  // Failures of requests already in flight when the breaker opened neither
  // reopen it nor grow its backoff: only the tripping failure or a failed probe.
  if (r.outcome == HttpOutcome::Retry && network && ++consecutive_ >= kThreshold && now_ms >= open_until_ms_) {
    int64_t wait = std::min(options.backoff_max_ms, options.backoff_base_ms << std::min(opens_, 20));
    open_until_ms_ = now_ms + wait;
    opens_++;
  }
}

int CircuitBreaker::limit(int concurrency, int64_t now_ms) const {
  if (!is_open()) return concurrency;
  return now_ms < open_until_ms_ ? 0 : 1;
}

}  // namespace relaybus::core
