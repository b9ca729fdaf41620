#include "core/claim_scan.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace relaybus::core {

namespace {

constexpr int kClasses = 4;
// Keys per claim whose first rows a scan from the frontier reads; rows of
// further keys are left to the fence.
constexpr size_t kProbeKeys = 64;
// Every 16th claim of a handler looks for unkeyed rows behind hot keys' runs.
constexpr uint32_t kUnkeyedProbeEvery = 16;

int clamp_class(int p) { return std::clamp(p, 0, kClasses - 1); }

}  // namespace

ClaimScan::ClaimScan(const ClaimScanConfig& cfg, ClaimScanHint* hint) : cfg_(cfg), hint_(hint) {
  if (cfg_.limits.per_key < 1) cfg_.limits.per_key = 1;
  cap_ = cfg_.scan_limit / 4 + 1;
  at_floor_ = !cfg_.from_frontier;
  from_ = at_floor_ ? cfg_.floor : cfg_.frontier;
  start_pass();
}

void ClaimScan::start_pass() {
  hinted_ = at_floor_ ? &hint_->window : &hint_->window_front;
  window_ = *hinted_ > 0 ? std::min(*hinted_, cap_) : std::max(64, std::min(cfg_.limits.max * 4, cfg_.scan_limit / 4));
  if (cfg_.fixed_window > 0) window_ = cfg_.fixed_window;
  heads_added_ = more_keys_ = false;
  if (cfg_.oldest_first > 0 && !hint_->deep && !oldest_asked_) {
    oldest_asked_ = true;
    read_ = ScanRead{};
    read_.kind = ScanReadKind::Oldest;
    read_.window = cfg_.oldest_first;
    read_.at_floor = at_floor_;
    return;
  }
  ask_window();
}

void ClaimScan::ask_window() {
  read_ = ScanRead{};
  read_.kind = ScanReadKind::Window;
  read_.from = from_;
  read_.window = window_;
  read_.at_floor = at_floor_;
}

void ClaimScan::feed(std::vector<ScanRow> rows) {
  switch (read_.kind) {
    case ScanReadKind::Oldest:
      if (static_cast<int>(rows.size()) >= read_.window) {
        // Deeper than one read: the head of a higher class may lie far
        // behind these rows, so each class's own window is read.
        hint_->deep = true;
        oldest_ = std::move(rows);
        ask_window();
        return;
      }
      // Every row of every class is here.
      hint_->deep = false;
      rows_ = std::move(rows);
      nwindow_ = rows_.size();
      truncated_.fill(false);
      after_probe();
      return;
    case ScanReadKind::Window:
      feed_window(std::move(rows));
      return;
    case ScanReadKind::HeadsOfKeys:
      for (auto& r : rows) probed_.push_back(std::move(r));
      probed_any_ = true;
      after_probe();
      return;
    case ScanReadKind::KeyHeads: {
      heads_ = std::move(rows);
      size_t nkeys = 0;  // rows come key by key
      for (size_t i = 0; i < heads_.size(); i++)
        if (i == 0 || heads_[i].key != heads_[i - 1].key) nkeys++;
      more_keys_ = cfg_.key_walk_filtered || nkeys >= static_cast<size_t>(read_.max_keys);
      heads_added_ = true;
      rows_.insert(rows_.end(), heads_.begin(), heads_.end());
      plan();
      after_heads();
      return;
    }
    case ScanReadKind::EarlierKeys:
    case ScanReadKind::Done:
      return;
  }
}

void ClaimScan::feed_window(std::vector<ScanRow> rows) {
  rows_ = std::move(rows);
  nwindow_ = rows_.size();
  std::array<int, kClasses> per_class{};
  for (const auto& r : rows_)
    if (r.priority >= 0 && r.priority < kClasses) per_class[r.priority]++;
  for (int p = 0; p < kClasses; p++) truncated_[p] = per_class[p] >= window_;
  if (cfg_.oldest_first > 0) hint_->deep = std::find(truncated_.begin(), truncated_.end(), true) != truncated_.end();
  // A class's rows in the oldest read are a prefix of the class: merged,
  // the class is still a prefix.
  if (!oldest_.empty()) {
    std::unordered_set<int64_t> have;
    for (const auto& r : rows_) have.insert(r.id);
    for (const auto& r : oldest_)
      if (have.insert(r.id).second) rows_.push_back(r);
    nwindow_ = rows_.size();
    merged_oldest_ = true;
  }
  if (at_floor_) {
    result_.first.fill(-1);
    result_.highest.fill(-1);
    for (const auto& r : rows_) {
      const int p = clamp_class(r.priority);
      if (result_.first[p] < 0 || r.id < result_.first[p]) result_.first[p] = r.id;
      result_.highest[p] = std::max(result_.highest[p], r.id);
    }
  }
  // From the frontier: the keys that may be blocked below it, not read yet.
  std::vector<std::string> fresh;
  if (!at_floor_)
    for (const auto& r : rows_) {
      if (probed_keys_.size() >= kProbeKeys) break;
      if (!r.has_key || !r.key_below) continue;
      if (std::find(probed_keys_.begin(), probed_keys_.end(), r.key) != probed_keys_.end()) continue;
      probed_keys_.push_back(r.key);
      fresh.push_back(r.key);
    }
  if (!fresh.empty()) {
    read_ = ScanRead{};
    read_.kind = ScanReadKind::HeadsOfKeys;
    read_.per_key = cfg_.limits.per_key;
    read_.keys = std::move(fresh);
    return;
  }
  after_probe();
}

void ClaimScan::plan() {
  plan_ids_.assign(rows_.size(), 0);
  for (size_t i = 0; i < rows_.size(); i++) plan_ids_[i] = rows_[i].id;
  if (!cfg_.ids_follow_seq) {
    std::map<std::string, std::vector<size_t>> by_key;
    for (size_t i = 0; i < rows_.size(); i++)
      if (rows_[i].has_key) by_key[rows_[i].key].push_back(i);
    for (auto& [key, members] : by_key) {
      std::vector<int64_t> ids;
      for (size_t i : members) ids.push_back(rows_[i].id);
      std::sort(ids.begin(), ids.end());
      std::sort(members.begin(), members.end(), [&](size_t a, size_t b) { return rows_[a].seq < rows_[b].seq; });
      for (size_t k = 0; k < members.size(); k++) plan_ids_[members[k]] = ids[k];
    }
  }
  std::array<std::vector<ClaimRow>, kClasses> streams;
  for (size_t i = 0; i < rows_.size(); i++) {
    const ScanRow& r = rows_[i];
    ClaimRow c;
    c.id = plan_ids_[i];
    c.priority = clamp_class(r.priority);
    c.has_key = r.has_key;
    if (r.has_key) c.key = r.key;
    c.ready_at_ms = r.ready_at_ms;
    c.leased = r.leased;
    streams[c.priority].push_back(std::move(c));
  }
  // A window is in id order per class; rows added to it are not.
  if (rows_.size() > nwindow_ || merged_oldest_ || !cfg_.ids_follow_seq)
    for (auto& s : streams)
      std::sort(s.begin(), s.end(), [](const ClaimRow& a, const ClaimRow& b) { return a.id < b.id; });
  plan_ = plan_claim(streams, truncated_, cfg_.limits, cfg_.now_ms, cfg_.aging_ms);
  if (plan_.ids.size() > static_cast<size_t>(std::max(cfg_.limits.max, 0)))
    plan_.ids.resize(static_cast<size_t>(std::max(cfg_.limits.max, 0)));
}

void ClaimScan::after_probe() {
  if (probed_any_) rows_.insert(rows_.end(), probed_.begin(), probed_.end());
  if (heads_added_) rows_.insert(rows_.end(), heads_.begin(), heads_.end());
  result_.next_ready_ms = 0;
  for (const auto& r : rows_)
    if (r.ready_at_ms >= cfg_.now_ms && !r.leased &&
        (result_.next_ready_ms == 0 || r.ready_at_ms < result_.next_ready_ms))
      result_.next_ready_ms = r.ready_at_ms;
  plan();
  rows_needed_ = plan_.rows_needed;
  exhausted_ = !plan_.may_have_more;
  const int max = cfg_.limits.max;
  if (static_cast<int>(plan_.ids.size()) >= max || !plan_.may_have_more) {
    end_pass();
    return;
  }
  // Hot keys: behind a key's first per_key rows its run is of no use to this
  // claim, and a wider window would mostly read more of it.
  if (cfg_.key_walk && !heads_added_ && plan_.distinct_keys > 0 && plan_.keyed_rows >= 4 * plan_.distinct_keys) {
    read_ = ScanRead{};
    read_.kind = ScanReadKind::KeyHeads;
    read_.max_keys = std::max(64, 2 * max);
    read_.per_key = cfg_.limits.per_key;
    return;
  }
  after_heads();
}

void ClaimScan::after_heads() {
  const int max = cfg_.limits.max;
  // Every key's head has been seen: only unkeyed rows or keys past the walk's
  // limit can still be found further on.
  if (heads_added_ && (static_cast<int>(plan_.ids.size()) >= max ||
                       (plan_.unkeyed_rows == 0 && !more_keys_ && hint_->claims % kUnkeyedProbeEvery != 0))) {
    end_pass();
    return;
  }
  if (cfg_.fixed_window > 0 || window_ * 4 >= cfg_.scan_limit) {
    end_pass();
    return;
  }
  window_ = std::min(window_ * (*hinted_ > 0 ? 2 : 4), cap_);
  ask_window();
}

void ClaimScan::end_pass() {
  const int max = cfg_.limits.max;
  // With hot keys the heads do the finding; the window only has to cover
  // unkeyed and old rows: start the next one at max.
  if (heads_added_) rows_needed_ = std::min<int64_t>(rows_needed_, max);
  // Grow at once, shrink slowly: a concurrent claimer's leases come and go,
  // and a window that shrank below them would cost a second scan.
  const int target = static_cast<int>(std::min<int64_t>(rows_needed_ + rows_needed_ / 8 + 8, cap_));
  *hinted_ = std::max(target, *hinted_ - *hinted_ / 16);
  // Nothing more ahead of the frontier: look behind it too. (Short because
  // the rows ahead are held by concurrent claimers: not.)
  if (at_floor_ || static_cast<int>(plan_.ids.size()) >= max || !exhausted_) {
    conclude();
    return;
  }
  at_floor_ = true;
  from_ = cfg_.floor;
  start_pass();
}

const ScanRow* ClaimScan::row_of_plan_id(int64_t plan_id) {
  if (row_of_.empty())
    for (size_t i = 0; i < rows_.size(); i++) row_of_.emplace(plan_ids_[i], i);
  auto it = row_of_.find(plan_id);
  return it == row_of_.end() ? nullptr : &rows_[it->second];
}

void ClaimScan::conclude() {
  chosen_ = plan_.ids;
  const bool cut = std::find(truncated_.begin(), truncated_.end(), true) != truncated_.end();
  if (cfg_.fence_in_fetch || !cut || chosen_.empty()) {
    finish();
    return;
  }
  // Asked at every chosen row, a key's own first chosen row would fence its
  // second: once per key, at its first chosen seq.
  read_ = ScanRead{};
  read_.kind = ScanReadKind::EarlierKeys;
  std::set<std::string> asked;
  for (int64_t pid : chosen_) {
    const ScanRow* r = row_of_plan_id(pid);
    if (r == nullptr || !r->has_key) continue;
    bool hidden = !cfg_.class_window_in_seq_order;
    for (int c = 0; c < kClasses && !hidden; c++) hidden = c != clamp_class(r->priority) && truncated_[c];
    if (hidden && asked.insert(r->key).second) {
      read_.keys.push_back(r->key);
      read_.seqs.push_back(r->seq);
    }
  }
  if (read_.keys.empty()) finish();
}

void ClaimScan::feed_keys(const std::vector<std::string>& earlier_keys) {
  if (read_.kind != ScanReadKind::EarlierKeys) return;
  const std::set<std::string> fenced(read_.keys.begin(), read_.keys.end());
  const std::set<std::string> earlier(earlier_keys.begin(), earlier_keys.end());
  // A key's seqs are gapless: a later chosen row follows only at the next
  // seq (a gap may be a pending row outside the rows read).
  std::map<std::string, int64_t> last_seq;
  std::vector<CheckedRow> checked;
  for (int64_t pid : chosen_) {
    const ScanRow* r = row_of_plan_id(pid);
    bool valid = true;
    if (r != nullptr && r->has_key && fenced.count(r->key)) {
      auto [it, first] = last_seq.emplace(r->key, r->seq);
      valid = !earlier.count(r->key) && (first || r->seq == it->second + 1);
      it->second = r->seq;
    }
    checked.push_back(CheckedRow{pid, r != nullptr && r->has_key, r != nullptr ? r->key : std::string(), true, valid});
  }
  chosen_ = finalize_claim(checked);
  finish();
}

void ClaimScan::finish() {
  read_ = ScanRead{};
  hint_->claims++;
  result_.may_have_more = plan_.may_have_more;
  result_.chosen.clear();
  for (int64_t pid : chosen_) {
    const ScanRow* r = cfg_.ids_follow_seq ? nullptr : row_of_plan_id(pid);
    result_.chosen.push_back(r != nullptr ? r->id : pid);
  }
  result_.heads_added = heads_added_;
  result_.at_floor = at_floor_;
  result_.from = from_;
  for (const auto& r : rows_)
    if (r.expired) result_.expired.push_back(r.id);

  // Where the frontier may move: per class, every window row below the first
  // one that was free and not chosen was taken by this claim or held by
  // another; past the window's last row nothing was seen. Rows added to the
  // window may lie below the frontier: only the window says what is ahead.
  std::unordered_set<int64_t> chosen(result_.chosen.begin(), result_.chosen.end());
  std::array<int64_t, kClasses> first_free, last;
  first_free.fill(INT64_MAX);
  last.fill(-1);
  struct Keyed {
    const std::string* key;
    int64_t id;
    int priority;
    bool passed;
  };
  std::vector<Keyed> keyed;
  for (size_t i = 0; i < nwindow_; i++) {
    const ScanRow& r = rows_[i];
    const int p = clamp_class(r.priority);
    last[p] = std::max(last[p], r.id);
    // Chosen and lost to a concurrent claimer counts as held.
    const bool passed = (r.leased && !r.expired) || chosen.count(r.id) > 0;
    if (!passed) first_free[p] = std::min(first_free[p], r.id);
    if (r.has_key) keyed.push_back(Keyed{&r.key, r.id, p, passed});
  }
  for (int p = 0; p < kClasses; p++) result_.upto[p] = last[p] < 0 ? from_[p] : std::min(first_free[p], last[p] + 1);
  // A passed keyed row with a later row of its key that is not passed: once
  // the frontier is past it, that later row must not look like a head.
  std::sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) {
    if (*a.key != *b.key) return *a.key < *b.key;
    return a.id < b.id;
  });
  for (size_t g = 0; g < keyed.size();) {
    size_t end = g;
    int64_t last_free = -1;
    while (end < keyed.size() && *keyed[end].key == *keyed[g].key) {
      if (!keyed[end].passed) last_free = keyed[end].id;
      end++;
    }
    if (last_free >= 0)
      for (size_t i = g; i < end && keyed[i].id < last_free; i++)
        if (keyed[i].passed) result_.passed.push_back(PassedRow{keyed[i].id, keyed[i].priority, *keyed[i].key});
    g = end;
  }
  std::sort(result_.passed.begin(), result_.passed.end(),
            [](const PassedRow& a, const PassedRow& b) { return a.id < b.id; });
}

HandOver hand_over(const std::vector<int64_t>& chosen, const std::vector<bool>& got,
                   const std::vector<FetchedRow>& fetched) {
  std::unordered_map<int64_t, size_t> row_of;
  for (size_t r = 0; r < fetched.size(); r++) row_of[fetched[r].id] = r;
  // Keys of rows that could not be leased are known only from the plan; a
  // lost lease invalidates its key for the rest of this claim.
  std::vector<CheckedRow> checked;
  checked.reserve(chosen.size());
  for (size_t i = 0; i < chosen.size(); i++) {
    auto it = row_of.find(chosen[i]);
    CheckedRow c;
    c.id = chosen[i];
    c.present = it != row_of.end();
    c.has_key = c.present && fetched[it->second].has_key;
    if (c.has_key) c.key = fetched[it->second].key;
    c.valid = c.present && i < got.size() && got[i] && fetched[it->second].valid;
    checked.push_back(std::move(c));
  }
  const std::vector<int64_t> final_ids = finalize_claim(checked);
  std::unordered_map<std::string, size_t> key_rank;
  struct Out {
    size_t rank;
    int64_t seq;
    size_t row;
  };
  std::vector<Out> outs;
  outs.reserve(final_ids.size());
  for (size_t i = 0; i < final_ids.size(); i++) {
    const size_t r = row_of.at(final_ids[i]);
    size_t rank = i;
    if (fetched[r].has_key) rank = key_rank.emplace(fetched[r].key, i).first->second;
    outs.push_back(Out{rank, fetched[r].seq, r});
  }
  std::stable_sort(outs.begin(), outs.end(), [](const Out& a, const Out& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.seq < b.seq;
  });
  HandOver h;
  std::unordered_set<int64_t> kept(final_ids.begin(), final_ids.end());
  for (const Out& o : outs) h.rows.push_back(o.row);
  for (size_t i = 0; i < chosen.size(); i++)
    if (i < got.size() && got[i] && !kept.count(chosen[i])) {
      h.give_back.push_back(i);
      auto it = row_of.find(chosen[i]);
      h.give_back_row.push_back(it == row_of.end() ? -1 : static_cast<long>(it->second));
    }
  return h;
}

}  // namespace relaybus::core
