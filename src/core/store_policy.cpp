#include "core/store_policy.hpp"

#include <algorithm>

#include "core/backoff.hpp"

namespace relaybus::core {

int64_t lease_renew_interval_ms(int64_t lease_ms) { return std::max<int64_t>(100, lease_ms / 3); }

int64_t lease_margin_ms(int64_t lease_ms) { return std::max<int64_t>(200, lease_ms / 5); }

bool lease_usable(int64_t until_ms, int64_t lease_ms, int64_t now_ms) {
  return now_ms < until_ms - lease_margin_ms(lease_ms);
}

bool renewal_keeps_tenure(int64_t until_ms, int64_t lease_ms, int64_t acked_ms) {
  return lease_usable(until_ms, lease_ms, acked_ms);
}

StoreErrorPolicy on_store_error(StorePhase phase) {
  switch (phase) {
    case StorePhase::Leases:
    case StorePhase::Renewal:
      // A second apart: a store that is down is not asked a lease question
      // on every pass, and a lease of 1 s or more still gets two tries.
      return {AfterStoreError::PauseLeases, 1000};
    case StorePhase::Claim:
      return {AfterStoreError::NextHandler, 0};
    case StorePhase::Sequence:
      return {AfterStoreError::RetryPhase, 500};
    case StorePhase::Settle:
      return {AfterStoreError::KeepResults, 0};
    case StorePhase::Backlog:
      return {AfterStoreError::Skip, 0};
  }
  return {};
}

void StoreBackoff::failed(int64_t now_ms, StorePhase phase) {
  const StoreErrorPolicy p = on_store_error(phase);
  if (p.after == AfterStoreError::PauseLeases) until_ms_ = now_ms + p.retry_in_ms;
}

int64_t reconnect_backoff_ms(int failures) { return backoff_ceiling_ms(BackoffPolicy{250, 30000}, failures); }

int64_t next_backlog_refresh_ms(int64_t now_ms, int64_t lease_ms, int64_t took_ms) {
  return std::max(now_ms + std::max<int64_t>(10000, lease_ms), now_ms + 20 * took_ms);
}

}  // namespace relaybus::core
