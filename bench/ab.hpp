// A/B comparison of two builds: per-cell ratios with 95 % intervals over ABBA
// pairs, the noise rule, and the counter gate. The rules are stated once here
// (and in bench/README.md); report.md repeats them with the numbers.
#pragma once

#include <string>
#include <vector>

#include "report.hpp"

namespace bench {

// The rules, in one place so the report can print what it applied.
struct AbRules {
  double noise_factor = 1.25;      // a sample whose spin exceeds this x the run's quietest is noisy
  double effect_threshold = 0.05;  // "faster"/"slower" also needs the ratio beyond 1 +- this
  int min_pairs = 2;               // fewer usable pairs than this: "inconclusive"
  double gate_rate_floor = 0.90;   // the gate fails on a rate only if the whole CI is below this
};

// One counter the gate judges per pair: candidate <= base * (1 + rel) + abs.
struct GateCounter {
  const char* key;    // metric name in SampleResult::m
  const char* label;  // for the report
  double rel, abs;
};
const std::vector<GateCounter>& gate_counters();

struct AbInput {
  std::string run_id, out_dir, args;
  Json env;
  std::vector<SampleResult> samples;  // every sample, in run order, tagged with side and pair
  int pairs = 0;
  bool gate = false;
  double minutes = 0;
  AbRules rules;
};

struct AbOutcome {
  std::string markdown;
  bool gate_pass = true;
  std::vector<std::string> gate_failures;
};

// Writes report.md and comparison.json into in.out_dir.
AbOutcome write_ab_reports(const AbInput& in);

}  // namespace bench
