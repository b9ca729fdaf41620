#pragma once

// Prometheus text exposition (format 0.0.4) helpers for the processes beside
// the server.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace relaybus::core {

// A label value as it goes between the quotes: '\' and '"' escaped, a newline
// as \n.
std::string prometheus_label(std::string_view value);

// Seconds from publish to completion, as relaybus-mongo and relaybus-agent
// expose them (one series per handler): one set of bounds, 1 ms to 5 min, so
// that one dashboard query reads both programs.
struct LatencyHistogram {
  static constexpr std::array<double, 16> kBoundsS = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                      0.5,   1,      2.5,   5,    10,    30,   60,  300};
  std::array<uint64_t, 16> buckets{};  // cumulative: observations <= kBoundsS[i]
  uint64_t count = 0;
  double sum_s = 0;

  void observe(double seconds) noexcept;
  // The q-quantile (0 < q <= 1) in ms, interpolated linearly inside its
  // bucket as Prometheus' histogram_quantile does (the first bucket from 0);
  // -1 with no observations, the last bound when it lies beyond it.
  double quantile_ms(double q) const noexcept;
};

// The `# HELP` and `# TYPE ... histogram` lines of `name`.
void append_prometheus_histogram_head(std::string* out, std::string_view name, std::string_view help);
// One series of `name`: its _bucket lines (le="+Inf" last, equal to the
// count), _sum and _count, labelled label_name="label_value".
void append_prometheus_histogram(std::string* out, std::string_view name, std::string_view label_name,
                                 std::string_view label_value, const LatencyHistogram& h);

}  // namespace relaybus::core
