#include "span_exporter.hpp"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "delivery_pipeline.hpp"
#include "http_engine.hpp"
#include "kafka_config.hpp"
#include "outbound_policy.hpp"
#include "version.hpp"

namespace relaybus::core {

namespace {

using nlohmann::json;

json string_attr(const char* key, std::string_view value) {
  return json{{"key", key}, {"value", {{"stringValue", value}}}};
}

// OTLP's JSON mapping writes 64-bit integers as decimal strings.
json int_attr(const char* key, int64_t value) {
  return json{{"key", key}, {"value", {{"intValue", std::to_string(value)}}}};
}

const char* kind_name(HandlerKind k) {
  switch (k) {
    case HandlerKind::Http:
      return "http";
    case HandlerKind::Kafka:
      return "kafka";
    case HandlerKind::Notify:
      return "notify";
    default:
      return "pull";
  }
}

bool is_tchar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int64_t unix_nano_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// OTLP span kinds: CLIENT for a webhook call (the HTTP client convention),
// PRODUCER for a Kafka send (the messaging convention's "send").
constexpr int kSpanKindClient = 3;
constexpr int kSpanKindProducer = 4;
constexpr int kStatusError = 2;

}  // namespace

bool span_of_completion(const Completion& c, const PipelineHandler& h, SpanRecord* out) {
  // 00-<32 trace-id>-<16 span id>-<2 flags>
  if (c.traceparent.size() < kTraceparentLen || c.parent_span_id.size() != 16) return false;
  SpanRecord s;
  s.trace_id = c.traceparent.substr(3, 32);
  s.span_id = c.traceparent.substr(36, 16);
  s.parent_span_id = c.parent_span_id;
  s.handler = c.handler;
  s.kind = h.kind;
  if (h.kind == HandlerKind::Kafka) {
    KafkaTarget t;
    std::string why;
    if (parse_kafka_target(h.target, &t, &why)) s.destination = t.topic;
  }
  s.delivery_id = c.id;
  s.attempt = c.attempt;
  s.outcome = completion_outcome_name(c.outcome);
  s.failed = c.outcome != CompletionOutcome::Delivered;
  s.error = c.error;
  s.queue_ms = c.queue_ms;
  s.send_ms = c.send_ms;
  s.end_unix_nano = unix_nano_now();
  s.start_unix_nano = s.end_unix_nano - std::max<int64_t>(0, c.send_ms) * 1000000;
  s.http_status = c.status;
  s.kafka_partition = c.kafka_partition;
  s.kafka_offset = c.kafka_offset;
  *out = std::move(s);
  return true;
}

std::string otlp_span_json(const SpanRecord& s) {
  json attrs = json::array();
  attrs.push_back(string_attr("relaybus.handler", s.handler));
  attrs.push_back(string_attr("relaybus.handler.kind", kind_name(s.kind)));
  attrs.push_back(int_attr("relaybus.delivery.id", s.delivery_id));
  attrs.push_back(int_attr("relaybus.attempt", s.attempt));
  attrs.push_back(string_attr("relaybus.outcome", s.outcome));
  if (s.queue_ms >= 0) attrs.push_back(int_attr("relaybus.queue_wait_ms", s.queue_ms));
  if (s.send_ms >= 0) attrs.push_back(int_attr("relaybus.send_ms", s.send_ms));
  if (s.kind == HandlerKind::Kafka) {
    attrs.push_back(string_attr("messaging.system", "kafka"));
    attrs.push_back(string_attr("messaging.operation.type", "send"));
    if (!s.destination.empty()) attrs.push_back(string_attr("messaging.destination.name", s.destination));
    if (s.kafka_partition >= 0)
      attrs.push_back(string_attr("messaging.destination.partition.id", std::to_string(s.kafka_partition)));
    if (s.kafka_offset >= 0) attrs.push_back(int_attr("messaging.kafka.offset", s.kafka_offset));
  } else {
    attrs.push_back(string_attr("http.request.method", "POST"));
    if (s.http_status > 0) attrs.push_back(int_attr("http.response.status_code", s.http_status));
  }
  if (s.failed)
    attrs.push_back(string_attr("error.type", s.http_status > 0 ? std::to_string(s.http_status) : "_OTHER"));
  json span = {{"traceId", s.trace_id},
               {"spanId", s.span_id},
               {"parentSpanId", s.parent_span_id},
               {"name", "deliver " + s.handler},
               {"kind", s.kind == HandlerKind::Kafka ? kSpanKindProducer : kSpanKindClient},
               {"startTimeUnixNano", std::to_string(s.start_unix_nano)},
               {"endTimeUnixNano", std::to_string(s.end_unix_nano)},
               {"attributes", std::move(attrs)}};
  if (s.failed) span["status"] = {{"code", kStatusError}, {"message", s.error}};
  return span.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string otlp_traces_json(const std::vector<std::string>& spans, std::string_view edition) {
  // The spans are already JSON text: spliced in rather than parsed again.
  json resource = {
      {"attributes", json::array({string_attr("service.name", "relaybus"), string_attr("service.version", kVersion),
                                  string_attr("relaybus.edition", edition)})}};
  std::string out = R"({"resourceSpans":[{"resource":)";
  out += resource.dump(-1, ' ', false, json::error_handler_t::replace);
  out += R"(,"scopeSpans":[{"scope":{"name":"relaybus","version":")";
  out += kVersion;
  out += R"("},"spans":[)";
  for (size_t i = 0; i < spans.size(); i++) {
    if (i > 0) out += ',';
    out += spans[i];
  }
  out += "]}]}]}";
  return out;
}

bool otlp_traces_url(std::string_view endpoint, std::string* url, std::string* why) {
  endpoint = trim(endpoint);
  const bool http = endpoint.rfind("http://", 0) == 0, https = endpoint.rfind("https://", 0) == 0;
  const size_t host_at = http ? 7 : 8;
  if ((!http && !https) || endpoint.size() <= host_at || endpoint[host_at] == '/') {
    *why = "an OTLP endpoint is an http:// or https:// URL with a host, e.g. http://127.0.0.1:4318";
    return false;
  }
  for (char c : endpoint)
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
      *why = "an OTLP endpoint has no spaces or control characters";
      return false;
    }
  std::string u(endpoint);
  constexpr std::string_view kPath = "/v1/traces";
  if (u.size() < kPath.size() || u.compare(u.size() - kPath.size(), kPath.size(), kPath) != 0) {
    while (!u.empty() && u.back() == '/') u.pop_back();
    u += kPath;
  }
  *url = std::move(u);
  return true;
}

bool parse_otlp_headers(std::string_view text, std::vector<std::pair<std::string, std::string>>* out,
                        std::string* why) {
  std::vector<std::pair<std::string, std::string>> headers;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      *why = "an OTLP header is name=value";
      return false;
    }
    std::string_view name = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (name.empty() || !std::all_of(name.begin(), name.end(), is_tchar)) {
      *why = "an OTLP header's name is an HTTP token";
      return false;
    }
    for (char c : value)
      if (c == '\r' || c == '\n' || c == '\0') {
        *why = "an OTLP header's value has no CR, LF or NUL";
        return false;
      }
    headers.emplace_back(std::string(name), std::string(value));
  }
  *out = std::move(headers);
  return true;
}

SpanExporter::SpanExporter(SpanExporterOptions options) : options_(std::move(options)) {
  options_.max_queue = std::max<size_t>(1, options_.max_queue);
  options_.max_batch = std::max<size_t>(1, options_.max_batch);
  options_.timeout_ms = std::max<int64_t>(1, options_.timeout_ms);
  if (!otlp_traces_url(options_.endpoint, &url_, &url_error_)) url_.clear();
  HttpEngineOptions eo;
  eo.max_total = 1;
  eo.connect_timeout_ms = options_.timeout_ms;
  eo.max_response_bytes = 4096;
  // The collector is the operator's own setting, as a Kafka broker is: any
  // address, loopback and private ones included (relaybus.http_allowlist
  // guards handlers' targets, which users create).
  std::string ignored;
  (void)parse_allowlist("0.0.0.0/0,::/0", &eo.allow, &ignored);
  eo.dns_cache_timeout_s = 60;
  engine_ = std::make_unique<HttpEngine>(eo);
}

SpanExporter::~SpanExporter() = default;

bool SpanExporter::add(const SpanRecord& span, int64_t now_ms) {
  if (queue_.size() >= options_.max_queue) {
    ++dropped_;
    return false;
  }
  queue_.push_back(Waiting{otlp_span_json(span), now_ms});
  return true;
}

void SpanExporter::add_completion(const Completion& c, const PipelineHandler& handler, int64_t now_ms) {
  SpanRecord s;
  if (span_of_completion(c, handler, &s)) (void)add(s, now_ms);
}

void SpanExporter::serve() {
  if (engine_->ready_fd() >= 0) {
    engine_->on_ready();
  } else {
    std::vector<pollfd> pfds;
    for (const auto& w : engine_->sockets())
      pfds.push_back({w.fd, static_cast<short>((w.read ? POLLIN : 0) | (w.write ? POLLOUT : 0)), 0});
    if (!pfds.empty() && poll(pfds.data(), pfds.size(), 0) > 0)
      for (const pollfd& p : pfds) {
        if (p.revents == 0 || (p.revents & POLLNVAL)) continue;
        const bool bad = (p.revents & (POLLERR | POLLHUP)) != 0;
        engine_->on_socket(p.fd, bad || (p.revents & POLLIN), bad || (p.revents & POLLOUT));
      }
  }
  if (engine_->timeout_ms() == 0) engine_->on_timeout();
  for (const HttpResult& r : engine_->take_results()) {
    if (r.outcome == HttpOutcome::Success) {
      exported_ += in_flight_;
    } else {
      dropped_ += in_flight_;
      ++failed_;
      error_ = r.error;
    }
    in_flight_ = 0;
  }
}

void SpanExporter::send_batch() {
  const size_t n = std::min(queue_.size(), options_.max_batch);
  std::vector<std::string> spans;
  spans.reserve(n);
  for (size_t i = 0; i < n; i++) {
    spans.push_back(std::move(queue_.front().json));
    queue_.pop_front();
  }
  HttpRequest req;
  req.tag = next_tag_++;
  req.url = url_;
  req.headers = options_.headers;
  req.body = otlp_traces_json(spans, options_.edition);
  req.timeout_ms = options_.timeout_ms;
  std::string why;
  if (url_.empty()) {
    why = url_error_;
  } else if (engine_->submit(std::move(req), &why)) {
    in_flight_ = n;
    return;
  }
  dropped_ += n;
  ++failed_;
  error_ = why;
}

void SpanExporter::pump(int64_t now_ms) {
  if (in_flight_ > 0) serve();
  if (in_flight_ > 0 || queue_.empty()) return;
  if (queue_.size() >= options_.max_batch || now_ms - queue_.front().added_ms >= options_.batch_delay_ms) send_batch();
}

int64_t SpanExporter::wake_in_ms(int64_t now_ms) const {
  if (in_flight_ > 0) {
    const int64_t t = engine_->timeout_ms();
    return t < 0 ? kPollMs : std::min(t, kPollMs);
  }
  if (queue_.empty()) return -1;
  if (queue_.size() >= options_.max_batch) return 0;
  return std::max<int64_t>(0, queue_.front().added_ms + options_.batch_delay_ms - now_ms);
}

std::string SpanExporter::take_error(int64_t now_ms) {
  if (error_.empty() || (error_logged_ms_ >= 0 && now_ms - error_logged_ms_ < 60000)) return "";
  error_logged_ms_ = now_ms;
  std::string e;
  e.swap(error_);
  return e;
}

}  // namespace relaybus::core
