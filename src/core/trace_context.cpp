#include "trace_context.hpp"

#include <nlohmann/json.hpp>

namespace relaybus::core {

namespace {

bool lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
bool lcalpha(char c) { return c >= 'a' && c <= 'z'; }
bool digit(char c) { return c >= '0' && c <= '9'; }

bool hex_field(std::string_view v, size_t at, size_t len) {
  for (size_t i = at; i < at + len; i++)
    if (!lower_hex(v[i])) return false;
  return true;
}

bool all_zero(std::string_view v, size_t at, size_t len) {
  for (size_t i = at; i < at + len; i++)
    if (v[i] != '0') return false;
  return true;
}

bool key_char(char c) { return lcalpha(c) || digit(c) || c == '_' || c == '-' || c == '*' || c == '/'; }

// simple-key = lcalpha 0*255(keychar); multi-tenant-key = tenant-id "@" system-id,
// tenant-id = (lcalpha / DIGIT) 0*240(keychar), system-id = lcalpha 0*13(keychar).
bool valid_key(std::string_view k) {
  if (k.empty()) return false;
  const size_t at = k.find('@');
  auto run = [](std::string_view s, bool first_digit_ok, size_t max_len) {
    if (s.empty() || s.size() > max_len) return false;
    if (!(lcalpha(s[0]) || (first_digit_ok && digit(s[0])))) return false;
    for (char c : s.substr(1))
      if (!key_char(c)) return false;
    return true;
  };
  if (at == std::string_view::npos) return run(k, false, 256);
  return run(k.substr(0, at), true, 241) && run(k.substr(at + 1), false, 14);
}

// value = 0*255(chr) nblk-chr; chr = %x20 / nblk-chr; nblk-chr = %x21-2B / %x2D-3C / %x3E-7E.
bool valid_value(std::string_view v) {
  if (v.empty() || v.size() > 256) return false;
  for (char c : v)
    if (c < 0x20 || c > 0x7e || c == ',' || c == '=') return false;
  return v.back() != ' ';
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// sqlcommenter's value: URL-encoded, with ' escaped as \'.
std::string url_decode(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); i++) {
    if (v[i] == '%' && i + 2 < v.size()) {
      const int hi = hex_value(v[i + 1]), lo = hex_value(v[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    if (v[i] == '\\' && i + 1 < v.size()) {
      out += v[++i];
      continue;
    }
    out += v[i];
  }
  return out;
}

// The value of `name='...'` in a comment of text (the last such), or false.
bool comment_value(std::string_view text, std::string_view name, std::string* out) {
  size_t from = std::string_view::npos;
  for (;;) {
    const size_t at = text.rfind(name, from);
    if (at == std::string_view::npos) return false;
    from = at == 0 ? std::string_view::npos : at - 1;
    const bool boundary = at == 0 || text[at - 1] == ',' || text[at - 1] == '*' || text[at - 1] == ' ';
    const size_t open = text.rfind("/*", at);
    const size_t close = open == std::string_view::npos ? std::string_view::npos : text.find("*/", open + 2);
    const bool in_comment = open != std::string_view::npos && close != std::string_view::npos && close > at;
    size_t v = at + name.size();
    if (boundary && in_comment && v + 1 < text.size() && text[v] == '=' && text[v + 1] == '\'') {
      v += 2;
      size_t end = v;
      while (end < text.size() && text[end] != '\'') end += text[end] == '\\' ? 2 : 1;
      if (end >= text.size()) return false;
      *out = url_decode(text.substr(v, end - v));
      return true;
    }
    if (at == 0) return false;
  }
}

}  // namespace

bool valid_traceparent(std::string_view v) {
  if (v.size() < kTraceparentLen) return false;
  if (!hex_field(v, 0, 2) || v.substr(0, 2) == "ff") return false;
  if (v[2] != '-' || v[35] != '-' || v[52] != '-') return false;
  if (!hex_field(v, 3, 32) || all_zero(v, 3, 32)) return false;
  if (!hex_field(v, 36, 16) || all_zero(v, 36, 16)) return false;
  if (!hex_field(v, 53, 2)) return false;
  if (v.substr(0, 2) == "00") return v.size() == kTraceparentLen;
  return v.size() == kTraceparentLen || v[kTraceparentLen] == '-';
}

bool valid_tracestate(std::string_view v) {
  if (v.size() > kTracestateMaxLen) return false;
  int members = 0;
  std::string_view keys[kTracestateMaxMembers];
  while (true) {
    const size_t comma = v.find(',');
    const std::string_view m = trim_ows(v.substr(0, comma));
    if (!m.empty()) {
      const size_t eq = m.find('=');
      if (eq == std::string_view::npos || members == kTracestateMaxMembers) return false;
      const std::string_view key = m.substr(0, eq);
      if (!valid_key(key) || !valid_value(m.substr(eq + 1))) return false;
      for (int i = 0; i < members; i++)
        if (keys[i] == key) return false;
      keys[members++] = key;
    }
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  return true;
}

std::string span_id_hex(uint64_t random64) {
  if (random64 == 0) random64 = 1;
  static const char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; i--, random64 >>= 4) out[i] = kHex[random64 & 15];
  return out;
}

std::string attempt_traceparent(std::string_view stored, uint64_t random64) {
  std::string out = "00-";
  out.append(stored.substr(3, 32));
  out += '-';
  out += span_id_hex(random64);
  out += '-';
  out.append(stored.substr(53, 2));
  return out;
}

TraceContext trace_context_from_headers(std::string_view headers_json) {
  TraceContext tc;
  if (headers_json.find("\"traceparent\"") == std::string_view::npos) return tc;
  const auto j = nlohmann::json::parse(headers_json, nullptr, false);
  if (!j.is_object()) return tc;
  const auto tp = j.find("traceparent");
  if (tp == j.end() || !tp->is_string() || !valid_traceparent(tp->get_ref<const std::string&>())) return tc;
  tc.traceparent = tp->get<std::string>();
  const auto ts = j.find("tracestate");
  if (ts != j.end() && ts->is_string() && valid_tracestate(ts->get_ref<const std::string&>()))
    tc.tracestate = ts->get<std::string>();
  return tc;
}

TraceContext sqlcommenter_trace_context(std::string_view statement) {
  TraceContext tc;
  if (statement.size() > kSqlcommenterScanBytes)
    statement = statement.substr(statement.size() - kSqlcommenterScanBytes);
  if (statement.find("traceparent") == std::string_view::npos) return tc;
  if (comment_value(statement, "traceparent", &tc.traceparent)) comment_value(statement, "tracestate", &tc.tracestate);
  return tc;
}

}  // namespace relaybus::core
