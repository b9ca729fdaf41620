#include "text_util.hpp"

#include <cstdio>

namespace relaybus::core::text {

void set_why(std::string* why, std::string msg) {
  if (why) *why = std::move(msg);
}

std::string describe_char(unsigned char c) {
  if (c >= 0x21 && c <= 0x7e) return std::string("character '") + static_cast<char>(c) + "'";
  if (c == ' ') return "a space";
  char buf[16];
  std::snprintf(buf, sizeof buf, "byte 0x%02X", c);
  return buf;
}

namespace {

// Length of the longest prefix of s of at most max_bytes that does not split
// a multi-byte UTF-8 sequence (backs up over continuation bytes).
size_t utf8_prefix(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s.size();
  size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

std::string truncate_utf8(std::string_view s, size_t max_bytes) {
  const size_t n = utf8_prefix(s, max_bytes);
  std::string out(s.substr(0, n));
  if (n < s.size()) out += "...";
  return out;
}

std::string quote(std::string_view s, size_t max_bytes) {
  const size_t n = utf8_prefix(s, max_bytes);
  const bool cut = n < s.size();
  s = s.substr(0, n);
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f)
      out += '?';
    else if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else
      out += ch;
  }
  if (cut) out += "...";
  out += '"';
  return out;
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

}  // namespace relaybus::core::text
