// The core claim scan (core/claim_scan.hpp) in plain C types, between the
// PostgreSQL store's glue (claim.cpp, claim_scan_store.cpp: the reads, with
// SPI, and the scan's lifetime in a memory context) and its C++ half
// (cpp/claim_scan_store.cpp: the conversions to and from the core's types).
// Every function runs under invoke_cpp and returns false with *err filled.
#pragma once

#include <cstdint>

#include "pg/cpp/boundary.h"

namespace relaybus::pg {

// What the backend keeps per handler between claims (core::ClaimScanHint).
struct ScanHintData {
  int window;
  int window_front;
  uint32_t claims;
};

struct ScanConfigData {
  int max;
  int per_key;
  int64_t now_ms;
  int64_t aging_ms;
  int scan_limit;
  bool from_frontier;  // start at frontier[], else at floor[]
  int64_t frontier[4];
  int64_t floor[4];
  bool key_walk_filtered;  // the key walk passes keys of other lanes
};

enum class ScanStep { Window, KeyHeads, HeadsOfKeys, Done };

struct ScanStepData {
  ScanStep kind;
  int64_t from[4];  // Window: per class (all 0: from the very start)
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
  const int64_t* ids;
  const int* priority;
  char* const* keys;
  const int64_t* ready_at_ms;
  const bool* leased;
  const bool* expired;
  const bool* key_below;
};

struct ScanPassedData {
  int64_t id;
  int priority;
  const char* key;
};

// What the scan decided; pointers valid until scan_end().
struct ScanOutcomeData {
  int nchosen;
  const int64_t* chosen;  // plan order
  bool heads_added;
  bool at_floor;
  int64_t from[4];
  int64_t first[4];
  int64_t highest[4];
  int64_t next_ready_ms;
  int nexpired;
  const int64_t* expired;
  int64_t upto[4];
  int npassed;
  const ScanPassedData* passed;
};

// The rows fetched for the leased chosen ids (keys[i] nullptr: unkeyed).
struct FetchedData {
  int n;
  const int64_t* ids;
  char* const* keys;
  const int64_t* seqs;
  const bool* valid;
};

struct ScanImpl;  // opaque: the core scan and the plain views of its answers

bool scan_impl_new(const ScanConfigData* cfg, const ScanHintData* hint, ScanImpl** out, ErrorRecord* err) noexcept;
void scan_impl_delete(ScanImpl* impl) noexcept;
bool scan_impl_next(ScanImpl* impl, ScanStepData* out, ErrorRecord* err) noexcept;
bool scan_impl_feed(ScanImpl* impl, const ScanRowsData* rows, ErrorRecord* err) noexcept;
bool scan_impl_outcome(ScanImpl* impl, ScanOutcomeData* out, ScanHintData* hint, ErrorRecord* err) noexcept;
// scan_hand_over (claim_scan_store.hpp); *count: how many rows to hand over.
bool scan_impl_hand_over(const int64_t* chosen, const bool* got, int nchosen, const FetchedData* fetched, int* order,
                         int* give_back, int* give_back_row, int* ngive, int* count, ErrorRecord* err) noexcept;

}  // namespace relaybus::pg
