#include "core/dispatch_policy.hpp"

namespace relaybus::core {

bool DispatchPolicy::after_success(bool isolated, int handed) noexcept {
  env_failures_ = 0;
  if (!isolated || handed <= 0) return false;
  isolation_left_--;
  return true;
}

AfterError DispatchPolicy::after_error(ErrorCause cause, int in_flight, int64_t now_ms) noexcept {
  // An error with nothing in flight cannot be any delivery's.
  if (cause == ErrorCause::Environment || in_flight == 0) {
    env_failures_++;
    retry_at_ms_ = now_ms + backoff_ceiling_ms(kEnvironmentBackoff, env_failures_);
    return AfterError::Backoff;
  }
  retry_at_ms_ = now_ms + kEnvironmentBackoff.base_ms;  // a short pause, then isolate
  if (isolating() && in_flight == 1) {
    isolation_left_ = 0;  // found: batches again
    return AfterError::NackPoison;
  }
  isolation_left_ = in_flight;
  return AfterError::Isolate;
}

}  // namespace relaybus::core
