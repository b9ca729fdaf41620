#include "pg/cpp/claim_scan_store.h"

#include <string>
#include <utility>
#include <vector>

#include "core/claim_scan.hpp"
#include "pg/cpp/invoke.hpp"

namespace relaybus::pg {

struct ScanImpl {
  core::ClaimScanHint hint;
  core::ClaimScan scan;
  std::vector<const char*> keys;
  std::vector<ScanPassedData> passed;

  ScanImpl(const core::ClaimScanConfig& cfg, const core::ClaimScanHint& h) : hint(h), scan(cfg, &hint) {}
};

bool scan_impl_new(const ScanConfigData* c, const ScanHintData* h, ScanImpl** out, ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    core::ClaimScanConfig cfg;
    cfg.limits.max = c->max;
    cfg.limits.per_key = c->per_key;
    cfg.now_ms = c->now_ms;
    cfg.aging_ms = c->aging_ms;
    cfg.scan_limit = c->scan_limit;
    cfg.from_frontier = c->from_frontier;
    for (int p = 0; p < 4; p++) {
      cfg.frontier[p] = c->frontier[p];
      cfg.floor[p] = c->floor[p];
    }
    cfg.key_walk_filtered = c->key_walk_filtered;
    *out = new ScanImpl(cfg, core::ClaimScanHint{h->window, h->window_front, h->claims});
  });
}

void scan_impl_delete(ScanImpl* impl) noexcept { delete impl; }

bool scan_impl_next(ScanImpl* impl, ScanStepData* out, ErrorRecord* err) noexcept {
  *out = ScanStepData{};
  return invoke_cpp(err, [&] {
    const core::ScanRead& rd = impl->scan.next();
    switch (rd.kind) {
      case core::ScanReadKind::Window:
        out->kind = ScanStep::Window;
        break;
      case core::ScanReadKind::KeyHeads:
        out->kind = ScanStep::KeyHeads;
        break;
      case core::ScanReadKind::HeadsOfKeys:
        out->kind = ScanStep::HeadsOfKeys;
        break;
      case core::ScanReadKind::Done:
        out->kind = ScanStep::Done;
        break;
      case core::ScanReadKind::Oldest:
      case core::ScanReadKind::EarlierKeys:
        // Reads of capabilities this store does not state (claim.cpp's config).
        throw SqlError(sqlstates::kInternalError, "a read this store does not offer");
    }
    for (int p = 0; p < 4; p++) out->from[p] = rd.from[p];
    out->window = rd.window;
    out->at_floor = rd.at_floor;
    out->max_keys = rd.max_keys;
    out->per_key = rd.per_key;
    impl->keys.clear();
    for (const auto& k : rd.keys) impl->keys.push_back(k.c_str());
    out->nkeys = static_cast<int>(impl->keys.size());
    out->keys = impl->keys.data();
  });
}

bool scan_impl_feed(ScanImpl* impl, const ScanRowsData* rows, ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    std::vector<core::ScanRow> got(static_cast<size_t>(rows->n));
    for (int i = 0; i < rows->n; i++) {
      core::ScanRow& r = got[static_cast<size_t>(i)];
      r.id = rows->ids[i];
      r.priority = rows->priority[i];
      r.has_key = rows->keys[i] != nullptr;
      if (r.has_key) r.key = rows->keys[i];
      r.ready_at_ms = rows->ready_at_ms[i];
      r.leased = rows->leased[i];
      r.expired = rows->expired[i];
      r.key_below = rows->key_below != nullptr && rows->key_below[i];
    }
    impl->scan.feed(std::move(got));
  });
}

bool scan_impl_outcome(ScanImpl* impl, ScanOutcomeData* out, ScanHintData* hint, ErrorRecord* err) noexcept {
  *out = ScanOutcomeData{};
  return invoke_cpp(err, [&] {
    const core::ClaimScanResult& r = impl->scan.result();
    out->nchosen = static_cast<int>(r.chosen.size());
    out->chosen = r.chosen.data();
    out->heads_added = r.heads_added;
    out->at_floor = r.at_floor;
    for (int p = 0; p < 4; p++) {
      out->from[p] = r.from[p];
      out->first[p] = r.first[p];
      out->highest[p] = r.highest[p];
      out->upto[p] = r.upto[p];
    }
    out->next_ready_ms = r.next_ready_ms;
    out->nexpired = static_cast<int>(r.expired.size());
    out->expired = r.expired.data();
    impl->passed.clear();
    for (const auto& p : r.passed) impl->passed.push_back(ScanPassedData{p.id, p.priority, p.key.c_str()});
    out->npassed = static_cast<int>(impl->passed.size());
    out->passed = impl->passed.data();
    *hint = ScanHintData{impl->hint.window, impl->hint.window_front, impl->hint.claims};
  });
}

bool scan_impl_hand_over(const int64_t* chosen, const bool* got, int nchosen, const FetchedData* fetched, int* order,
                         int* give_back, int* give_back_row, int* ngive, int* count, ErrorRecord* err) noexcept {
  *count = 0;
  *ngive = 0;
  return invoke_cpp(err, [&] {
    std::vector<int64_t> ids(chosen, chosen + nchosen);
    std::vector<bool> leased(got, got + nchosen);
    std::vector<core::FetchedRow> rows;
    rows.reserve(static_cast<size_t>(fetched->n));
    for (int r = 0; r < fetched->n; r++) {
      core::FetchedRow f;
      f.id = fetched->ids[r];
      f.has_key = fetched->keys[r] != nullptr;
      if (f.has_key) f.key = fetched->keys[r];
      f.seq = fetched->seqs[r];
      f.valid = fetched->valid[r];
      rows.push_back(std::move(f));
    }
    const core::HandOver h = core::hand_over(ids, leased, rows);
    for (size_t r : h.rows)
      if (*count < nchosen) order[(*count)++] = static_cast<int>(r);
    for (size_t i = 0; i < h.give_back.size() && *ngive < nchosen; i++) {
      give_back[*ngive] = static_cast<int>(h.give_back[i]);
      give_back_row[(*ngive)++] = static_cast<int>(h.give_back_row[i]);
    }
  });
}

}  // namespace relaybus::pg
