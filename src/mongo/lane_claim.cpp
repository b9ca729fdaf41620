#include "mongo/lane_claim.hpp"

#include <algorithm>
#include <unordered_map>

#include "core/claim_scan.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

int claim_window_rows(const Config& cfg) {
  return cfg.scan_window > 0 ? cfg.scan_window : std::max(64, 4 * cfg.batch_size);
}

LaneClaim LaneClaimer::claim(const std::string& handler, const ClaimAsk& ask) {
  if (ask.lanes.empty()) return {};
  if (!bound_read_) {  // before the first window: a key's older delivery is never missed
    store_.read_inserted_bound();
    bound_read_ = true;
  }
  // The policy is the core's (core/claim_scan.hpp); this store's reads and
  // orders are its capabilities. A class window is half a window (four of
  // them cost about one read of the oldest rows).
  core::ClaimScanConfig cfg;
  cfg.limits = ask.limits;
  cfg.now_ms = ask.now_ms;
  cfg.aging_ms = ask.aging_ms;
  cfg.oldest_first = ask.window;
  cfg.fixed_window = std::max(64, ask.window / 2);
  cfg.key_walk = false;
  cfg.fence_in_fetch = false;
  cfg.class_window_in_seq_order = store_.is_ferretdb();
  cfg.ids_follow_seq = false;
  core::ClaimScan scan(cfg, &hints_[handler]);

  std::unordered_map<int64_t, Delivery> read;  // every document read, by id
  std::vector<Failure> bad;
  auto to_rows = [&](std::vector<Delivery> docs) {
    std::vector<core::ScanRow> rows;
    rows.reserve(docs.size());
    for (auto& d : docs) {
      // A malformed document goes to the dead letters (it would never become
      // deliverable); until then it blocks its key like a held row.
      const bool malformed = !d.malformed.empty();
      if (malformed && d.id != 0 && !ask.handed_out(d.id) && !read.count(d.id)) {
        bad.push_back({d.id, d.malformed, 0, true, 0, handler});
        if (warned_malformed_.insert(d.id).second)
          log_warn("malformed delivery document", {{"id", d.id}, {"handler", handler}, {"error", d.malformed}});
      }
      if (malformed && !d.has_key) continue;
      core::ScanRow r;
      r.id = d.id;
      r.priority = d.priority;
      r.has_key = d.has_key;
      r.key = d.key;
      r.ready_at_ms = d.not_before_ms;
      r.seq = d.seq;
      r.leased = malformed || ask.handed_out(d.id);
      rows.push_back(std::move(r));
      read.emplace(d.id, std::move(d));
    }
    return rows;
  };
  for (;;) {
    const core::ScanRead& rd = scan.next();
    if (rd.kind == core::ScanReadKind::Done) break;
    switch (rd.kind) {
      case core::ScanReadKind::Oldest:
        scan.feed(to_rows(store_.fetch_window(handler, ask.lanes, rd.window)));
        break;
      case core::ScanReadKind::Window: {
        std::vector<Delivery> docs;
        for (int c = 0; c < 4; c++)
          for (auto& d : store_.fetch_class_window(handler, ask.lanes, c, rd.window)) docs.push_back(std::move(d));
        scan.feed(to_rows(std::move(docs)));
        break;
      }
      case core::ScanReadKind::EarlierKeys: {
        std::vector<std::pair<std::string, int64_t>> ks;
        for (size_t i = 0; i < rd.keys.size(); i++) ks.emplace_back(rd.keys[i], rd.seqs[i]);
        scan.feed_keys(store_.earlier_keys(handler, ks));
        break;
      }
      default:  // no key walk, no frontier (cfg above)
        scan.feed({});
        break;
    }
  }
  metrics_.fetches++;
  metrics_.last_store_ok_ms = wall_ms();
  if (!bad.empty()) {
    store_.fail(bad, ask.now_ms);
    metrics_.handlers[handler].dead += bad.size();
  }

  const core::ClaimScanResult& res = scan.result();
  LaneClaim out;
  out.may_have_more = res.may_have_more;
  out.deliveries.reserve(res.chosen.size());
  for (int64_t id : res.chosen) out.deliveries.push_back(std::move(read.at(id)));
  return out;
}

}  // namespace relaybus::mongo
