// Everything a dispatcher keeps from one loop to the next (dispatcher.cpp), in
// one struct of plain fields that each phase's file is handed: glue, so no
// member has a destructor (an ERROR's longjmp skips nothing).
#pragma once

#include "core/dispatch_policy.hpp"
#include "pg/claim.hpp"
#include "pg/leases.hpp"
#include "pg/pg_includes.hpp"
#include "pg/worker_state.hpp"

namespace relaybus::pg {

struct DispatcherState {
  int slot = -1;  // in workers->slots
  int db = -1;    // in workers->databases
  Oid dboid = InvalidOid;

  // The lanes this dispatcher holds, with the token of each lease (fencing).
  int16 lanes[kNumLanes];
  uint64 tokens[kNumLanes];
  int nlanes = 0;

  // Deliveries leased by the running iteration (with their lease tokens), so
  // an error can give them back; in TopMemoryContext, grown, never shrunk.
  int64* inflight = nullptr;
  LeaseToken* inflight_tokens = nullptr;
  int ninflight = 0;
  int inflight_cap = 0;

  // What errors and isolation decide (core/dispatch_policy.hpp).
  core::DispatchPolicy policy;

  // Whether the next loop runs an iteration: woken, after a completion, busy.
  bool run_iteration = true;
  // The slot's wake count when the iteration began (a wake it may have eaten).
  uint32 wakes_seen = 0;
  // Epoch ms of the earliest not-yet-ready delivery the last iteration saw (0 =
  // none): the wait ends then, so a retry goes out when its backoff ends rather
  // than at the next poll.
  int64 next_ready_ms = 0;
  int64 last_dedupe_cleanup_ms = 0;

  // The notify handlers whose last batch was full: busy, claimed after the
  // others like http and kafka handlers with deliveries out (dispatcher.cpp);
  // beyond kMaxBusyNotify, the rest count as quiet.
  static constexpr int kMaxBusyNotify = 32;
  int32 busy_notify[kMaxBusyNotify];
  int nbusy_notify = 0;

  // relaybus's extension oid, looked up again only when a CREATE or DROP
  // EXTENSION relaybus committed somewhere (workers->extension_generation) or
  // an iteration failed: pg_extension has no syscache, and an index scan of it
  // on every iteration was 4 % of a dispatcher's CPU at 1,000 events/s.
  Oid known_extension = InvalidOid;
  uint64 known_extension_generation = 0;
};

// A delivery this iteration leased: given back if the iteration fails.
void remember_inflight(DispatcherState* st, int64 id, const LeaseToken& token);
// Gives back every lease the iteration holds.
void release_inflight(DispatcherState* st);
// Whether a notify handler's last batch was full, and records this one's.
bool notify_busy(const DispatcherState* st, int32 handler_id);
void note_notify_batch(DispatcherState* st, int32 handler_id, bool full);
// Keeps the earliest not-yet-ready delivery a claim saw.
void note_next_ready(DispatcherState* st, const ClaimResult* res);

}  // namespace relaybus::pg
