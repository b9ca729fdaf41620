#pragma once

#include <cstdint>
#include <string_view>

namespace relaybus::core {

// Fixed number of lanes (hash partitions). Changing it remaps every key, so it
// is part of the on-disk format.
constexpr int kLanes = 64;

// 64-bit FNV-1a over the raw bytes (no normalisation: "é" precomposed and
// decomposed are different keys, exactly as PostgreSQL's text equality says).
uint64_t fnv1a64(std::string_view bytes) noexcept;

// fnv1a64(key) % lanes. lanes < 1 yields 0 rather than dividing by zero.
int lane_for_key(std::string_view key, int lanes = kLanes) noexcept;

// (uint64_t)event_id % lanes, spreading unkeyed events round-robin by id.
// lanes < 1 yields 0.
int lane_for_unkeyed(int64_t event_id, int lanes = kLanes);

}  // namespace relaybus::core
