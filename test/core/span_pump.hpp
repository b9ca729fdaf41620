#pragma once

// The host loop of a span exporter in the tests: pump it and sleep for what
// wake_in_ms asks (at most 5 ms) until a condition holds, on the monotonic
// clock (the exporter's now_ms is the caller's clock: add and pump with it).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "core/span_exporter.hpp"

namespace relaybus::testing {

inline int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Returns the longest pump (a pump must never wait for the network).
inline int64_t pump_until(core::SpanExporter& e, const std::function<bool()>& pred, int64_t timeout_ms) {
  int64_t longest = 0;
  const int64_t end = steady_ms() + timeout_ms;
  while (!pred() && steady_ms() < end) {
    const int64_t t0 = steady_ms();
    e.pump(steady_ms());
    longest = std::max(longest, steady_ms() - t0);
    const int64_t w = e.wake_in_ms(steady_ms());
    std::this_thread::sleep_for(std::chrono::milliseconds(w < 0 ? 5 : std::min<int64_t>(w, 5)));
  }
  return longest;
}

}  // namespace relaybus::testing
