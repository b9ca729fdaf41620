#include "lane_hash.hpp"

namespace relaybus::core {

namespace {
constexpr uint64_t kFnvOffset = 14695981039346656037ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;
}  // namespace

uint64_t fnv1a64(std::string_view bytes) noexcept {
  uint64_t h = kFnvOffset;
  for (char c : bytes) {
    // Through unsigned char so bytes >= 0x80 are not sign-extended.
    h ^= static_cast<unsigned char>(c);
    h *= kFnvPrime;
  }
  return h;
}

int lane_for_key(std::string_view key, int lanes) noexcept {
  if (lanes < 1) return 0;
  return static_cast<int>(fnv1a64(key) % static_cast<uint64_t>(lanes));
}

int lane_for_unkeyed(int64_t event_id, int lanes) {
  if (lanes < 1) return 0;
  return static_cast<int>(static_cast<uint64_t>(event_id) % static_cast<uint64_t>(lanes));
}

}  // namespace relaybus::core
