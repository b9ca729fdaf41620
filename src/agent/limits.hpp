#pragma once

// A handler's max_concurrency and rate across every relaybus-agent of a
// database (docs/managed.md, "Limits across agents"). The pipeline asks this
// class for permits without I/O; the budget behind them is taken from the
// database by sync() on the agent's connection, outside any transaction:
//   - max_concurrency: slot i of handler h is the session advisory lock
//     (kSlotLockSpace, slot_key(h, i)); an agent sends at most as many of h's
//     requests at once as it holds slots below max_concurrency, so all agents
//     together never exceed it. A killed agent's slots go with its session.
//   - rate and burst: each agent serving h holds the shared advisory lock
//     (kMemberLockSpace, h); the holders, counted in pg_locks, split the rate
//     and the burst evenly.
// An agent holds both only while it has work for the handler.

#include <cstdint>
#include <map>
#include <vector>

#include "agent/pg.hpp"
#include "core/delivery_pipeline.hpp"
#include "core/handler_config.hpp"
#include "core/limit_share.hpp"

namespace relaybus::agent {

// key1 of the two-int advisory locks ("RB" and 1, 2): an application taking
// locks with these as first key shares them (docs/managed.md).
inline constexpr int32_t kSlotLockSpace = 0x52420001;
inline constexpr int32_t kMemberLockSpace = 0x52420002;

class SharedLimits final : public core::HandlerLimiter {
 public:
  struct View {
    int slots = 0;           // concurrency slots this agent holds
    int agents = 0;          // agents serving the handler, this one included (0: not one of them)
    uint64_t held_back = 0;  // deliveries that waited for a permit here
    bool limited = false;    // one waited within the last second
  };

  // core::HandlerLimiter: local state only, no I/O.
  bool acquire(const core::PipelineHandler& h, int64_t now_ms, int64_t* retry_in_ms) override;
  void release(const core::PipelineHandler& h) override;
  void held_back(const core::PipelineHandler& h, int waited, int64_t now_ms) override;

  // The limits this agent claims under, so that it leases no more than it
  // may send soon: its slots as max_concurrency (at least 1: what it claims
  // before it holds any is what asks sync() for them), its share of rate and
  // burst.
  core::HandlerOptions claim_limits(const core::PipelineHandler& h) const;
  // Takes and gives back locks as the handlers' work and options ask, for
  // the handlers in `limited` (by key; any other held is given back).
  // Throws PgError.
  void sync(PgConn& conn, const std::map<int, const core::PipelineHandler*>& limited, int64_t now_ms);
  // When sync() has something to do, or -1.
  int64_t next_sync_ms() const;
  // The session ended: its locks went with it.
  void connection_lost();
  View view(int key, int64_t now_ms) const;

 private:
  struct State {
    std::vector<int> slots;  // held slot indexes, ascending
    bool member = false;
    int agents = 1;
    core::ShareUse use;      // permits out, this agent's share of the rate, what waited
    int64_t demand_ms = -1;  // last time it had work here
    int64_t refresh_ms = 0;  // next count of the handler's agents
    int64_t retry_slots_ms = 0;
    bool short_of_slots = false;  // fewer than its share, at the last sync
  };
  static int usable_slots(const State& s, const core::HandlerOptions& o);
  static int target_slots(const State& s, const core::HandlerOptions& o);
  static bool active(const State& s, int64_t now_ms);
  static void give_back(PgConn& conn, int key, State& s, size_t keep);
  static void leave(PgConn& conn, int key, State& s);

  std::map<int, State> states_;
};

}  // namespace relaybus::agent
