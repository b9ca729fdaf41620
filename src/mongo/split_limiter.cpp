#include "mongo/split_limiter.hpp"

#include <algorithm>

#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {
// A concurrency permit frees when a response comes in, which wakes the loop:
// this is only the fallback.
constexpr int64_t kConcurrencyRetryMs = 100;
}  // namespace

void SplitLimiter::set_instances(int live, int rank) {
  live = std::max(1, live);
  rank = std::clamp(rank, 0, live - 1);
  if (live == live_ && rank == rank_) return;
  live_ = live;
  rank_ = rank;
  // A smaller share starts with no more than its part of the burst (a larger
  // one fills at its rate).
  for (auto& [key, s] : states_) s.use.clamp_burst(std::max(1, s.burst / live_));
}

bool SplitLimiter::acquire(const core::PipelineHandler& h, int64_t now_ms, int64_t* retry_in_ms) {
  State& s = states_[h.key];
  const core::HandlerOptions mine = share(h.options);
  if (mine.rate > 0) s.burst = core::effective_burst(h.options);
  return s.use.take(mine.max_concurrency > 0 ? mine.max_concurrency : -1, mine, now_ms, kConcurrencyRetryMs,
                    retry_in_ms);
}

void SplitLimiter::release(const core::PipelineHandler& h) {
  auto it = states_.find(h.key);
  if (it != states_.end()) it->second.use.give_back();
}

void SplitLimiter::held_back(const core::PipelineHandler& h, int waited, int64_t now_ms) {
  State& s = states_[h.key];
  if (!s.use.note_held_back(waited, now_ms)) return;
  nlohmann::json f = core::held_back_fields(h);
  f["instances"] = live_;
  f["rank"] = rank_;
  log_info("handler held back by its limits", f);
}

uint64_t SplitLimiter::held_back_total(int key) const {
  auto it = states_.find(key);
  return it == states_.end() ? 0 : it->second.use.held_back();
}

bool SplitLimiter::limited(int key, int64_t now_ms) const {
  auto it = states_.find(key);
  return it != states_.end() && it->second.use.limited(now_ms);
}

}  // namespace relaybus::mongo
