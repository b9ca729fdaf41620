#include "handler_config.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <nlohmann/json.hpp>

#include "base64.hpp"
#include "duration.hpp"
#include "kafka_config.hpp"
#include "text_util.hpp"

namespace relaybus::core {

namespace {

using nlohmann::json;
using text::describe_char;
using text::quote;
using text::set_why;

constexpr size_t kMaxNameBytes = 63;
constexpr size_t kMaxUrlBytes = 2048;
constexpr size_t kMaxHostBytes = 253;
constexpr size_t kMaxSecrets = 10;
constexpr size_t kMaxSecretBytes = 256;
constexpr size_t kMinSecretBytes = 24;  // Standard Webhooks: keys of 24 to 64 bytes
constexpr size_t kMaxHeaders = 100;
constexpr size_t kMaxHeaderNameBytes = 256;
constexpr size_t kMaxHeaderValueBytes = 8192;
constexpr std::string_view kSecretPrefix = "whsec_";
constexpr size_t kMaxProducerProperties = 200;

bool is_lower_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// RFC 7230 tchar.
bool is_tchar(char c) {
  if (is_alpha(c) || is_digit(c)) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

// ---- URL -----------------------------------------------------------------

bool valid_reg_name(std::string_view host) {
  if (host.size() > kMaxHostBytes) return false;
  size_t label_start = 0;
  for (size_t i = 0; i <= host.size(); ++i) {
    if (i < host.size() && host[i] != '.') {
      const char c = host[i];
      if (!is_alpha(c) && !is_digit(c) && c != '-' && c != '_') return false;
      continue;
    }
    const size_t len = i - label_start;
    if (len == 0 || len > 63) return false;
    label_start = i + 1;
  }
  return true;
}

bool valid_ipv6(std::string_view addr) {
  // inet_pton needs a NUL-terminated string; 45 chars is the longest form.
  if (addr.empty() || addr.size() > 45) return false;
  const std::string z(addr);
  unsigned char buf[16];
  return inet_pton(AF_INET6, z.c_str(), buf) == 1;
}

// Characters RFC 3986 and common practice both accept unencoded in a path or
// query. '"', '<', '>' and '\' are refused because parsers disagree on them.
bool path_char_ok(char c) { return c != '"' && c != '<' && c != '>' && c != '\\'; }

// ---- options -------------------------------------------------------------

// Readable excerpt of a JSON value for messages; never throws on odd UTF-8.
std::string describe_value(const json& v) {
  if (v.is_string()) return quote(v.get_ref<const std::string&>());
  return text::truncate_utf8(v.dump(-1, ' ', false, json::error_handler_t::replace), 40);
}

// Integers may arrive as 10.0 when built with numeric arithmetic in SQL, so
// integral floats are accepted too.
bool get_int(const json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    const auto x = v.get<int64_t>();
    if (x < lo || x > hi) return false;
    *out = x;
    return true;
  }
  if (v.is_number_unsigned()) {
    const auto x = v.get<uint64_t>();
    if (hi < 0 || x > static_cast<uint64_t>(hi) || (lo > 0 && x < static_cast<uint64_t>(lo))) return false;
    *out = static_cast<int64_t>(x);
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(lo) || d > static_cast<double>(hi))
      return false;
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

bool parse_int_option(const char* name, const json& v, int64_t lo, int64_t hi, int64_t* out, std::string* why) {
  if (get_int(v, lo, hi, out)) return true;
  set_why(why, std::string("option \"") + name + "\" must be an integer between " + std::to_string(lo) + " and " +
                   std::to_string(hi));
  return false;
}

bool parse_interval_option(const char* name, const char* example, const json& v, int64_t lo, int64_t hi, int64_t* out,
                           std::string* why) {
  std::optional<int64_t> ms;
  if (v.is_string()) ms = parse_duration_ms(v.get_ref<const std::string&>(), nullptr);
  if (!ms) {
    set_why(why, std::string("option \"") + name + "\" must be an interval such as '" + example + "' (got " +
                     describe_value(v) + ")");
    return false;
  }
  if (*ms < lo || *ms > hi) {
    set_why(why, std::string("option \"") + name + "\" must be between " + format_duration_ms(lo) + " and " +
                     format_duration_ms(hi) + " (got " + describe_value(v) + ")");
    return false;
  }
  *out = *ms;
  return true;
}

bool valid_secret(std::string_view s) {
  if (s.substr(0, kSecretPrefix.size()) != kSecretPrefix) return false;
  std::string key;
  if (!base64_decode(s.substr(kSecretPrefix.size()), &key)) return false;
  return !key.empty() && key.size() <= kMaxSecretBytes;
}

// Never echoes the secret itself into the message: it ends up in server logs.
bool parse_secret_option(const json& v, std::vector<std::string>* out, std::string* why) {
  static const std::string kShape = "option \"secret\" must be a string or an array of 1 to 10 strings";
  static const std::string kFormat = "option \"secret\" must be \"whsec_\" followed by the base64 of 1 to 256 bytes";
  std::vector<std::string> secrets;
  if (v.is_string()) {
    if (!valid_secret(v.get_ref<const std::string&>())) {
      set_why(why, kFormat);
      return false;
    }
    secrets.push_back(v.get<std::string>());
  } else if (v.is_array() && !v.empty() && v.size() <= kMaxSecrets) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string()) {
        set_why(why, kShape);
        return false;
      }
      if (!valid_secret(v[i].get_ref<const std::string&>())) {
        set_why(why, kFormat + " (element " + std::to_string(i + 1) + ")");
        return false;
      }
      secrets.push_back(v[i].get<std::string>());
    }
  } else {
    set_why(why, kShape);
    return false;
  }
  *out = std::move(secrets);
  return true;
}

bool is_reserved_header(std::string_view name) {
  // Set by relaybus itself (signature, framing), so a user value would either
  // be overwritten or break the request.
  static constexpr const char* kReserved[] = {"webhook-id",        "webhook-timestamp", "webhook-signature",
                                              "content-type",      "content-length",    "host",
                                              "transfer-encoding", "connection"};
  for (const char* r : kReserved)
    if (text::iequals(name, r)) return true;
  return false;
}

bool parse_headers_option(const json& v, std::vector<std::pair<std::string, std::string>>* out, std::string* why) {
  static const std::string kShape = "option \"headers\" must be a JSON object of string values";
  if (!v.is_object()) {
    set_why(why, kShape);
    return false;
  }
  if (v.size() > kMaxHeaders) {
    set_why(why, "option \"headers\" has more than " + std::to_string(kMaxHeaders) + " headers");
    return false;
  }
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<std::string> seen_lower;
  for (const auto& item : v.items()) {
    const std::string& name = item.key();
    const json& value = item.value();
    bool token = !name.empty() && name.size() <= kMaxHeaderNameBytes;
    for (char c : name) token = token && is_tchar(c);
    if (!token) {
      set_why(why, "option \"headers\": " + quote(name) + " is not a valid header name");
      return false;
    }
    if (is_reserved_header(name)) {
      set_why(why, "option \"headers\": header " + quote(name) + " is set by relaybus");
      return false;
    }
    const std::string lower = text::ascii_lower(name);
    for (const auto& s : seen_lower) {
      if (s == lower) {
        set_why(why, "option \"headers\": header " + quote(name) + " appears twice");
        return false;
      }
    }
    seen_lower.push_back(lower);
    if (!value.is_string()) {
      set_why(why, kShape + " (header " + quote(name) + ")");
      return false;
    }
    const std::string& s = value.get_ref<const std::string&>();
    if (s.size() > kMaxHeaderValueBytes) {
      set_why(why, "option \"headers\": value of header " + quote(name) + " is longer than " +
                       std::to_string(kMaxHeaderValueBytes) + " bytes");
      return false;
    }
    for (char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      // CR/LF would let a value inject headers; other controls are invalid
      // field-content (RFC 7230), HTAB excepted.
      if ((c < 0x20 && c != '\t') || c == 0x7f) {
        set_why(why, "option \"headers\": value of header " + quote(name) + " contains a control character (" +
                         describe_char(c) + ")");
        return false;
      }
    }
    headers.emplace_back(name, s);
  }
  *out = std::move(headers);
  return true;
}

constexpr size_t kMaxSourceBytes = 1024;

bool parse_cloudevents_option(const json& v, CloudEventsMode* out, std::string* why) {
  if (v.is_string() && v.get_ref<const std::string&>() == "binary") {
    *out = CloudEventsMode::Binary;
  } else if (v.is_string() && v.get_ref<const std::string&>() == "structured") {
    *out = CloudEventsMode::Structured;
  } else {
    set_why(why, "option \"cloudevents\" must be \"binary\" or \"structured\" (got " + describe_value(v) + ")");
    return false;
  }
  return true;
}

// A URI-reference (RFC 3986) as far as its characters go: what a receiver's
// CloudEvents SDK takes as source without complaint.
bool parse_source_option(const json& v, std::string* out, std::string* why) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
    set_why(why, "option \"cloudevents_source\" must be a non-empty string, a URI-reference such as \"/orders\"");
    return false;
  }
  const std::string& s = v.get_ref<const std::string&>();
  if (s.size() > kMaxSourceBytes) {
    set_why(why, "option \"cloudevents_source\" is longer than " + std::to_string(kMaxSourceBytes) + " bytes");
    return false;
  }
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c < 0x21 || c > 0x7e || std::string_view("\"<>\\^`{|}").find(c) != std::string_view::npos) {
      set_why(why, "option \"cloudevents_source\": " + describe_char(c) +
                       " is not allowed in a URI-reference (percent-encode it)");
      return false;
    }
    if (c == '%' && (i + 2 >= s.size() || !is_hex(s[i + 1]) || !is_hex(s[i + 2]))) {
      set_why(why, "option \"cloudevents_source\" has a '%' not followed by two hex digits");
      return false;
    }
  }
  *out = s;
  return true;
}

bool parse_producer_option(const json& v, std::vector<std::pair<std::string, std::string>>* out, std::string* why) {
  static const std::string kShape =
      "option \"producer\" must be a JSON object of librdkafka properties with string values";
  if (!v.is_object()) {
    set_why(why, kShape);
    return false;
  }
  if (v.size() > kMaxProducerProperties) {
    set_why(why, "option \"producer\" has more than " + std::to_string(kMaxProducerProperties) + " properties");
    return false;
  }
  std::vector<std::pair<std::string, std::string>> props;
  for (const auto& item : v.items()) {
    if (!item.value().is_string()) {
      set_why(why, kShape + " (property " + quote(item.key()) + ")");
      return false;
    }
    const std::string& value = item.value().get_ref<const std::string&>();
    if (!validate_kafka_property(item.key(), value, why)) return false;
    props.emplace_back(item.key(), value);
  }
  *out = std::move(props);
  return true;
}

unsigned kind_bit(HandlerKind k) { return 1u << static_cast<unsigned>(k); }

struct OptionRule {
  const char* name;
  unsigned kinds;          // kind_bit() mask of the kinds that take it
  const char* kinds_text;  // for "only valid for ..." messages
};

const OptionRule* find_rule(std::string_view name) {
  static const unsigned kAll = kind_bit(HandlerKind::Notify) | kind_bit(HandlerKind::Http) |
                               kind_bit(HandlerKind::Pull) | kind_bit(HandlerKind::Kafka);
  static const unsigned kHttp = kind_bit(HandlerKind::Http);
  static const unsigned kKafka = kind_bit(HandlerKind::Kafka);
  static const OptionRule kRules[] = {
      {"max_attempts", kAll, ""},
      {"backoff_base", kAll, ""},
      {"backoff_max", kAll, ""},
      {"timeout", kHttp | kKafka, "http and kafka handlers"},
      {"concurrency", kind_bit(HandlerKind::Notify) | kHttp | kKafka, "notify, http and kafka handlers"},
      {"secret", kHttp, "http handlers"},
      {"headers", kHttp, "http handlers"},
      {"ack", kind_bit(HandlerKind::Notify), "notify handlers"},
      {"inline_payload", kind_bit(HandlerKind::Notify), "notify handlers"},
      {"envelope", kHttp | kKafka, "http and kafka handlers"},
      {"producer", kKafka, "kafka handlers"},
      {"key_window", kKafka, "kafka handlers"},
      {"retry_4xx", kHttp, "http handlers"},
      {"follow_redirects", kHttp, "http handlers"},
      {"lease", kAll, ""},
      {"max_concurrency", kHttp | kKafka, "http and kafka handlers"},
      {"rate", kHttp | kKafka, "http and kafka handlers"},
      {"burst", kHttp | kKafka, "http and kafka handlers"},
      {"cloudevents", kHttp | kKafka, "http and kafka handlers"},
      {"cloudevents_source", kHttp | kKafka, "http and kafka handlers"},
  };
  for (const auto& r : kRules)
    if (name == r.name) return &r;
  return nullptr;
}

bool parse_options_impl(HandlerKind kind, std::string_view json_text, HandlerOptions* out, std::string* why) {
  const json j = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    set_why(why, "options must be a JSON object");
    return false;
  }
  HandlerOptions o;
  // A Kafka message's headers carry the envelope's fields already.
  if (kind == HandlerKind::Kafka) o.envelope = false;
  bool envelope_asked = false;
  for (const auto& item : j.items()) {
    const std::string& name = item.key();
    const json& v = item.value();
    const OptionRule* rule = find_rule(name);
    if (!rule) {
      set_why(why, "unknown option " + quote(name));
      return false;
    }
    // null restores the default, whatever the kind: alter merges it in to
    // remove an option.
    if (v.is_null()) continue;
    if ((rule->kinds & kind_bit(kind)) == 0) {
      set_why(why, "option " + quote(name) + " is only valid for " + rule->kinds_text);
      return false;
    }

    int64_t n = 0;
    bool ok = true;
    if (name == "max_attempts") {
      ok = parse_int_option("max_attempts", v, 1, 1000, &n, why);
      if (ok) o.max_attempts = static_cast<int>(n);
    } else if (name == "concurrency") {
      ok = parse_int_option("concurrency", v, 1, 1024, &n, why);
      if (ok) o.concurrency = static_cast<int>(n);
    } else if (name == "key_window") {
      ok = parse_int_option("key_window", v, 1, kMaxKeyWindow, &n, why);
      if (ok) o.key_window = static_cast<int>(n);
    } else if (name == "max_concurrency" || name == "burst") {
      ok = parse_int_option(name.c_str(), v, 1, kMaxLimitValue, &n, why);
      if (ok) (name == "burst" ? o.burst : o.max_concurrency) = static_cast<int>(n);
    } else if (name == "rate") {
      const double r = v.is_number() ? v.get<double>() : 0;
      ok = std::isfinite(r) && r > 0 && r <= kMaxLimitValue;
      if (ok)
        o.rate = r;
      else
        set_why(why, "option \"rate\" must be a number of deliveries per second greater than 0 and at most " +
                         std::to_string(kMaxLimitValue));
    } else if (name == "backoff_base") {
      ok = parse_interval_option("backoff_base", "1s", v, 1, kMsPerDay, &o.backoff_base_ms, why);
    } else if (name == "backoff_max") {
      ok = parse_interval_option("backoff_max", "10min", v, 1, 7 * kMsPerDay, &o.backoff_max_ms, why);
    } else if (name == "timeout") {
      ok = parse_interval_option("timeout", "30s", v, 1, kMsPerHour, &o.timeout_ms, why);
    } else if (name == "lease") {
      ok = parse_interval_option("lease", "30s", v, kMsPerSecond, kMsPerDay, &o.lease_ms, why);
    } else if (name == "ack" || name == "envelope" || name == "retry_4xx" || name == "follow_redirects" ||
               name == "inline_payload") {
      if (v.is_boolean()) {
        bool b = v.get<bool>();
        if (name == "ack") o.ack = b;
        if (name == "inline_payload") o.inline_payload = b;
        if (name == "envelope") o.envelope = b;
        if (name == "envelope") envelope_asked = b;
        if (name == "retry_4xx") o.retry_4xx = b;
        if (name == "follow_redirects") o.follow_redirects = b;
      } else {
        set_why(why, "option " + quote(name) + " must be true or false");
        ok = false;
      }
    } else if (name == "secret") {
      ok = parse_secret_option(v, &o.secrets, why);
    } else if (name == "headers") {
      ok = parse_headers_option(v, &o.headers, why);
    } else if (name == "producer") {
      ok = parse_producer_option(v, &o.producer, why);
    } else if (name == "cloudevents") {
      ok = parse_cloudevents_option(v, &o.cloudevents, why);
    } else if (name == "cloudevents_source") {
      ok = parse_source_option(v, &o.cloudevents_source, why);
    }
    if (!ok) return false;
  }
  if (o.burst > 0 && o.rate <= 0) {
    set_why(why, "option \"burst\" needs option \"rate\"");
    return false;
  }
  if (o.backoff_max_ms < o.backoff_base_ms) {
    set_why(why, "option \"backoff_max\" (" + format_duration_ms(o.backoff_max_ms) +
                     ") must not be less than backoff_base (" + format_duration_ms(o.backoff_base_ms) + ")");
    return false;
  }
  if (envelope_asked && o.cloudevents != CloudEventsMode::Off) {
    set_why(why,
            "option \"cloudevents\" cannot be combined with \"envelope\": true (the CloudEvent takes the "
            "envelope's place)");
    return false;
  }
  *out = std::move(o);
  return true;
}

}  // namespace

bool parse_handler_kind(std::string_view s, HandlerKind* out, std::string* why) {
  HandlerKind k;
  if (s == "notify")
    k = HandlerKind::Notify;
  else if (s == "http")
    k = HandlerKind::Http;
  else if (s == "pull")
    k = HandlerKind::Pull;
  else if (s == "kafka")
    k = HandlerKind::Kafka;
  else {
    set_why(why, "expected notify, http, pull or kafka (got " + quote(s) + ")");
    return false;
  }
  if (out) *out = k;
  return true;
}

const char* handler_kind_name(HandlerKind k) noexcept {
  switch (k) {
    case HandlerKind::Notify:
      return "notify";
    case HandlerKind::Http:
      return "http";
    case HandlerKind::Pull:
      return "pull";
    case HandlerKind::Kafka:
      return "kafka";
  }
  return "unknown";  // only for values cast from out-of-range integers
}

bool is_valid_handler_name(std::string_view name, std::string* why) {
  if (name.empty()) {
    set_why(why, "must not be empty");
    return false;
  }
  if (name.size() > kMaxNameBytes) {
    set_why(why, "longer than 63 bytes");
    return false;
  }
  for (char c : name) {
    if (is_lower_alnum(c) || c == '_' || c == '.' || c == '-') continue;
    set_why(why, describe_char(static_cast<unsigned char>(c)) + " is not allowed (only a-z, 0-9, '_', '.' and '-')");
    return false;
  }
  return true;
}

bool is_valid_channel(std::string_view channel, std::string* why) {
  if (channel.empty()) {
    set_why(why, "must not be empty");
    return false;
  }
  if (channel.size() > kMaxNameBytes) {
    set_why(why, "longer than 63 bytes");
    return false;
  }
  if (!is_alpha(channel[0]) && channel[0] != '_') {
    set_why(why, "must start with a letter or '_'");
    return false;
  }
  for (char c : channel) {
    if (is_alpha(c) || is_digit(c) || c == '_') continue;
    set_why(why, describe_char(static_cast<unsigned char>(c)) + " is not allowed (only A-Z, a-z, 0-9 and '_')");
    return false;
  }
  return true;
}

bool parse_http_url(std::string_view url, HttpUrl* out, std::string* why) {
  if (url.size() > kMaxUrlBytes) {
    set_why(why, "URL is longer than 2048 bytes");
    return false;
  }
  for (char ch : url) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c == 0x7f) {
      set_why(why, "URL must not contain whitespace or control characters");
      return false;
    }
    if (c >= 0x80) {
      set_why(why, "URL must be ASCII (percent-encode other characters)");
      return false;
    }
  }
  const size_t sep = url.find("://");
  if (sep == std::string_view::npos) {
    set_why(why, "URL must start with http:// or https://");
    return false;
  }
  HttpUrl u;
  u.scheme = text::ascii_lower(url.substr(0, sep));
  if (u.scheme != "http" && u.scheme != "https") {
    set_why(why, "URL scheme must be http or https (got " + quote(url.substr(0, sep)) + ")");
    return false;
  }
  const std::string_view rest = url.substr(sep + 3);
  if (rest.find('#') != std::string_view::npos) {
    set_why(why, "URL must not contain a fragment ('#')");
    return false;
  }
  const size_t auth_end = rest.find_first_of("/?");
  const std::string_view authority = rest.substr(0, auth_end);
  const std::string_view path = auth_end == std::string_view::npos ? std::string_view() : rest.substr(auth_end);
  if (authority.find('@') != std::string_view::npos) {
    set_why(why, "URL must not contain user credentials (user:password@)");
    return false;
  }
  if (authority.empty()) {
    set_why(why, "URL has no host");
    return false;
  }

  std::string_view host, port_text;
  bool has_port = false;
  if (authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      set_why(why, "URL has an unterminated IPv6 address ('[' without ']')");
      return false;
    }
    host = authority.substr(0, close + 1);
    if (!valid_ipv6(authority.substr(1, close - 1))) {
      set_why(why, "URL has an invalid IPv6 address " + quote(host));
      return false;
    }
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') {
        set_why(why, "URL has unexpected text after the IPv6 address");
        return false;
      }
      has_port = true;
      port_text = after.substr(1);
    }
  } else {
    const size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) {
      has_port = true;
      port_text = authority.substr(colon + 1);
    }
    if (host.empty()) {
      set_why(why, "URL has no host");
      return false;
    }
    if (!valid_reg_name(host)) {
      set_why(why, "URL has an invalid host " + quote(host));
      return false;
    }
  }
  u.host = text::ascii_lower(host);

  u.port = u.scheme == "https" ? 443 : 80;
  if (has_port) {
    // At most 5 digits, so the value cannot overflow; anything else is 0.
    int port = !port_text.empty() && port_text.size() <= 5 ? 0 : -1;
    for (char c : port_text) {
      if (port < 0) break;
      port = is_digit(c) ? port * 10 + (c - '0') : -1;
    }
    if (port < 1 || port > 65535) {
      set_why(why, "URL port must be a number between 1 and 65535 (got " + quote(port_text) + ")");
      return false;
    }
    u.port = port;
  }

  for (size_t i = 0; i < path.size(); ++i) {
    const char c = path[i];
    if (c == '%') {
      if (i + 2 >= path.size() || !is_hex(path[i + 1]) || !is_hex(path[i + 2])) {
        set_why(why, "URL has a '%' not followed by two hex digits");
        return false;
      }
    } else if (!path_char_ok(c)) {
      set_why(why, describe_char(static_cast<unsigned char>(c)) + " is not allowed in a URL (percent-encode it)");
      return false;
    }
  }
  if (path.empty())
    u.path = "/";
  else if (path[0] == '?')
    u.path = "/" + std::string(path);
  else
    u.path = std::string(path);

  if (out) *out = std::move(u);
  return true;
}

bool validate_target(HandlerKind kind, std::string_view target, bool target_is_null, std::string* why) {
  const bool missing = target_is_null || target.empty();
  switch (kind) {
    case HandlerKind::Notify:
      if (missing) {
        set_why(why, "a notify handler needs a channel name as target");
        return false;
      }
      if (!is_valid_channel(target, why)) {
        if (why) *why = "channel name " + quote(target) + ": " + *why;
        return false;
      }
      return true;
    case HandlerKind::Http:
      if (missing) {
        set_why(why, "an http handler needs a URL as target");
        return false;
      }
      return parse_http_url(target, nullptr, why);
    case HandlerKind::Pull:
      if (!missing) {
        set_why(why, "a pull handler takes no target (use NULL)");
        return false;
      }
      return true;
    case HandlerKind::Kafka:
      if (missing) {
        set_why(why, "a kafka handler needs kafka://host:port/topic as target");
        return false;
      }
      return parse_kafka_target(target, nullptr, why);
  }
  set_why(why, "unknown handler kind");
  return false;
}

BackoffPolicy HandlerOptions::backoff() const {
  BackoffPolicy p;
  p.base_ms = backoff_base_ms;
  p.max_ms = backoff_max_ms;
  return p;
}

bool parse_handler_options(HandlerKind kind, std::string_view json_text, HandlerOptions* out, std::string* why) {
  // nlohmann::json may throw (e.g. bad_alloc); none of it may cross the API.
  try {
    HandlerOptions o;
    if (!parse_options_impl(kind, json_text, &o, why)) return false;
    if (out) *out = std::move(o);
    return true;
  } catch (const std::exception& e) {
    set_why(why, std::string("options could not be parsed: ") + e.what());
    return false;
  }
}

int effective_burst(const HandlerOptions& o) {
  if (o.burst > 0) return o.burst;
  return static_cast<int>(std::max(1.0, std::ceil(o.rate)));
}

bool check_secret_strength(const HandlerOptions& o, std::string* why) {
  static const std::string kShort = "option \"secret\" must be a key of at least 24 bytes (Standard Webhooks)";
  for (size_t i = 0; i < o.secrets.size(); ++i) {
    std::string key;
    if (base64_decode(std::string_view(o.secrets[i]).substr(kSecretPrefix.size()), &key) &&
        key.size() >= kMinSecretBytes)
      continue;
    set_why(why, o.secrets.size() > 1 ? kShort + " (element " + std::to_string(i + 1) + ")" : kShort);
    return false;
  }
  return true;
}

std::string options_public_json(HandlerKind kind, const HandlerOptions& o) {
  try {
    json j = json::object();  // std::map underneath: keys come out sorted
    j["max_attempts"] = o.max_attempts;
    j["backoff_base"] = format_duration_ms(o.backoff_base_ms);
    j["backoff_max"] = format_duration_ms(o.backoff_max_ms);
    j["lease"] = format_duration_ms(o.lease_ms);
    if (kind == HandlerKind::Notify || kind == HandlerKind::Http || kind == HandlerKind::Kafka)
      j["concurrency"] = o.concurrency;
    if (kind == HandlerKind::Notify) {
      j["ack"] = o.ack;
      j["inline_payload"] = o.inline_payload;
    }
    if (kind == HandlerKind::Http) {
      j["timeout"] = format_duration_ms(o.timeout_ms);
      j["envelope"] = o.envelope;
      j["retry_4xx"] = o.retry_4xx;
      j["follow_redirects"] = o.follow_redirects;
      json h = json::object();
      for (const auto& kv : o.headers) h[kv.first] = "[redacted]";
      j["headers"] = std::move(h);
    }
    // Only when set, as the defaults are "no limit".
    if (o.max_concurrency > 0) j["max_concurrency"] = o.max_concurrency;
    if (o.rate > 0) {
      j["rate"] = o.rate;
      j["burst"] = effective_burst(o);
    }
    if (kind == HandlerKind::Kafka) {
      j["timeout"] = format_duration_ms(o.timeout_ms);
      j["envelope"] = o.envelope;
      j["key_window"] = o.key_window;
      json p = json::object();
      for (const auto& kv : o.producer)
        p[kv.first] = kafka_property_is_secret(kv.first) ? std::string("[redacted]") : kv.second;
      j["producer"] = std::move(p);
    }
    // Only when set: every http and kafka handler's listing stays as it was.
    if (o.cloudevents != CloudEventsMode::Off)
      j["cloudevents"] = o.cloudevents == CloudEventsMode::Binary ? "binary" : "structured";
    if (!o.cloudevents_source.empty()) j["cloudevents_source"] = o.cloudevents_source;
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const std::exception&) {
    return "{}";
  }
}

int handler_in_flight_limit(HandlerKind kind, const HandlerOptions& o) {
  const int64_t window = effective_key_window(kind, o);
  return static_cast<int>(std::min<int64_t>(kMaxHandlerInFlight, int64_t{std::max(1, o.concurrency)} * window));
}

}  // namespace relaybus::core
