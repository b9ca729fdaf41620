#include "claim_planner.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace relaybus::core {

namespace {

constexpr size_t kClasses = 4;
constexpr int kTopClass = static_cast<int>(kClasses) - 1;

int clamp_priority(int p) { return p < 0 ? 0 : (p > kTopClass ? kTopClass : p); }

int effective_priority(const ClaimRow& r, int64_t now_ms, int64_t aging_ms) {
  const int base = clamp_priority(r.priority);
  if (aging_ms <= 0 || r.ready_at_ms >= now_ms) return base;
  // now - ready_at can exceed INT64_MAX for extreme inputs: saturate.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t age = (r.ready_at_ms < 0 && now_ms > kMax + r.ready_at_ms) ? kMax : now_ms - r.ready_at_ms;
  const int64_t bonus = age / aging_ms;
  return bonus >= kTopClass - base ? kTopClass : base + static_cast<int>(bonus);
}

struct KeyState {
  std::set<int64_t> pending;  // ids of this key not yet taken (popped)
  // Rows that reached their stream's head before the key's lower ids were
  // taken; they wait here instead of holding up the rest of their stream.
  std::unordered_map<int64_t, const ClaimRow*> deferred;
  bool blocked = false;
  int chosen = 0;
  int group = -1;  // index into the hand-over groups once a row is chosen
};

// Candidate order: higher effective priority, then older ready_at, then lower id.
bool goes_before(const ClaimRow& a, int a_eff, const ClaimRow& b, int b_eff) {
  if (a_eff != b_eff) return a_eff > b_eff;
  if (a.ready_at_ms != b.ready_at_ms) return a.ready_at_ms < b.ready_at_ms;
  return a.id < b.id;
}

}  // namespace

ClaimPlan plan_claim(const std::array<std::vector<ClaimRow>, 4>& streams, const std::array<bool, 4>& truncated,
                     const ClaimLimits& lim, int64_t now_ms, int64_t aging_ms) {
  ClaimPlan plan;
  const int max = lim.max;
  const int per_key = lim.per_key < 1 ? 1 : lim.per_key;
  if (max < 1) return plan;

  // Every keyed id per key, to know each key's head (lowest id not yet
  // taken), and which entries repeat an id seen before (skipped).
  std::unordered_map<std::string, KeyState> keys;
  std::unordered_set<int64_t> seen;
  std::array<std::vector<char>, kClasses> duplicate;
  // Where each keyed row sits, to take a key's run early (see below).
  struct Place {
    const ClaimRow* row;
    size_t stream;
    size_t index;
  };
  std::unordered_map<int64_t, Place> place_of;
  for (size_t c = 0; c < kClasses; ++c) {
    duplicate[c].assign(streams[c].size(), 0);
    for (size_t i = 0; i < streams[c].size(); ++i) {
      const ClaimRow& r = streams[c][i];
      if (!seen.insert(r.id).second) {
        duplicate[c][i] = 1;
        continue;
      }
      if (r.has_key) {
        place_of.emplace(r.id, Place{&r, c, i});
        keys[r.key].pending.insert(r.id);
        ++plan.keyed_rows;
      } else {
        ++plan.unkeyed_rows;
      }
    }
  }
  plan.distinct_keys = static_cast<int64_t>(keys.size());

  std::array<size_t, kClasses> pos{};
  std::array<size_t, kClasses> depth{};  // rows of each stream read, early takes included
  std::unordered_set<int64_t> taken_early;
  std::vector<const ClaimRow*> released;  // deferred rows that are now their key's head
  std::vector<std::vector<int64_t>> groups;
  int chosen = 0;

  // Takes r off the input; if that makes a deferred row its key's head, that
  // row becomes a candidate.
  const auto take = [&](const ClaimRow& r) -> KeyState* {
    if (!r.has_key) return nullptr;
    KeyState& k = keys[r.key];
    k.pending.erase(r.id);
    if (!k.pending.empty()) {
      auto it = k.deferred.find(*k.pending.begin());
      if (it != k.deferred.end()) {
        released.push_back(it->second);
        k.deferred.erase(it);
      }
    }
    return &k;
  };

  while (chosen < max) {
    const ClaimRow* best = nullptr;
    int best_eff = -1;
    size_t best_stream = kClasses;  // kClasses: best comes from `released`
    size_t best_released = 0;
    for (size_t c = 0; c < kClasses; ++c) {
      // Advance past duplicates and past keyed rows whose key has a lower id
      // still to come (priority never reorders a key); those are deferred.
      while (pos[c] < streams[c].size()) {
        const ClaimRow& r = streams[c][pos[c]];
        if (duplicate[c][pos[c]] || taken_early.count(r.id)) {
          ++pos[c];
          continue;
        }
        if (r.has_key) {
          KeyState& k = keys[r.key];
          if (*k.pending.begin() != r.id) {
            k.deferred.emplace(r.id, &r);
            ++pos[c];
            continue;
          }
        }
        break;
      }
      if (pos[c] >= streams[c].size()) continue;
      const ClaimRow& r = streams[c][pos[c]];
      const int eff = effective_priority(r, now_ms, aging_ms);
      if (!best || goes_before(r, eff, *best, best_eff)) {
        best = &r;
        best_eff = eff;
        best_stream = c;
      }
    }
    for (size_t i = 0; i < released.size();) {
      if (taken_early.count(released[i]->id)) {  // already taken with its key's run
        released[i] = released.back();
        released.pop_back();
        continue;
      }
      const int eff = effective_priority(*released[i], now_ms, aging_ms);
      if (!best || goes_before(*released[i], eff, *best, best_eff)) {
        best = released[i];
        best_eff = eff;
        best_stream = kClasses;
        best_released = i;
      }
      ++i;
    }
    if (!best) break;  // input exhausted
    const ClaimRow& r = *best;
    if (best_stream < kClasses) {
      ++pos[best_stream];
    } else {
      released[best_released] = released.back();
      released.pop_back();
    }

    KeyState* k = take(r);
    const bool ready = r.ready_at_ms <= now_ms;
    if (!k) {
      if (ready && !r.leased) {
        groups.push_back({r.id});
        ++chosen;
      }
      continue;
    }
    if (!ready || r.leased) {
      k->blocked = true;  // everything after this row must wait for it
      continue;
    }
    if (k->blocked || k->chosen >= per_key) continue;
    if (k->group < 0) {
      k->group = static_cast<int>(groups.size());
      groups.emplace_back();
    }
    groups[static_cast<size_t>(k->group)].push_back(r.id);
    ++k->chosen;
    ++chosen;
    // Take the rest of the key's run now (up to per_key), while its rows are
    // ready, unleased and rank no lower than this one: a claim then holds few
    // keys with long runs rather than a few rows of every key, so concurrent
    // claimers find other keys free instead of every head leased.
    while (chosen < max && k->chosen < per_key && !k->pending.empty()) {
      const Place& next = place_of.at(*k->pending.begin());
      const ClaimRow& n = *next.row;
      if (n.ready_at_ms > now_ms || n.leased || effective_priority(n, now_ms, aging_ms) < best_eff)
        break;  // left to the merge, which blocks the key or takes it in turn
      taken_early.insert(n.id);
      depth[next.stream] = std::max(depth[next.stream], next.index + 1);
      take(n);
      groups[static_cast<size_t>(k->group)].push_back(n.id);
      ++k->chosen;
      ++chosen;
    }
  }

  for (size_t c = 0; c < kClasses; ++c) {
    // Not filled: every row was looked at (deferred rows never released
    // included); filled: only the prefix up to pos[c].
    const size_t d = chosen < max ? streams[c].size() : std::max(pos[c], depth[c]);
    plan.rows_needed = std::max(plan.rows_needed, static_cast<int64_t>(d));
  }
  for (auto& g : groups) {
    std::sort(g.begin(), g.end());  // already ascending; kept as a guarantee
    plan.ids.insert(plan.ids.end(), g.begin(), g.end());
  }
  bool any_truncated = false;
  for (bool t : truncated) any_truncated = any_truncated || t;
  plan.may_have_more = chosen < max && any_truncated;
  return plan;
}

std::vector<int64_t> finalize_claim(const std::vector<CheckedRow>& rows) {
  std::vector<int64_t> out;
  std::unordered_set<std::string> broken;  // keys with an invalid row so far
  for (const CheckedRow& r : rows) {
    if (!r.present) continue;
    if (r.has_key) {
      if (broken.count(r.key)) continue;
      if (!r.valid) {
        broken.insert(r.key);
        continue;
      }
    } else if (!r.valid) {
      continue;
    }
    out.push_back(r.id);
  }
  return out;
}

}  // namespace relaybus::core
