#pragma once

// What a dispatcher whose store is a remote server (relaybus-mongo's loop;
// docs/mongo.md "Dispatch") does about that server: how long a lane lease
// stays usable, when it is renewed, what a failed store command costs each
// phase of the loop, and how long to wait between connection attempts. A
// failed command never ends the loop and never charges a delivery's
// attempts: the store is the environment (core/error_class.hpp), not the
// delivery. Kept apart from the loop so that the rules have tests of their own.

#include <cstdint>

namespace relaybus::core {

// ---- Lane leases (a lease of lease_ms, renewed by inserting the next epoch).

// How often leases are renewed: a third of the lease, at least 100 ms, so
// that two renewals can fail before the lease runs out.
int64_t lease_renew_interval_ms(int64_t lease_ms);

// What a lease must still have ahead for its holder to use it (send, complete,
// write as the sequencer): a fifth of the lease, at least 200 ms, for the
// clock skew between instances and the write that uses it.
int64_t lease_margin_ms(int64_t lease_ms);

// A lease that runs until until_ms may be used at now_ms.
bool lease_usable(int64_t until_ms, int64_t lease_ms, int64_t now_ms);

// A renewal (the next epoch inserted) acknowledged at acked_ms continues the
// tenure of a lease that ran until until_ms only if that lease was still
// usable then. Later, another instance may have taken the lane, used it and
// given it back, deleting the epochs it went through as it went (every lease
// tick deletes the three below its new epoch): the next epoch can be free
// again and the insert succeed although the lane was someone else's
// meanwhile. So a late renewal loses the lease, whatever the insert said, and
// the lane can only be taken again, under a new tenure.
bool renewal_keeps_tenure(int64_t until_ms, int64_t lease_ms, int64_t acked_ms);

// ---- A failed store command, by the phase of the loop that sent it.

enum class StorePhase {
  Leases,    // the lease tick (catalog, heartbeat, lane documents, lease insert)
  Renewal,   // a renewal of the leases held, between the tick's
  Claim,     // one handler's claim (its reads and the dead-lettering of malformed documents)
  Sequence,  // a sequencer batch
  Settle,    // a batch of completions
  Backlog,   // the backlog counts (gauges only)
};

enum class AfterStoreError {
  // No lease command (tick or renewal) until retry_in_ms has passed; the loop
  // keeps sending, collecting and completing meanwhile, fenced by the leases
  // it still holds.
  PauseLeases,
  // This handler's turn ends; the other handlers of the pass still claim
  // (one handler's bad documents or slow reads never starve another).
  NextHandler,
  // The phase runs again after retry_in_ms.
  RetryPhase,
  // The results stay in the pipeline, which retries after its own pause;
  // their receipts drop them once the lanes are no longer held.
  KeepResults,
  // Nothing but the log line and the error count: the next scheduled run.
  Skip,
};

struct StoreErrorPolicy {
  AfterStoreError after = AfterStoreError::Skip;
  int64_t retry_in_ms = 0;  // PauseLeases and RetryPhase
};

StoreErrorPolicy on_store_error(StorePhase phase);

// The loop's pause of its lease commands after a failure (PauseLeases).
class StoreBackoff {
 public:
  bool ready(int64_t now_ms) const { return now_ms >= until_ms_; }
  void failed(int64_t now_ms, StorePhase phase);
  int64_t until_ms() const { return until_ms_; }

 private:
  int64_t until_ms_ = 0;
};

// ---- Connecting.

// The wait before the next probe of an unreachable server after `failures`
// failed probes (1 or more): 250 ms doubling, at most 30 s.
int64_t reconnect_backoff_ms(int failures);

// ---- Housekeeping.

// When the backlog counts are refreshed next, after a refresh at now_ms that
// took took_ms: every max(10 s, lease) at the most often, and no more than
// about 5 % of the loop's time (counting reads every pending document, so on
// a deep backlog the counts are refreshed less often instead of slowing the
// drain).
int64_t next_backlog_refresh_ms(int64_t now_ms, int64_t lease_ms, int64_t took_ms);

}  // namespace relaybus::core
