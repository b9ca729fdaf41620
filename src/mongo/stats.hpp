// The PostgreSQL views' numbers for relaybus-mongo (docs/mongo.md, "Stats"):
// `relaybus-mongo stats` (counted now, plus the live instances' in-flight
// counts and latency histograms from their heartbeats) and the dispatcher's
// /metrics gauges.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "mongo/store.hpp"

namespace relaybus::mongo {

// [{"handler","kind","pending","ready","delayed","in_flight","retrying","dead",
//   "oldest_age_ms","latency":{"le":[...],"buckets":[...],"count","sum_seconds"}}]
nlohmann::json stats_json(Store& store, int64_t now_ms);

}  // namespace relaybus::mongo
