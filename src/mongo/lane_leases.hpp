// The lanes this instance holds, and the sequencer role (docs/mongo.md, "Lane
// leases"): relay_lanes holds one document per (lane, epoch), unique. The
// holder of a lane is the owner of its highest epoch while that document's
// `until` has not passed. Taking a free or expired lane, renewing a held one
// and giving one back are all the same operation: insert epoch+1. Two
// instances racing for a lane race to insert the same (lane, epoch); the
// unique index lets exactly one win, on any server that enforces unique
// indexes (FerretDB v1 does, even though its findAndModify and update are not
// atomic). All of an instance's renewals, takeovers and releases of one tick
// go in one insertMany. The epoch is the fencing token: an instance that
// fails to insert its next epoch has lost the lane and drops that lane's
// results without completing them; and it completes results only while its
// last successful renewal's `until` (minus a margin for clock skew and the
// completing write) lies ahead, which no other instance can reach before
// that `until` has passed on its own clock.
//
// A delivery's receipt is (lane, the epoch at which this instance took the
// lane): renewals keep it, a lane lost and taken again has a new one, so
// nothing claimed under an earlier tenure is sent or completed. A renewal
// keeps it only if acknowledged while the lease was still usable
// (core::renewal_keeps_tenure): a successful insert alone proves nothing
// after a stall, since the lane's next holder deletes the epochs it passes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/delivery_pipeline.hpp"
#include "mongo/command_window.hpp"
#include "mongo/config.hpp"
#include "mongo/metrics.hpp"
#include "mongo/sequencer.hpp"
#include "mongo/store.hpp"

namespace relaybus::mongo {

class LaneLeases {
 public:
  // cfg is the dispatcher's, read at each use (a reload changes it in place).
  LaneLeases(const Config& cfg, Store& store, Metrics& metrics, Sequencer& sequencer, uint64_t seed)
      : cfg_(cfg), store_(store), metrics_(metrics), sequencer_(sequencer), rng_(seed) {}

  // One tick's lane work, after the catalog and the heartbeat: reads the lane
  // documents, drops what others moved past, drains lanes above the fair
  // share of `live` instances and gives back the drained ones nothing is busy
  // with (busy: lane -> deliveries queued, in flight, awaiting completion or
  // leased to a consumer), takes free ones up to the share, and sends it all
  // as one insert. `stopping`: release every idle lease, take none. Returns
  // true when the sequencer role was taken. Throws StoreError.
  bool tick(int64_t now_ms, int live, const std::function<std::map<int, int>()>& busy, bool stopping);
  // Renews every lease held (one insert) when a renewal interval has passed
  // since the last one was sent: before a lease is used (queuing, sending,
  // completing) after store commands that may have used up its slack.
  void renew_if_due();
  int64_t interval_ms() const;

  // The command window's side (Store::CommandObserver): what it may renew
  // while a store command runs, and when; what it renewed, applied when it
  // closes (values only: no lease is dropped inside a store method's bracket);
  // losses and errors it found, acted on by settle_window().
  std::vector<CommandWindow::Lease> window_leases() const;
  int64_t window_due_ms() const { return renewed_at_ms_ + interval_ms(); }
  void apply_window(CommandWindow::Renewed r) noexcept;
  void settle_window();

  // Receipts and lanes.
  bool receipt_holds(const core::Receipt& r, int64_t now_ms) const;
  core::Receipt receipt(int lane) const;  // epoch 0 (no lane held) never holds
  // Lanes a claim may read: held, not draining, usable; with their receipt epochs.
  std::vector<std::pair<int, int64_t>> claimable(int64_t now_ms) const;
  bool any() const { return !held_.empty() || seq_held_; }

  // The sequencer role: held, under the tenure that started at since_epoch,
  // and usable.
  bool sequencer_held() const { return seq_held_; }
  int64_t sequencer_since() const { return seq_.since_epoch; }
  bool sequencer_holds(int64_t since_epoch, int64_t now_ms) const;

 private:
  struct Held {
    int64_t epoch = 0;
    int64_t until_ms = 0;
    bool draining = false;
    int64_t since_epoch = 0;  // the receipt's epoch: when this tenure began
  };
  bool usable(const Held& h, int64_t now_ms) const;
  bool renewed(const Held& h, int64_t acked_ms) const;  // a renewal acknowledged then keeps the tenure
  void log_late(const std::vector<int>& leases) const;
  void renew();
  void drop_lost(const std::vector<int>& leases);  // lanes (and kSequencerLane) a renewal found taken
  void end_sequencer();                            // the role's lease is gone

  const Config& cfg_;
  Store& store_;
  Metrics& metrics_;
  Sequencer& sequencer_;
  std::mt19937_64 rng_;
  std::map<int, Held> held_;
  Held seq_;  // the sequencer role's lease, while seq_held_
  bool seq_held_ = false;
  int64_t renewed_at_ms_ = 0;  // when the last renewal was sent
  // From the command window: renewed past (deleted by the next tick), lost, failed.
  std::vector<std::pair<int, int64_t>> stale_docs_;
  std::vector<int> lost_in_window_;
  std::vector<int> late_in_window_;  // among the lost: renewed too late
  std::string window_error_;
};

}  // namespace relaybus::mongo
