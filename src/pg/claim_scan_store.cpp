#include "pg/claim_scan_store.hpp"

#include "pg/boundary.hpp"

namespace relaybus::pg {

struct ClaimScanState {
  MemoryContextCallback cb;  // frees impl when the context goes (an ERROR between steps)
  ScanImpl* impl;
};

static void free_scan(void* arg) {
  auto* s = static_cast<ClaimScanState*>(arg);
  scan_impl_delete(s->impl);
  s->impl = nullptr;
}

// The scan's C++ code failed: the message says in which step.
[[noreturn]] static void scan_failed(const char* step, const ErrorRecord* err) {
  char what[64];
  snprintf(what, sizeof(what), "relaybus claim scan failed (%s)", step);
  raise_error_in(what, err);
}

ClaimScanState* scan_begin(const ScanConfigData* cfg, const ScanHintData* hint) {
  auto* s = static_cast<ClaimScanState*>(palloc0(sizeof(ClaimScanState)));
  s->cb.func = free_scan;
  s->cb.arg = s;
  MemoryContextRegisterResetCallback(CurrentMemoryContext, &s->cb);
  ErrorRecord err;
  if (!scan_impl_new(cfg, hint, &s->impl, &err)) scan_failed("begin", &err);
  return s;
}

void scan_next(ClaimScanState* s, ScanStepData* out) {
  ErrorRecord err;
  if (!scan_impl_next(s->impl, out, &err)) scan_failed("next", &err);
}

void scan_feed(ClaimScanState* s, const ScanRowsData* rows) {
  ErrorRecord err;
  if (!scan_impl_feed(s->impl, rows, &err)) scan_failed("feed", &err);
}

void scan_outcome(ClaimScanState* s, ScanOutcomeData* out, ScanHintData* hint) {
  ErrorRecord err;
  if (!scan_impl_outcome(s->impl, out, hint, &err)) scan_failed("outcome", &err);
}

void scan_end(ClaimScanState* s) { free_scan(s); }

int scan_hand_over(const int64_t* chosen, const bool* got, int nchosen, const FetchedData* fetched, int* order,
                   int* give_back, int* give_back_row, int* ngive) {
  int count = 0;
  ErrorRecord err;
  if (!scan_impl_hand_over(chosen, got, nchosen, fetched, order, give_back, give_back_row, ngive, &count, &err))
    scan_failed("hand-over", &err);
  return count;
}

}  // namespace relaybus::pg
