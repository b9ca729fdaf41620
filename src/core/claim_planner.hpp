#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace relaybus::core {

struct ClaimRow {
  int64_t id;
  int priority;  // 0..3 (clamped if outside)
  bool has_key;
  std::string key;
  int64_t ready_at_ms;  // not_before, epoch ms
  bool leased;          // currently leased by someone (checked by the caller)
};

struct ClaimLimits {
  int max = 100;
  int per_key = 1;
};

struct ClaimPlan {
  // Chosen, in hand-over order: keys (an unkeyed row is its own group) ordered
  // by when their first row was chosen, and within one key ascending id.
  std::vector<int64_t> ids;
  // Fewer than max rows were chosen and some stream was truncated, so a wider
  // scan could find more.
  bool may_have_more = false;
  // How deep the plan read into the streams: the largest count of rows taken
  // off one stream before it stopped (every row of the input when it did not
  // fill max). A caller sizing its next scan window per class uses it.
  int64_t rows_needed = 0;
  // Distinct keys, keyed rows and unkeyed rows in the input (repeated ids
  // excluded): a caller tells from them whether a wider scan could help.
  int64_t distinct_keys = 0;
  int64_t keyed_rows = 0;
  int64_t unkeyed_rows = 0;
};

// Decides which deliveries one claim takes from up to 4 "class streams"
// (index = priority class; each ascending by id, as one index range scan
// returned it; truncated[i] = more rows exist after stream i's last row).
//
// Merge: repeatedly take the head row among the streams with the highest
// effective priority
//   eff = min(3, priority + (aging_ms > 0 ? (now_ms - ready_at_ms) / aging_ms : 0))
// (age < 0, i.e. not ready, counts as 0), ties: older ready_at first, then
// lower id. One key's rows may sit in different classes, and priority never
// reorders a key: a keyed row reaching its stream's head while a lower id of
// its key is still in another stream is set aside (not holding up its own
// stream) and becomes a candidate once those lower ids are taken. Then for
// the taken row:
//   - not ready (ready_at_ms > now_ms): if keyed, the key becomes blocked; skip.
//   - leased: if keyed, the key becomes blocked; skip.
//   - keyed and key blocked: skip.
//   - keyed and per_key rows of this key already chosen: skip (key full).
//   - otherwise choose it, and then take the key's following rows at once
//     (up to per_key, while each is ready, unleased and of no lower effective
//     priority), so that a claim holds whole runs of few keys rather than a
//     few rows of every key.
// Stops when max rows are chosen or all streams are consumed. An id seen a
// second time is ignored. max < 1 chooses nothing; per_key < 1 counts as 1.
ClaimPlan plan_claim(const std::array<std::vector<ClaimRow>, 4>& streams_by_priority,
                     const std::array<bool, 4>& truncated, const ClaimLimits& lim, int64_t now_ms, int64_t aging_ms);

// After the caller leases the chosen ids and re-reads them with a fresh
// snapshot: present = the row still exists (absent rows were completed
// meanwhile and are simply left out), valid = present, ready, and every
// earlier row of its key is gone or in the claim.
struct CheckedRow {
  int64_t id;
  bool has_key;
  std::string key;
  bool present;
  bool valid;
};

// Rows to hand over: the valid ones in plan order, except that once a keyed
// row is present but invalid, every later row of that key is dropped too (it
// would otherwise be handed over ahead of its predecessor).
std::vector<int64_t> finalize_claim(const std::vector<CheckedRow>& rows_in_plan_order);

}  // namespace relaybus::core
