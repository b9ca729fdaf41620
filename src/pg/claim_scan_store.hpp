// The PostgreSQL store's side of the core claim scan: claim.cpp drives the
// scan one read at a time and performs each read with SPI in its own frames,
// which own no C++ objects; the scan's C++ state (cpp/claim_scan_store.h)
// sits behind an opaque pointer. An ERROR raised by a read between two steps
// leaves it to a reset callback on the memory context that was current at
// scan_begin(), so nothing leaks and no destructor is skipped.
#pragma once

#include "pg/cpp/claim_scan_store.h"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

struct ClaimScanState;  // opaque

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
int scan_hand_over(const int64_t* chosen, const bool* got, int nchosen, const FetchedData* fetched, int* order,
                   int* give_back, int* give_back_row, int* ngive);

}  // namespace relaybus::pg
