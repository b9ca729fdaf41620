#pragma once

// Milliseconds of the two clocks the processes beside the server use: wall
// time (Unix ms: the pipeline's, lease and webhook times) and a monotonic
// clock (intervals that must not jump with the wall clock).

#include <chrono>
#include <cstdint>

namespace relaybus::core {

inline int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline int64_t monotonic_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace relaybus::core
