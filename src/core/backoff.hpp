#pragma once

#include <cstdint>
#include <string_view>

namespace relaybus::core {

struct BackoffPolicy {
  int64_t base_ms = 1000;
  int64_t max_ms = 600000;
};

// min(max_ms, base_ms * 2^(attempt-1)) without overflow for any attempt;
// attempt < 1 counts as 1. Never negative (a negative base or max gives 0).
int64_t backoff_ceiling_ms(const BackoffPolicy& p, int attempt) noexcept;

// Full jitter (uniform in [0, ceiling]): random64 % (ceiling + 1). The caller
// supplies the randomness so the result is deterministic and testable.
int64_t backoff_delay_ms(const BackoffPolicy& p, int attempt, uint64_t random64) noexcept;

// Delay in ms requested by an HTTP Retry-After header value: delta-seconds
// ("120", saturating at INT64_MAX ms) or an HTTP-date. IMF-fixdate ("Wed, 21 Oct
// 2015 07:28:00 GMT") plus the two obsolete forms RFC 7231 says recipients must
// accept (RFC 850 "Wednesday, 21-Oct-15 07:28:00 GMT" and asctime "Wed Oct 21
// 07:28:00 2015"). Returns -1 if unparseable, 0 if the date is not in the future.
int64_t retry_after_ms(std::string_view header_value, int64_t now_epoch_ms);

// The longest wait a Retry-After can impose, whatever the handler: 7 days,
// the largest backoff_max a handler may have.
constexpr int64_t kRetryAfterCapMs = int64_t{7} * 24 * 3600 * 1000;

// A Retry-After delay (retry_after_ms's result) cut to max_ms and to
// kRetryAfterCapMs (max_ms < 0: kRetryAfterCapMs only), so that a server
// asking for a year, or for more than int64 can hold, parks a delivery no
// longer than its handler's backoff_max. -1 (no usable Retry-After) stays -1.
int64_t clamp_retry_after_ms(int64_t delay_ms, int64_t max_ms);

}  // namespace relaybus::core
