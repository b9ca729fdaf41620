// Claim and stage: each http and kafka handler's claim from the lanes held
// (lane_claim.hpp), as many as the pipeline has room for, queued in the
// pipeline with their receipts.
#include <algorithm>

#include "core/handler_config.hpp"
#include "mongo/dispatcher.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

void Dispatcher::claim_and_stage() {
  if (wall_ms() < loop_.next_fetch_ms) return;
  // Store calls block this loop (FerretDB: up to seconds each at a large
  // backlog): a renewal that fell due meanwhile goes first.
  tick_if_due();
  const int64_t now = wall_ms();
  loop_.next_fetch_ms = now + cfg_.poll_interval_ms;
  if (!host_.ensure(cfg_, rng_)) return;
  if (leases_.claimable(now).empty()) return;
  claimer_.new_pass();
  for (auto& [name, h] : catalog_.sent()) {
    try {
      stage(h);
    } catch (const StoreError& e) {  // core::AfterStoreError::NextHandler
      metrics_.store_errors++;
      log_warn("fetch failed", {{"handler", name}, {"error", e.what()}});
    }
  }
}

void Dispatcher::stage(SentHandler& h) {
  const int64_t now = wall_ms();
  core::DeliveryPipeline& pipeline = host_.pipeline();
  metrics_.breaker_open[h.doc.name] = pipeline.breaker_open(h.key);
  if (core::has_shared_limit(h.pipe->options)) {
    metrics_.held_back[h.doc.name] = host_.limiter().held_back_total(h.key);
    metrics_.limited[h.doc.name] = host_.limiter().limited(h.key, now);
  }
  // The pipeline's claim-ahead rule (the PostgreSQL dispatchers' too), a batch at most.
  const core::HandlerOptions& o = h.pipe->options;
  const int room = core::has_shared_limit(o) ? pipeline.room(h.key, o.concurrency, host_.limiter().share(o), now)
                                             : pipeline.room(h.key, o.concurrency, now);
  const int cap = std::min(room, cfg_.batch_size);
  if (cap <= 0) return;

  ClaimAsk ask;
  for (const auto& [lane, since] : leases_.claimable(now)) ask.lanes.push_back(lane);
  ask.window = claim_window_rows(cfg_);
  ask.limits.max = cap;
  // HTTP requests run concurrently: one per key in flight keeps the order. A
  // kafka handler's run of a key is produced at once, its sink keeps it in
  // order (docs/kafka.md, "A busy key pipelined"); the key's next run waits
  // for this one's end (its held deliveries block the key in the claim).
  ask.limits.per_key = core::effective_key_window(h.doc.kind, h.doc.options);
  ask.aging_ms = cfg_.priority_aging_ms;
  ask.now_ms = now;
  ask.handed_out = [&pipeline](int64_t id) { return pipeline.holds(id); };
  LaneClaim got = claimer_.claim(h.doc.name, ask);
  if (got.deliveries.empty()) return;

  // The reads above may have outlasted a tick interval (a deep backlog on a
  // slow store: seconds). Renew before the plan's deliveries are queued:
  // with the lease's slack used up their receipts would not hold when the
  // pipeline sends them, and every one would go back unsent, pass after pass.
  leases_.renew_if_due();

  std::vector<core::ClaimedDelivery> claimed;
  claimed.reserve(got.deliveries.size());
  for (const Delivery& d : got.deliveries) {
    core::ClaimedDelivery c;
    c.message.id = d.id;
    c.message.event_id = d.event_id;
    c.message.topic = d.topic;
    c.message.has_key = d.has_key;
    c.message.key = d.key;
    c.message.seq = d.seq;
    c.message.attempt = d.attempt + 1;
    c.message.published_at_ms = d.published_ms;
    c.message.headers_json = d.headers_json;
    c.message.payload_json = d.payload_json;
    c.receipt = leases_.receipt(d.lane);
    c.published = d.published_ms;
    claimed.push_back(std::move(c));
  }
  // Held while the lane is: a queued delivery goes out only while its receipt
  // holds, and for a lease from now at most (not from the fetch's start: its
  // reads may have taken longer than that).
  pipeline.enqueue(h.pipe, std::move(claimed), wall_ms() + cfg_.lease_ms);
  pipeline.pump(*this, wall_ms());
  pause_point("after_stage", h.doc.name);  // a test hook: a store call that blocks the loop here
  metrics_.in_flight = static_cast<int>(host_.in_flight());
  // More may be waiting: look again as soon as there is room.
  if (static_cast<int>(got.deliveries.size()) >= cap || got.may_have_more) loop_.next_fetch_ms = 0;
}

}  // namespace relaybus::mongo
