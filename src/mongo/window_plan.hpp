// The ids under which a fetched window of deliveries is planned
// (core::plan_claim), shared by the dispatcher and the pull API.
#pragma once

#include <cstdint>
#include <vector>

#include "mongo/store.hpp"

namespace relaybus::mongo {

struct WindowPlanIds {
  std::vector<size_t> rows;       // indexes of the rows that can be planned (not malformed)
  std::vector<int64_t> plan_id;   // per row of the window
};

// The window is in _id order; within a key, seq order is the truth, so each
// key's rows get that key's ids re-dealt in seq order (on a server without
// transactions two publishers of one key may draw ids and seqs in different
// orders).
WindowPlanIds window_plan_ids(const std::vector<Delivery>& window);

}  // namespace relaybus::mongo
