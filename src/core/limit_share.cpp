#include "core/limit_share.hpp"

#include <algorithm>
#include <cmath>

namespace relaybus::core {

HandlerOptions split_limits(const HandlerOptions& o, int of, int rank) {
  HandlerOptions s = o;
  of = std::max(1, of);
  rank = std::clamp(rank, 0, of - 1);
  if (o.max_concurrency > 0)
    s.max_concurrency = std::max(1, o.max_concurrency / of + (rank < o.max_concurrency % of ? 1 : 0));
  if (o.rate > 0) {
    s.rate = o.rate / of;
    s.burst = std::max(1, effective_burst(o) / of);
  }
  return s;
}

bool TokenBucket::take(double rate, double cap, int64_t now_ms, int64_t* retry_in_ms) {
  if (tokens_ < 0) {
    tokens_ = cap;
  } else {
    tokens_ = std::min(cap, tokens_ + static_cast<double>(std::max<int64_t>(0, now_ms - refilled_ms_)) * rate / 1000.0);
  }
  refilled_ms_ = now_ms;
  if (tokens_ < 1) {
    *retry_in_ms = std::max<int64_t>(1, static_cast<int64_t>(std::ceil((1 - tokens_) * 1000 / rate)));
    return false;
  }
  tokens_ -= 1;
  return true;
}

bool ShareUse::take(int cap, const HandlerOptions& share, int64_t now_ms, int64_t cap_retry_ms, int64_t* retry_in_ms) {
  if (cap >= 0 && in_use_ >= cap) {
    *retry_in_ms = cap_retry_ms;
    return false;
  }
  if (share.rate > 0 && !bucket_.take(share.rate, share.burst, now_ms, retry_in_ms)) return false;
  in_use_++;
  return true;
}

bool ShareUse::note_held_back(int waited, int64_t now_ms) {
  const bool began = now_ms >= limited_until_ms_;
  held_back_ += static_cast<uint64_t>(std::max(0, waited));
  limited_until_ms_ = now_ms + 1000;
  return began;
}

nlohmann::json held_back_fields(const PipelineHandler& h) {
  return {{"handler", h.name}, {"max_concurrency", h.options.max_concurrency}, {"rate", h.options.rate}};
}

void TokenBucket::clamp(double cap) {
  if (tokens_ > cap) tokens_ = cap;
}

}  // namespace relaybus::core
