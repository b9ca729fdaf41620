#include "core/prometheus.hpp"

#include <cstdio>

namespace relaybus::core {

std::string prometheus_label(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

void LatencyHistogram::observe(double seconds) noexcept {
  for (size_t i = 0; i < kBoundsS.size(); i++)
    if (seconds <= kBoundsS[i]) buckets[i]++;
  count++;
  sum_s += seconds;
}

double LatencyHistogram::quantile_ms(double q) const noexcept {
  if (count == 0) return -1;
  const double rank = q * static_cast<double>(count);
  double lower_s = 0;
  uint64_t below = 0;
  for (size_t i = 0; i < kBoundsS.size(); i++) {
    if (static_cast<double>(buckets[i]) >= rank) {
      const uint64_t in_bucket = buckets[i] - below;
      const double frac = in_bucket == 0 ? 1 : (rank - static_cast<double>(below)) / static_cast<double>(in_bucket);
      return (lower_s + (kBoundsS[i] - lower_s) * frac) * 1000;
    }
    lower_s = kBoundsS[i];
    below = buckets[i];
  }
  return kBoundsS.back() * 1000;
}

void append_prometheus_histogram_head(std::string* out, std::string_view name, std::string_view help) {
  *out += "# HELP ";
  *out += name;
  *out += ' ';
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += " histogram\n";
}

void append_prometheus_histogram(std::string* out, std::string_view name, std::string_view label_name,
                                 std::string_view label_value, const LatencyHistogram& h) {
  const std::string labels = std::string(label_name) + "=\"" + prometheus_label(label_value) + "\"";
  char buf[64];
  for (size_t i = 0; i <= h.kBoundsS.size(); i++) {
    const uint64_t n = i < h.kBoundsS.size() ? h.buckets[i] : h.count;
    if (i < h.kBoundsS.size())
      snprintf(buf, sizeof buf, "%g", h.kBoundsS[i]);
    else
      snprintf(buf, sizeof buf, "+Inf");
    *out += std::string(name) + "_bucket{" + labels + ",le=\"" + buf + "\"} " + std::to_string(n) + "\n";
  }
  snprintf(buf, sizeof buf, "%.6f", h.sum_s);
  *out += std::string(name) + "_sum{" + labels + "} " + buf + "\n";
  *out += std::string(name) + "_count{" + labels + "} " + std::to_string(h.count) + "\n";
}

}  // namespace relaybus::core
