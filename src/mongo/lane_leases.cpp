#include "mongo/lane_leases.hpp"

#include <algorithm>
#include <set>

#include "core/lane_hash.hpp"
#include "core/store_policy.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

int64_t LaneLeases::interval_ms() const { return core::lease_renew_interval_ms(cfg_.lease_ms); }

bool LaneLeases::usable(const Held& h, int64_t now) const { return core::lease_usable(h.until_ms, cfg_.lease_ms, now); }

bool LaneLeases::renewed(const Held& h, int64_t acked) const {
  return core::renewal_keeps_tenure(h.until_ms, cfg_.lease_ms, acked);
}

void LaneLeases::log_late(const std::vector<int>& leases) const {
  if (leases.empty()) return;
  log_warn("lease renewed too late: it ran out before the renewal was acknowledged, so it is lost",
           {{"lanes", leases}, {"lease_ms", cfg_.lease_ms}});
}

void LaneLeases::end_sequencer() {
  seq_held_ = false;
  sequencer_.end();
}

bool LaneLeases::tick(int64_t now, int live, const std::function<std::map<int, int>()>& busy_lanes, bool stopping) {
  const int share = (core::kLanes + live - 1) / live;
  std::map<int, LaneDoc> top;  // highest epoch per lane
  for (auto& l : store_.read_lanes()) {
    auto it = top.find(l.lane);
    if (it == top.end() || l.epoch > it->second.epoch) top[l.lane] = l;
  }
  settle_window();  // what the renewals during those reads found
  // Lanes someone else moved past our epoch are lost already.
  for (auto it = held_.begin(); it != held_.end();) {
    auto t = top.find(it->first);
    if (t != top.end() && t->second.epoch > it->second.epoch) {
      log_warn("lane lease lost", {{"lane", it->first},
                                   {"epoch", it->second.epoch},
                                   {"now_epoch", t->second.epoch},
                                   {"owner", t->second.owner}});
      metrics_.lanes_lost++;
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  // The sequencer role: one more lease in this tick's insert, outside the lane share.
  auto seq_top = top.find(kSequencerLane);
  if (seq_held_ && seq_top != top.end() && seq_top->second.epoch > seq_.epoch) {
    log_warn("sequencer role lost",
             {{"epoch", seq_.epoch}, {"now_epoch", seq_top->second.epoch}, {"owner", seq_top->second.owner}});
    end_sequencer();
  }
  // Above the fair share: drain the extra lanes (no new fetches), give them
  // back once nothing of theirs is in flight or awaiting completion.
  std::map<int, int> busy = busy_lanes();
  int active = 0;
  for (const auto& [lane, h] : held_) active += h.draining ? 0 : 1;
  for (auto it = held_.rbegin(); it != held_.rend() && active > share; ++it)
    if (!it->second.draining) {
      it->second.draining = true;
      active--;
    }

  struct Op {
    int lane;
    enum { Renew, Release, Take } what;
  };
  std::vector<LaneDoc> inserts;
  std::vector<Op> ops;
  // Counted from now, after the reads above (a slow store makes them take
  // seconds): the insert is sent after this instant, so no other instance can
  // see the lease run out earlier than this instance does.
  const int64_t until = wall_ms() + cfg_.lease_ms;
  for (const auto& [lane, h] : held_) {
    bool release = stopping ? busy[lane] == 0 : (h.draining && busy[lane] == 0);
    inserts.push_back({lane, h.epoch + 1, release ? std::string() : cfg_.instance, release ? 0 : until});
    ops.push_back({lane, release ? Op::Release : Op::Renew});
  }
  auto is_free = [&](std::map<int, LaneDoc>::const_iterator t) {
    return t == top.end() || t->second.owner.empty() || t->second.until_ms < now || t->second.owner == cfg_.instance;
  };
  if (!stopping) {
    std::vector<int> free;
    for (int lane = 0; lane < core::kLanes; lane++)
      if (!held_.count(lane) && is_free(top.find(lane))) free.push_back(lane);
    // Start at a random free lane so that instances starting together spread out.
    if (!free.empty()) std::rotate(free.begin(), free.begin() + rng_() % free.size(), free.end());
    for (int lane : free) {
      if (active >= share) break;
      auto t = top.find(lane);
      inserts.push_back({lane, t == top.end() ? 1 : t->second.epoch + 1, cfg_.instance, until});
      ops.push_back({lane, Op::Take});
      active++;
    }
  }
  if (seq_held_) {
    inserts.push_back({kSequencerLane, seq_.epoch + 1, stopping ? std::string() : cfg_.instance, stopping ? 0 : until});
    ops.push_back({kSequencerLane, stopping ? Op::Release : Op::Renew});
  } else if (!stopping && is_free(seq_top)) {
    inserts.push_back({kSequencerLane, seq_top == top.end() ? 1 : seq_top->second.epoch + 1, cfg_.instance, until});
    ops.push_back({kSequencerLane, Op::Take});
  }
  auto ok = store_.insert_lanes(inserts);
  const int64_t acked = wall_ms();
  renewed_at_ms_ = until - cfg_.lease_ms;
  bool sequencer_taken = false;
  std::vector<std::pair<int, int64_t>> old;
  std::vector<int> taken, released, lost, late;
  for (size_t i = 0; i < ops.size(); i++) {
    const int lane = ops[i].lane;
    const int64_t epoch = inserts[i].epoch;
    if (lane == kSequencerLane) {
      if (ops[i].what == Op::Take && ok[i]) {
        seq_ = Held{epoch, until, false, epoch};
        seq_held_ = true;
        sequencer_.begin(epoch);
        sequencer_taken = true;
        log_info("sequencer role taken", {{"epoch", epoch}});
      } else if (ops[i].what == Op::Renew && ok[i] && renewed(seq_, acked)) {
        seq_.epoch = epoch;
        seq_.until_ms = until;
      } else if (ops[i].what != Op::Take) {
        if (!ok[i]) log_warn("sequencer role lost", {{"epoch", seq_.epoch}});
        if (ok[i] && ops[i].what == Op::Renew) late.push_back(lane);
        end_sequencer();
      }
    } else {
      switch (ops[i].what) {
        case Op::Renew:
          if (ok[i] && renewed(held_[lane], acked)) {
            held_[lane].epoch = epoch;
            held_[lane].until_ms = until;
          } else {
            if (ok[i]) late.push_back(lane);
            lost.push_back(lane);
            held_.erase(lane);
            metrics_.lanes_lost++;
          }
          break;
        case Op::Release:
          held_.erase(lane);
          if (ok[i]) {
            released.push_back(lane);
            metrics_.lanes_released++;
          }
          break;
        case Op::Take:
          if (ok[i]) {
            held_[lane] = Held{epoch, until, false, epoch};
            taken.push_back(lane);
            metrics_.lanes_taken++;
          }
          break;
      }
    }
    // The three epochs below a new one are of no use to anyone: deleted.
    if (ok[i])
      for (int64_t e = std::max<int64_t>(1, epoch - 3); e < epoch; e++) old.emplace_back(lane, e);
  }
  old.insert(old.end(), stale_docs_.begin(), stale_docs_.end());
  stale_docs_.clear();
  store_.delete_lane_docs(old);
  metrics_.lanes_held = static_cast<int>(held_.size());
  metrics_.last_store_ok_ms = wall_ms();
  log_late(late);
  if (!taken.empty() || !released.empty() || !lost.empty())
    log_info("lanes", {{"taken", taken},
                       {"released", released},
                       {"lost", lost},
                       {"held", held_.size()},
                       {"instances", live},
                       {"share", share}});
  return sequencer_taken;
}

void LaneLeases::renew_if_due() {
  settle_window();
  if (any() && wall_ms() >= renewed_at_ms_ + interval_ms()) renew();
}

void LaneLeases::renew() {
  const int64_t until = wall_ms() + cfg_.lease_ms;
  std::vector<LaneDoc> inserts;
  for (const auto& [lane, h] : held_) inserts.push_back({lane, h.epoch + 1, cfg_.instance, until});
  if (seq_held_) inserts.push_back({kSequencerLane, seq_.epoch + 1, cfg_.instance, until});
  auto ok = store_.insert_lanes(inserts);
  const int64_t acked = wall_ms();
  renewed_at_ms_ = until - cfg_.lease_ms;
  std::vector<int> lost, late;
  for (size_t i = 0; i < inserts.size(); i++) {
    const int lane = inserts[i].lane;
    Held* h = lane == kSequencerLane ? &seq_ : &held_[lane];
    if (ok[i] && renewed(*h, acked)) {
      h->epoch = inserts[i].epoch;
      h->until_ms = until;
    } else {
      if (ok[i]) late.push_back(lane);
      lost.push_back(lane);
    }
  }
  log_late(late);
  // The epochs this skipped past are removed by the next tick (it deletes
  // the three below each new epoch).
  metrics_.last_store_ok_ms = wall_ms();
  drop_lost(lost);
}

void LaneLeases::drop_lost(const std::vector<int>& leases) {
  std::vector<int> lost;
  for (int lane : leases) {
    if (lane == kSequencerLane) {
      if (!seq_held_) continue;
      log_warn("sequencer role lost", {{"epoch", seq_.epoch}});
      end_sequencer();
    } else if (held_.erase(lane) > 0) {
      lost.push_back(lane);
      metrics_.lanes_lost++;
    }
  }
  metrics_.lanes_held = static_cast<int>(held_.size());
  if (!lost.empty()) log_warn("lane lease lost", {{"lost", lost}, {"held", held_.size()}});
}

std::vector<CommandWindow::Lease> LaneLeases::window_leases() const {
  std::vector<CommandWindow::Lease> leases;
  for (const auto& [lane, h] : held_) leases.push_back({lane, h.epoch, h.until_ms});
  if (seq_held_) leases.push_back({kSequencerLane, seq_.epoch, seq_.until_ms});
  return leases;
}

void LaneLeases::apply_window(CommandWindow::Renewed r) noexcept {
  for (const auto& [lane, epoch] : r.epoch) {
    Held* h = nullptr;
    if (lane == kSequencerLane) {
      if (seq_held_) h = &seq_;
    } else {
      auto it = held_.find(lane);
      if (it != held_.end()) h = &it->second;
    }
    if (h == nullptr || epoch <= h->epoch) continue;
    h->epoch = epoch;
    h->until_ms = r.until_ms;
  }
  for (const auto& [lane, epochs] : r.passed)
    for (int64_t e : epochs) stale_docs_.emplace_back(lane, e);
  if (r.until_ms > 0) {
    renewed_at_ms_ = std::max(renewed_at_ms_, r.sent_ms);
    metrics_.last_store_ok_ms = wall_ms();
  }
  lost_in_window_.insert(lost_in_window_.end(), r.lost.begin(), r.lost.end());
  late_in_window_.insert(late_in_window_.end(), r.late.begin(), r.late.end());
  if (!r.error.empty()) window_error_ = r.error;
}

void LaneLeases::settle_window() {
  if (!window_error_.empty()) {
    metrics_.store_errors++;
    log_warn("lease renewal during a store command failed", {{"error", window_error_}});
    window_error_.clear();
  }
  if (lost_in_window_.empty()) return;
  log_late(late_in_window_);
  late_in_window_.clear();
  drop_lost(lost_in_window_);
  lost_in_window_.clear();
}

bool LaneLeases::receipt_holds(const core::Receipt& r, int64_t now) const {
  auto it = held_.find(static_cast<int>(r.a));
  return it != held_.end() && static_cast<uint64_t>(it->second.since_epoch) == r.b && usable(it->second, now);
}

core::Receipt LaneLeases::receipt(int lane) const {
  auto it = held_.find(lane);
  return core::Receipt{static_cast<uint64_t>(lane),
                       static_cast<uint64_t>(it != held_.end() ? it->second.since_epoch : 0)};
}

std::vector<std::pair<int, int64_t>> LaneLeases::claimable(int64_t now) const {
  std::vector<std::pair<int, int64_t>> out;
  for (const auto& [lane, h] : held_)
    if (!h.draining && usable(h, now)) out.emplace_back(lane, h.since_epoch);
  return out;
}

bool LaneLeases::sequencer_holds(int64_t since_epoch, int64_t now) const {
  return seq_held_ && seq_.since_epoch == since_epoch && usable(seq_, now);
}

}  // namespace relaybus::mongo
