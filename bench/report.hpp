#pragma once

#include <map>
#include <string>
#include <vector>

#include "model.hpp"
#include "util.hpp"

namespace bench {

// One sample's outcome: the flat metrics the report reads, and the full JSON line.
struct SampleResult {
  Cell cell;
  int sample_no = 0;
  std::string side;  // A/B: "base" | "candidate" ("" in a single-build run)
  int pair = 0;      // A/B: the pair (1..N) this sample belongs to
  bool valid = true;
  std::vector<std::string> invalid;  // reasons
  bool exact_checked = false;
  std::map<std::string, double> m;  // flat metrics (see harness.cpp for the names)
  Json json;
};

struct ReportInput {
  std::string run_id;
  std::string out_dir;
  Json env;
  std::vector<SampleResult> samples;
  double minutes = 0;
  std::string args;
  std::vector<std::string> notes;  // e.g. "River: not installed (why)": peers whose cells were skipped
};

// Writes report.md and comparison.json into in.out_dir; returns the markdown.
std::string write_reports(const ReportInput& in);

}  // namespace bench
