// The sidecar's one claim of a handler's ready deliveries from the lanes this
// instance holds (docs/mongo.md, "Dispatch", steps 1 and 2): the dispatcher
// claims for its http and kafka handlers with it, the pull API for a
// consumer's request. It performs the reads the core claim scan
// (core/claim_scan.hpp) asks for with its Store, dead-letters malformed
// documents, and returns the chosen deliveries in hand-over order.
// What follows the claim is the caller's: the dispatcher's receipts and
// pipeline queue, the pull API's leases and JSON.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/claim_planner.hpp"
#include "core/claim_scan.hpp"
#include "mongo/config.hpp"
#include "mongo/metrics.hpp"
#include "mongo/store.hpp"

namespace relaybus::mongo {

// Rows one read of the oldest rows of all classes takes: scan_window, else
// 4 x batch_size, at least 64.
int claim_window_rows(const Config& cfg);

struct ClaimAsk {
  std::vector<int> lanes;  // the leased lanes to read
  int window = 64;         // claim_window_rows
  core::ClaimLimits limits;
  int64_t aging_ms = 0;  // priority_aging
  int64_t now_ms = 0;
  // A delivery this caller has handed out and not yet settled: it blocks its
  // key and is not handed out again (the pipeline's queue and in-flight
  // requests, or the pull API's leases).
  std::function<bool(int64_t id)> handed_out;
};

struct LaneClaim {
  std::vector<Delivery> deliveries;  // hand-over order
  bool may_have_more = false;        // core::ClaimPlan's: a wider read could find more
};

class LaneClaimer {
 public:
  LaneClaimer(Store& store, Metrics& metrics) : store_(store), metrics_(metrics) {}

  // The next claim reads Store::read_inserted_bound before its windows; the
  // claims after it, until the next call, reuse that bound (one read per
  // dispatcher pass over its handlers).
  void new_pass() { bound_read_ = false; }

  // Counts the reads (metrics fetches) and the malformed documents it
  // dead-lettered (the handler's dead count); throws StoreError.
  LaneClaim claim(const std::string& handler, const ClaimAsk& ask);

 private:
  Store& store_;
  Metrics& metrics_;
  bool bound_read_ = false;
  // Per handler, what the claim scan remembers between claims (its window
  // sizes, and whether the backlog was deep). A dropped handler's entry stays
  // (a few bytes); a handler created again under its name starts from it.
  std::map<std::string, core::ClaimScanHint> hints_;
  std::set<int64_t> warned_malformed_;  // logged once per document
};

}  // namespace relaybus::mongo
