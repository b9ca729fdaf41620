// The PostgreSQL store's side of the core claim scan (core/claim_scan.hpp),
// in plain C types: claim.cpp (PostgreSQL glue, no STL) drives the scan one
// read at a time and performs each read with SPI in its own frames, which own
// no C++ objects; claim_scan_store.cpp converts to and from the core's types
// under run_core(). An ERROR raised by a read between two steps leaves the
// scan's C++ state to a reset callback on the memory context that was current
// at scan_begin(), so nothing leaks and no destructor is skipped.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

struct ClaimScanState;  // opaque

// What the backend keeps per handler between claims (core::ClaimScanHint).
struct ScanHintData {
  int window;
  int window_front;
  uint32 claims;
};

struct ScanConfigData {
  int max;
  int per_key;
  int64 now_ms;
  int64 aging_ms;
  int scan_limit;
  bool from_frontier;  // start at frontier[], else at floor[]
  int64 frontier[4];
  int64 floor[4];
  bool key_walk_filtered;  // the key walk passes keys of other lanes
};

enum class ScanStep { Window, KeyHeads, HeadsOfKeys, Done };

struct ScanStepData {
  ScanStep kind;
  int64 from[4];  // Window: per class (all 0: from the very start)
  int window;
  bool at_floor;
  int max_keys;             // KeyHeads
  int per_key;              // KeyHeads, HeadsOfKeys
  int nkeys;                // HeadsOfKeys
  const char* const* keys;  // owned by the scan, valid until the next step
};

// One read's rows (keys[i] nullptr: unkeyed; key_below nullptr: none marked).
struct ScanRowsData {
  int n;
  const int64* ids;
  const int* priority;
  char* const* keys;
  const int64* ready_at_ms;
  const bool* leased;
  const bool* expired;
  const bool* key_below;
};

struct ScanPassedData {
  int64 id;
  int priority;
  const char* key;
};

// What the scan decided; pointers valid until scan_end().
struct ScanOutcomeData {
  int nchosen;
  const int64* chosen;  // plan order
  bool heads_added;
  bool at_floor;
  int64 from[4];
  int64 first[4];
  int64 highest[4];
  int64 next_ready_ms;
  int nexpired;
  const int64* expired;
  int64 upto[4];
  int npassed;
  const ScanPassedData* passed;
};

// Starts a scan in CurrentMemoryContext, from the handler's hint.
ClaimScanState* scan_begin(const ScanConfigData* cfg, const ScanHintData* hint);
void scan_next(ClaimScanState* s, ScanStepData* out);
void scan_feed(ClaimScanState* s, const ScanRowsData* rows);
// Once scan_next() said Done: the outcome, and the hint for the next claim.
void scan_outcome(ClaimScanState* s, ScanOutcomeData* out, ScanHintData* hint);
void scan_end(ClaimScanState* s);

// The fetched rows (keys[i] nullptr: unkeyed) of the leased chosen ids
// (got[i]: its lease was taken): which to hand over (order[]: fetched row
// numbers in hand-over order, returns how many) and which leases go back
// (give_back[]: indices into chosen, give_back_row[]: their fetched row, -1:
// gone; *ngive). Every output array holds nchosen entries.
struct FetchedData {
  int n;
  const int64* ids;
  char* const* keys;
  const int64* seqs;
  const bool* valid;
};
int scan_hand_over(const int64* chosen, const bool* got, int nchosen, const FetchedData* fetched, int* order,
                   int* give_back, int* give_back_row, int* ngive);

}  // namespace relaybus::pg
