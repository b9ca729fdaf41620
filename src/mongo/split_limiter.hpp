// A handler's max_concurrency and rate across the instances serving one
// MongoDB (docs/mongo.md, "Rate and concurrency limits"): each live instance
// (its heartbeat document in relay_instances) takes an even share,
// core::split_limits by its rank among them, recounted at every lease tick;
// the core pipeline asks this class for permits without I/O.
#pragma once

#include <cstdint>
#include <map>

#include "core/delivery_pipeline.hpp"
#include "core/limit_share.hpp"

namespace relaybus::mongo {

class SplitLimiter final : public core::HandlerLimiter {
 public:
  // After each heartbeat: `live` instances, this one `rank`th by name.
  void set_instances(int live, int rank);
  // What this instance claims under: its share (the claim-ahead rule of
  // core::DeliveryPipeline::room then keeps its leases near what it sends).
  core::HandlerOptions share(const core::HandlerOptions& o) const { return core::split_limits(o, live_, rank_); }

  bool acquire(const core::PipelineHandler& h, int64_t now_ms, int64_t* retry_in_ms) override;
  void release(const core::PipelineHandler& h) override;
  void held_back(const core::PipelineHandler& h, int waited, int64_t now_ms) override;

  uint64_t held_back_total(int key) const;
  bool limited(int key, int64_t now_ms) const;  // a delivery waited within the last second

 private:
  struct State {
    core::ShareUse use;
    int burst = 1;  // the handler's effective burst, at its last permit
  };
  int live_ = 1;
  int rank_ = 0;
  std::map<int, State> states_;
};

}  // namespace relaybus::mongo
