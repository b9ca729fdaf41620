#include "core/lease_token.hpp"

#include <algorithm>

namespace relaybus::core {

namespace {
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
constexpr int64_t kDayMs = int64_t{86400000};
}  // namespace

bool parse_lease_token(std::string_view text, uint64_t* hi, uint64_t* lo) {
  if (text.size() != 36) return false;
  uint64_t words[2] = {0, 0};
  int nibbles = 0;
  for (size_t i = 0; i < text.size(); i++) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (text[i] != '-') return false;
      continue;
    }
    const int v = hex_value(text[i]);
    if (v < 0) return false;
    uint64_t& w = words[nibbles / 16];
    w = (w << 4) | static_cast<uint64_t>(v);
    nibbles++;
  }
  *hi = words[0];
  *lo = words[1];
  return true;
}

std::string format_lease_token(uint64_t hi, uint64_t lo) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (int n = 0; n < 32; n++) {
    if (n == 8 || n == 12 || n == 16 || n == 20) out += '-';
    const uint64_t w = n < 16 ? hi : lo;
    out += kHex[(w >> (60 - 4 * (n % 16))) & 0xf];
  }
  return out;
}

int64_t http_lease_ms(int64_t lease_ms, int64_t timeout_ms, int64_t margin_ms) {
  const int64_t floor_ms = std::max<int64_t>(timeout_ms, 0) + 2 * std::max<int64_t>(margin_ms, 0);
  return std::min(kDayMs, std::max({lease_ms, floor_ms, int64_t{1000}}));
}

int64_t http_queue_ms(int64_t leased_ms, int64_t timeout_ms, int64_t margin_ms) {
  return std::max<int64_t>(0, leased_ms - std::max<int64_t>(timeout_ms, 0) - std::max<int64_t>(margin_ms, 0));
}

}  // namespace relaybus::core
