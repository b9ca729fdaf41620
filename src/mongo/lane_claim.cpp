#include "mongo/lane_claim.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <unordered_map>

#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {

constexpr int kClasses = 4;

// What the window reads found.
struct Windows {
  std::vector<Delivery> rows;
  bool read_classes = false;                // the class windows were read
  std::array<bool, kClasses> class_full{};  // that class has more beyond its window
  bool truncated = false;                   // rows beyond those read may exist
};

// Priority across the whole backlog: while it fits in a window, one read of
// the oldest rows sees everything. Beyond, the head of each class may lie far
// behind the oldest rows, so each class's own window is read (plan_claim's
// class streams; a class's rows in the union are a prefix of that class in id
// order). Half a window per class keeps the four reads near one window's
// cost. Rows with a priority outside 0..3 are found (and dead-lettered) by the
// single window only.
Windows read_windows(Store& store, const std::string& handler, const ClaimAsk& ask, bool deep) {
  Windows w;
  if (!deep) {
    w.rows = store.fetch_window(handler, ask.lanes, ask.window);
    w.truncated = static_cast<int>(w.rows.size()) >= ask.window;
  }
  w.read_classes = deep || w.truncated;
  if (!w.read_classes) return w;
  const int class_window = std::max(64, ask.window / 2);
  std::set<int64_t> have;
  for (const auto& d : w.rows) have.insert(d.id);
  bool any_full = false;
  for (int c = 0; c < kClasses; c++) {
    auto part = store.fetch_class_window(handler, ask.lanes, c, class_window);
    w.class_full[c] = static_cast<int>(part.size()) >= class_window;
    any_full |= w.class_full[c];
    for (auto& d : part)
      if (have.insert(d.id).second) w.rows.push_back(std::move(d));
  }
  w.truncated = any_full;  // else the union holds every row of classes 0..3
  return w;
}

// The ids under which the rows are planned. The window is in _id order;
// within a key, seq order is the truth, so each key's rows get that key's ids
// re-dealt in seq order (on a server without transactions two publishers of
// one key may draw ids and seqs in different orders). Malformed rows are not
// planned.
std::vector<int64_t> plan_ids(const std::vector<Delivery>& rows) {
  std::vector<int64_t> plan_id(rows.size(), 0);
  std::map<std::string, std::vector<size_t>> by_key;
  for (size_t i = 0; i < rows.size(); i++) {
    if (!rows[i].malformed.empty()) continue;
    plan_id[i] = rows[i].id;
    if (rows[i].has_key) by_key[rows[i].key].push_back(i);
  }
  for (auto& [key, members] : by_key) {
    std::vector<int64_t> ids;
    for (size_t i : members) ids.push_back(rows[i].id);
    std::sort(ids.begin(), ids.end());
    std::sort(members.begin(), members.end(), [&](size_t a, size_t b) { return rows[a].seq < rows[b].seq; });
    for (size_t k = 0; k < members.size(); k++) plan_id[members[k]] = ids[k];
  }
  return plan_id;
}

// Whether a chosen keyed row may have an earlier seq of its key outside the
// rows read, when they were cut short. On MongoDB the windows are in _id
// order, which need not be seq order: always. On FerretDB the single window
// is the handler's first rows in these lanes in insertion order, which is
// each key's seq order (the sequencer inserts in id order, and a retry stays
// in place), so a key's earlier pending seq is never outside it; the fence
// read would be a scan of the whole collection there. (A replayed dead letter
// is inserted again at the end: it follows what of its key is pending.) Not so
// for the class windows: a key whose events have different priorities may
// have an earlier seq beyond another class's window (within its own class the
// earlier seqs come first, in the window). So on FerretDB a row is fenced only
// when a class other than its own came back full.
bool needs_fence(const Delivery& d, const Windows& w, bool ferretdb) {
  if (!d.has_key) return false;
  if (!ferretdb) return true;
  if (!w.read_classes) return false;
  for (int c = 0; c < kClasses; c++)
    if (c != d.priority && w.class_full[c]) return true;
  return false;
}

}  // namespace

int claim_window_rows(const Config& cfg) {
  return cfg.scan_window > 0 ? cfg.scan_window : std::max(64, 4 * cfg.batch_size);
}

LaneClaim LaneClaimer::claim(const std::string& handler, const ClaimAsk& ask) {
  if (ask.lanes.empty()) return {};
  if (!bound_read_) {  // before the first window: a key's older delivery is never missed
    store_.read_inserted_bound();
    bound_read_ = true;
  }
  Windows w = read_windows(store_, handler, ask, deep_.count(handler) > 0);
  if (w.truncated)
    deep_.insert(handler);
  else
    deep_.erase(handler);
  metrics_.fetches++;
  metrics_.last_store_ok_ms = wall_ms();
  std::vector<Delivery>& rows = w.rows;
  if (rows.empty()) return {};

  // Malformed documents: dead letters at once, with the reason (they would
  // never become deliverable). Their keys stay blocked until then.
  std::vector<Failure> bad;
  std::set<std::string> blocked;
  for (const auto& d : rows)
    if (!d.malformed.empty() && d.id != 0 && !ask.handed_out(d.id)) {
      bad.push_back({d.id, d.malformed, 0, true, 0, handler});
      if (d.has_key) blocked.insert(d.key);
      if (warned_malformed_.insert(d.id).second)
        log_warn("malformed delivery document", {{"id", d.id}, {"handler", handler}, {"error", d.malformed}});
    }
  if (!bad.empty()) {
    store_.fail(bad, ask.now_ms);
    metrics_.handlers[handler].dead += bad.size();
  }

  const std::vector<int64_t> plan_id = plan_ids(rows);
  std::unordered_map<int64_t, size_t> row_of;
  std::array<std::vector<core::ClaimRow>, kClasses> streams;
  for (size_t i = 0; i < rows.size(); i++) {
    const Delivery& d = rows[i];
    if (!d.malformed.empty()) continue;
    row_of[plan_id[i]] = i;
    const bool leased = ask.handed_out(d.id) || (d.has_key && blocked.count(d.key));
    streams[d.priority].push_back({plan_id[i], d.priority, d.has_key, d.key, d.not_before_ms, leased});
  }
  for (auto& s : streams)
    std::sort(s.begin(), s.end(), [](const core::ClaimRow& a, const core::ClaimRow& b) { return a.id < b.id; });
  const bool t = w.truncated;
  const core::ClaimPlan plan = core::plan_claim(streams, {t, t, t, t}, ask.limits, ask.now_ms, ask.aging_ms);

  // The fence, when the rows read were cut short: a chosen row is its key's
  // head only if no earlier seq of its key is pending outside them. One
  // question per key, at its first chosen seq (asked at each, a key's own
  // chosen rows would fence it); a key's later chosen rows follow it only
  // while their seqs are consecutive (a key's seqs are gapless, so a gap may
  // be a pending row outside the rows read; a completed one in between only
  // defers the rest to the next claim).
  std::vector<int64_t> chosen = plan.ids;
  std::map<std::string, int64_t> first_seq;
  std::vector<std::pair<std::string, int64_t>> ks;
  if (t) {
    const bool ferretdb = store_.is_ferretdb();
    for (int64_t pid : chosen) {
      const Delivery& d = rows[row_of[pid]];
      if (needs_fence(d, w, ferretdb) && first_seq.emplace(d.key, d.seq).second) ks.emplace_back(d.key, d.seq);
    }
  }
  if (!ks.empty()) {
    std::set<std::string> earlier;
    for (auto& k : store_.earlier_keys(handler, ks)) earlier.insert(std::move(k));
    std::map<std::string, int64_t> last_seq;
    std::vector<core::CheckedRow> checked;
    for (int64_t pid : chosen) {
      const Delivery& d = rows[row_of[pid]];
      bool valid = true;
      if (d.has_key && first_seq.count(d.key)) {
        auto [it, first] = last_seq.emplace(d.key, d.seq);
        valid = !earlier.count(d.key) && (first || d.seq == it->second + 1);
        it->second = d.seq;
      }
      checked.push_back({pid, d.has_key, d.key, true, valid});
    }
    chosen = core::finalize_claim(checked);
  }

  LaneClaim out;
  out.may_have_more = plan.may_have_more;
  out.deliveries.reserve(chosen.size());
  for (int64_t pid : chosen) out.deliveries.push_back(std::move(rows[row_of[pid]]));
  return out;
}

}  // namespace relaybus::mongo
