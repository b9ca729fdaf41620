#pragma once

// Limits a handler shares with other processes, where no shared memory holds
// one budget for them (relaybus-agent, relaybus-mongo): each process's part
// of max_concurrency, rate and burst, and the token bucket it spends its rate
// from. The extension's dispatchers share one bucket in shared memory instead.

#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/delivery_pipeline.hpp"
#include "core/handler_config.hpp"

namespace relaybus::core {

// Process `rank` (0 .. of - 1) of `of`'s even share of o's max_concurrency,
// rate and burst: max_concurrency / of, the first max_concurrency % of ranks
// one more; rate / of; effective_burst / of. Each part that is set is at
// least 1, so with more processes than max_concurrency (or burst) together
// they may have up to `of` at once. Unset limits stay unset.
HandlerOptions split_limits(const HandlerOptions& o, int of, int rank);

// Tokens refilled at `rate` per second up to `cap`; the first take starts
// full.
class TokenBucket {
 public:
  // One token, or false and *retry_in_ms until there is one.
  bool take(double rate, double cap, int64_t now_ms, int64_t* retry_in_ms);
  // A smaller share: no more tokens than the new cap.
  void clamp(double cap);

 private:
  double tokens_ = -1;  // < 0: never taken from
  int64_t refilled_ms_ = 0;
};

// One handler's use of a process's share: its permits out, its bucket, and
// what waited (a core::HandlerLimiter's state per handler).
class ShareUse {
 public:
  // A permit under `share` with at most `cap` out (< 0: no cap); refused for
  // the cap: *retry_in_ms = cap_retry_ms.
  bool take(int cap, const HandlerOptions& share, int64_t now_ms, int64_t cap_retry_ms, int64_t* retry_in_ms);
  void give_back() { in_use_ -= in_use_ > 0 ? 1 : 0; }
  // `waited` more deliveries began to wait; true if the handler was not
  // held back in the last second (a moment to say so in the log).
  bool note_held_back(int waited, int64_t now_ms);
  void clamp_burst(int burst) { bucket_.clamp(burst); }
  int in_use() const { return in_use_; }
  uint64_t held_back() const { return held_back_; }
  // A delivery waited within the last second (relay.handler_stats `limited`).
  bool limited(int64_t now_ms) const { return now_ms < limited_until_ms_; }

 private:
  int in_use_ = 0;
  TokenBucket bucket_;
  uint64_t held_back_ = 0;
  int64_t limited_until_ms_ = 0;
};

// The log fields of a handler that begins to be held back by its limits.
nlohmann::json held_back_fields(const PipelineHandler& h);

}  // namespace relaybus::core
