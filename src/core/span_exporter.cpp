#include "span_exporter.hpp"

#include <poll.h>

#include <algorithm>
#include <chrono>

#include "delivery_pipeline.hpp"
#include "http_engine.hpp"
#include "kafka_config.hpp"
#include "outbound_policy.hpp"
#include "text_util.hpp"
#include "version.hpp"
#include "webhook_delivery.hpp"

namespace relaybus::core {

namespace {

// Written by hand rather than through nlohmann::json: a span costs a tenth
// of the time (every attempt of a traced event makes one). Keys are
// constants; values go through append_json_string.
class Attrs {
 public:
  explicit Attrs(std::string* out) : out_(out) {}
  void str(std::string_view key, std::string_view value) {
    open(key);
    *out_ += "{\"stringValue\":";
    append_json_string(out_, value);
    *out_ += "}}";
  }
  // OTLP's JSON mapping writes 64-bit integers as decimal strings.
  void integer(std::string_view key, int64_t value) {
    open(key);
    *out_ += "{\"intValue\":\"";
    *out_ += std::to_string(value);
    *out_ += "\"}}";
  }

 private:
  void open(std::string_view key) {
    if (!first_) *out_ += ',';
    first_ = false;
    *out_ += "{\"key\":\"";
    out_->append(key);
    *out_ += "\",\"value\":";
  }
  std::string* out_;
  bool first_ = true;
};

// OTLP span kinds: CLIENT for a webhook call (the HTTP client convention),
// PRODUCER for a Kafka send or a NOTIFY (the messaging convention's "send").
constexpr int kSpanKindClient = 3;
constexpr int kSpanKindProducer = 4;
constexpr int kStatusError = 2;

}  // namespace

int64_t unix_nano_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool span_of_notify(const NotifyAttempt& a, SpanRecord* out) {
  if (a.sent_traceparent.size() < kTraceparentLen || a.stored_traceparent.size() < kTraceparentLen) return false;
  SpanRecord s;
  s.trace_id = std::string(a.sent_traceparent.substr(3, 32));
  s.span_id = std::string(a.sent_traceparent.substr(36, 16));
  s.parent_span_id = std::string(a.stored_traceparent.substr(36, 16));
  s.handler = std::string(a.handler);
  s.kind = HandlerKind::Notify;
  s.destination = std::string(a.channel);
  s.delivery_id = a.delivery_id;
  s.attempt = a.attempt;
  s.outcome = a.handed_over ? "notified" : "delivered";
  s.queue_ms = std::max<int64_t>(0, (a.sent_unix_nano - a.claim_unix_nano) / 1000000);
  s.start_unix_nano = a.claim_unix_nano;
  s.end_unix_nano = a.sent_unix_nano;
  *out = std::move(s);
  return true;
}

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
  std::string o;
  o.reserve(768 + s.handler.size() + s.error.size() + s.destination.size());
  o += "{\"traceId\":\"";
  o += s.trace_id;
  o += "\",\"spanId\":\"";
  o += s.span_id;
  o += "\",\"parentSpanId\":\"";
  o += s.parent_span_id;
  o += "\",\"name\":";
  append_json_string(&o, "deliver " + s.handler);
  o += ",\"kind\":";
  o += std::to_string(s.kind == HandlerKind::Http ? kSpanKindClient : kSpanKindProducer);
  o += ",\"startTimeUnixNano\":\"";
  o += std::to_string(s.start_unix_nano);
  o += "\",\"endTimeUnixNano\":\"";
  o += std::to_string(s.end_unix_nano);
  o += "\",\"attributes\":[";
  Attrs a(&o);
  a.str("relaybus.handler", s.handler);
  a.str("relaybus.handler.kind", handler_kind_name(s.kind));
  a.integer("relaybus.delivery.id", s.delivery_id);
  a.integer("relaybus.attempt", s.attempt);
  a.str("relaybus.outcome", s.outcome);
  if (s.queue_ms >= 0) a.integer("relaybus.queue_wait_ms", s.queue_ms);
  if (s.send_ms >= 0) a.integer("relaybus.send_ms", s.send_ms);
  if (s.kind == HandlerKind::Kafka) {
    a.str("messaging.system", "kafka");
    a.str("messaging.operation.type", "send");
    if (!s.destination.empty()) a.str("messaging.destination.name", s.destination);
    if (s.kafka_partition >= 0) a.str("messaging.destination.partition.id", std::to_string(s.kafka_partition));
    if (s.kafka_offset >= 0) a.integer("messaging.kafka.offset", s.kafka_offset);
  } else if (s.kind == HandlerKind::Notify) {
    a.str("messaging.system", "postgresql");
    a.str("messaging.operation.type", "send");
    a.str("messaging.destination.name", s.destination);
  } else {
    a.str("http.request.method", "POST");
    if (s.http_status > 0) a.integer("http.response.status_code", s.http_status);
  }
  if (s.failed) a.str("error.type", s.http_status > 0 ? std::to_string(s.http_status) : "_OTHER");
  o += ']';
  if (s.failed) {
    o += ",\"status\":{\"code\":";
    o += std::to_string(kStatusError);
    o += ",\"message\":";
    append_json_string(&o, s.error);
    o += '}';
  }
  o += '}';
  return o;
}

std::string otlp_traces_json(const std::vector<std::string>& spans, std::string_view edition) {
  size_t size = 512;
  for (const std::string& sp : spans) size += sp.size() + 1;
  std::string o;
  o.reserve(size);
  o += "{\"resourceSpans\":[{\"resource\":{\"attributes\":[";
  Attrs a(&o);
  a.str("service.name", "relaybus");
  a.str("service.version", kVersion);
  a.str("relaybus.edition", edition);
  o += "]},\"scopeSpans\":[{\"scope\":{\"name\":\"relaybus\",\"version\":";
  append_json_string(&o, kVersion);
  o += "},\"spans\":[";
  // The spans are JSON text already: spliced in, not parsed again.
  for (size_t i = 0; i < spans.size(); i++) {
    if (i > 0) o += ',';
    o += spans[i];
  }
  o += "]}]}]}";
  return o;
}

bool otlp_traces_url(std::string_view endpoint, std::string* url, std::string* why) {
  endpoint = text::trim(endpoint);
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
    std::string_view item = text::trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      *why = "an OTLP header is name=value";
      return false;
    }
    std::string name(text::trim(item.substr(0, eq))), value(text::trim(item.substr(eq + 1)));
    if (!valid_request_header(name, value, why)) return false;
    headers.emplace_back(std::move(name), std::move(value));
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
