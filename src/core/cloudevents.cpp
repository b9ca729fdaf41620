#include "cloudevents.hpp"

namespace relaybus::core {

namespace {

constexpr char kHex[] = "0123456789ABCDEF";

bool is_unreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

void percent_encode(std::string* out, unsigned char c) {
  *out += '%';
  *out += kHex[c >> 4];
  *out += kHex[c & 15];
}

// The HTTP binding's rule for header values: space, '"', '%' and everything
// outside printable ASCII percent-encoded (UTF-8 bytes).
std::string http_header_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char ch : v) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f || c == '"' || c == '%')
      percent_encode(&out, c);
    else
      out += ch;
  }
  return out;
}

}  // namespace

std::string default_cloudevents_source(std::string_view prefix, std::string_view database) {
  std::string out(prefix);
  for (char ch : database) {
    if (is_unreserved(static_cast<unsigned char>(ch)))
      out += ch;
    else
      percent_encode(&out, static_cast<unsigned char>(ch));
  }
  return out;
}

const std::string& cloudevents_source(const HandlerOptions& options) {
  return options.cloudevents_source.empty() ? options.default_cloudevents_source : options.cloudevents_source;
}

CloudEventMessage make_cloudevent(const HandlerOptions& options, const WebhookMessage& m, CloudEventsBinding binding) {
  CloudEventMessage out;
  const std::string& payload = m.payload_json.empty() ? std::string("null") : m.payload_json;
  const std::string time = m.published_at_ms > 0 ? format_rfc3339_ms(m.published_at_ms) : std::string();
  if (options.cloudevents == CloudEventsMode::Structured) {
    out.headers.emplace_back("content-type", "application/cloudevents+json");
    std::string& b = out.body;
    b.reserve(256 + m.topic.size() + m.key.size() + payload.size());
    b += "{\"specversion\":\"1.0\",\"id\":\"";
    b += std::to_string(m.event_id);
    b += "\",\"source\":";
    append_json_string(&b, cloudevents_source(options));
    b += ",\"type\":";
    append_json_string(&b, m.topic);
    if (m.has_key) {
      b += ",\"subject\":";
      append_json_string(&b, m.key);
    }
    if (!time.empty()) b += ",\"time\":\"" + time + "\"";
    b += ",\"datacontenttype\":\"application/json\"";
    if (m.has_key) b += ",\"relaybusseq\":" + std::to_string(m.seq);
    b += ",\"relaybusattempt\":" + std::to_string(m.attempt);
    if (m.trace.present()) {
      b += ",\"traceparent\":";
      append_json_string(&b, m.trace.traceparent);
      if (!m.trace.tracestate.empty()) {
        b += ",\"tracestate\":";
        append_json_string(&b, m.trace.tracestate);
      }
    }
    b += ",\"data\":";
    b += payload;
    b += "}";
    return out;
  }
  const bool http = binding == CloudEventsBinding::Http;
  const std::string prefix = http ? "ce-" : "ce_";
  auto add = [&](const char* name, const std::string& value) {
    out.headers.emplace_back(prefix + name, http ? http_header_value(value) : value);
  };
  out.headers.emplace_back("content-type", "application/json");
  add("specversion", "1.0");
  add("id", std::to_string(m.event_id));
  add("source", cloudevents_source(options));
  add("type", m.topic);
  if (m.has_key) add("subject", m.key);
  if (!time.empty()) add("time", time);
  if (m.has_key) add("relaybusseq", std::to_string(m.seq));
  add("relaybusattempt", std::to_string(m.attempt));
  if (m.trace.present()) add("traceparent", m.trace.traceparent);
  if (!m.trace.tracestate.empty()) add("tracestate", m.trace.tracestate);
  out.body = payload;
  return out;
}

}  // namespace relaybus::core
