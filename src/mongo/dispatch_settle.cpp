// The dispatcher as the pipeline's store (core::DeliveryStore): completions
// are written to the deliveries only under a receipt (lane, the epoch at
// which this instance took the lane) that still holds; whoever holds the lane
// otherwise sends the delivery again (a duplicate after a lease loss, never a
// loss). Nothing is written to release a delivery: it is leased with its lane.
#include "mongo/dispatcher.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

bool Dispatcher::still_held(const core::ClaimedDelivery& d, int64_t now) {
  return leases_.receipt_holds(d.receipt, now);
}

void Dispatcher::release(const std::vector<core::ClaimedDelivery>& never_sent) {
  // Read again from the lane's window. Said when it is for a lapsed lease (a
  // loop pass longer than the lease's slack), which a healthy instance never sees.
  const int64_t now = wall_ms();
  size_t lapsed = 0;
  for (const auto& d : never_sent) lapsed += leases_.receipt_holds(d.receipt, now) ? 0 : 1;
  if (lapsed > 0)
    log_warn("deliveries given back unsent: their lane lease lapsed before they were sent",
             {{"deliveries", lapsed}, {"lease_ms", cfg_.lease_ms}});
}

void Dispatcher::complete(const std::vector<core::Completion>& batch) {
  // As before queuing: a pass of slow store calls since the last renewal
  // must not turn finished deliveries into dropped results (sent again).
  try {
    leases_.renew_if_due();
  } catch (const StoreError& e) {
    metrics_.store_errors++;
    log_warn("lease renewal failed", {{"error", e.what()}});
  }
  const int64_t now = wall_ms();
  std::vector<int64_t> ok_ids;
  std::vector<Failure> failures;
  std::vector<const core::Completion*> ok_done;
  for (const core::Completion& c : batch) {
    if (!leases_.receipt_holds(c.receipt, now)) {
      metrics_.handlers[c.handler].dropped++;
      log_warn("result dropped: lane lease not held", {{"id", c.id}, {"lane", c.receipt.a}});
      continue;
    }
    if (c.outcome == core::CompletionOutcome::Delivered) {
      ok_ids.push_back(c.id);
      ok_done.push_back(&c);
      continue;
    }
    const bool dead = c.outcome == core::CompletionOutcome::Dead;
    failures.push_back({c.id, c.error, c.status, dead, now + (dead ? 0 : c.retry_in_ms), c.handler});
  }
  store_.complete(ok_ids);
  store_.fail(failures, now);
  metrics_.last_store_ok_ms = wall_ms();
  for (const core::Completion* c : ok_done) {
    auto& m = metrics_.handlers[c->handler];
    m.delivered++;
    if (c->published > 0) metrics_.observe_latency(c->handler, (now - c->published) / 1000.0);
  }
  for (const auto& f : failures) {
    auto& m = metrics_.handlers[f.handler];
    (f.dead ? m.dead : m.retried)++;
    log(f.dead ? LogLevel::Warn : LogLevel::Info, f.dead ? "delivery dead-lettered" : "delivery will be retried",
        {{"id", f.id},
         {"handler", f.handler},
         {"error", f.error},
         {"status", f.status},
         {"retry_in_ms", f.dead ? 0 : f.not_before_ms - now}});
  }
}

void Dispatcher::flush() {
  if (!host_.ready() || host_.pipeline().waiting() == 0) return;
  try {
    host_.pipeline().flush(*this, wall_ms());
  } catch (const StoreError& e) {  // core::AfterStoreError::KeepResults
    metrics_.store_errors++;
    log_warn("completing a batch failed; will retry", {{"error", e.what()}, {"results", host_.pipeline().waiting()}});
    return;
  }
  // A completed key may have a successor ready now.
  loop_.next_fetch_ms = 0;
}

}  // namespace relaybus::mongo
