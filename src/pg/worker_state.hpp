// Shared memory of the background workers: one slot per dispatcher, the
// databases the launcher knows, lane leases, and per-handler delivery counters.
#pragma once

#include "pg/pg_includes.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/spin.h"
}

namespace relaybus::pg {

// The arrays are sized at server start (worker_state_init): one dispatcher
// slot per background worker process (max_worker_processes bounds the
// dispatchers anyway) and database states for the databases being served or
// kept out by a DDL statement, so the number of databases relaybus serves has
// no limit of its own.
constexpr int kMaxWorkersPerDatabase = 8;
constexpr int kNumLanes = 64;
constexpr int kMaxHandlerStats = 1024;
constexpr int kLatencyBuckets = 40;  // bucket b: latency < 2^b microseconds

struct DispatcherSlot {
  Oid dboid;         // InvalidOid: free
  int worker_index;  // 0..workers_per_database-1
  int pid;           // 0 until the worker runs, and again once it stopped
  int pgprocno;
  uint32 ticket;  // bumped whenever the launcher reserves the slot
  TimestampTz started_at;
  TimestampTz heartbeat;
  int lanes_held;
  uint64 delivered;
  uint64 failed;
  char last_error[256];
  // Left by a dispatcher that found no relaybus in its database, for the
  // launcher: the extension generation it read before looking.
  bool found_no_extension;
  uint64 generation_seen;
  // Set by the launcher when this dispatcher should no longer run (fewer
  // workers per database, relaybus.enabled off, the database unlisted): it
  // finishes its iteration and in-flight requests and exits 0. 0: none.
  TimestampTz stop_requested_at;
  // Bumped by every wake-up request before the latch is set. The latch alone
  // can lose a wake: a lock wait inside an iteration (ProcSleep) resets it.
  pg_atomic_uint32 wakes;
  // Bumped after a commit put deliveries back with old ids (relay_replay,
  // relay._recount_pending): the dispatcher's claims forget their floors
  // (claim_floor.hpp) and scan from the head.
  pg_atomic_uint32 rescans;
};

struct DatabaseState {
  Oid dboid;                      // InvalidOid: free
  int keep_out;                   // DDL statements that need this database's dispatchers gone
  TimestampTz not_started_since;  // the launcher found no worker slot for it (0: none missing)
};

struct LaneLease {
  int owner_slot;  // -1: free
  uint64 token;    // grows with every change of owner (fencing)
  TimestampTz until;
};

struct HandlerCounters {
  Oid dboid;  // InvalidOid: free
  int32 handler_id;
  uint64 delivered;
  uint64 retried;
  uint64 dead;
  uint64 latency[kLatencyBuckets];
  uint64 http_status[6];      // http: responses 1xx..5xx by class (index 1..5); [0] = no response
  TimestampTz breaker_until;  // http: calls suspended until then (circuit breaker), 0 = closed
  uint64 published;           // deliveries created for it by committed publishes
  int64 pending;              // its rows in relay.deliveries (pending_counter.cpp)
  Oid counted_for;            // handler id 0: the relaybus extension oid the counts are of
  uint64 latency_sum_us;      // of the `delivered` ones (a histogram's _sum)
  // Operator log lines (handler_alerts.cpp), rate limited per kind.
  bool failing;                 // the last completion failed
  TimestampTz last_alert[4];    // per AlertKind: when its last line was written
  uint32 alerts_suppressed[4];  // per AlertKind: events not logged since then
  // Attempts that went out and came back (http, kafka): from handing one to
  // the sink to its result (core::Completion::send_ms).
  uint64 sends;
  uint64 send_sum_us;
  uint64 send_latency[kLatencyBuckets];
  // kafka: acknowledged after an earlier message of its key, in flight with
  // it, failed for good (in the partition after that gap: docs/kafka.md).
  uint64 delivered_after_gap;
};

// A handler's max_concurrency and rate, shared by its database's dispatchers
// (docs/architecture.md, "Shared limits"). Only handlers with a limit have one.
struct HandlerLimit {
  Oid dboid;  // InvalidOid: free
  int32 handler_id;
  // Permits held per dispatcher (its worker_index): a dispatcher that exits,
  // or the next one of its index, gives its share back at once.
  int32 in_flight[kMaxWorkersPerDatabase];
  double tokens;          // the rate's bucket
  int64 tokens_at_ms;     // when tokens was last brought up to date; 0: a full bucket
  uint64 held_back;       // deliveries that waited for a permit
  int64 held_back_at_ms;  // the last refusal (Unix ms)
};

struct WorkerState {
  LWLock* lock;
  TimestampTz epoch;  // set when shared memory is (re)initialized
  int launcher_pid;
  int launcher_procno;
  // Bumped when a CREATE or DROP EXTENSION relaybus commits in any database:
  // the launcher then looks again at databases where relaybus was missing.
  uint64 extension_generation;
  int nslots;                     // max_worker_processes
  int ndatabases;                 // MaxBackends + max_worker_processes
  DispatcherSlot* slots;          // [nslots], in the same shared memory segment
  DatabaseState* databases;       // [ndatabases]
  LaneLease (*lanes)[kNumLanes];  // [ndatabases]: the lanes of databases[d]
  HandlerCounters handlers[kMaxHandlerStats];
  uint64 next_token;
  // Held for a few instructions at a time, never across a call that may fail.
  slock_t limits_lock;
  HandlerLimit limits[kMaxHandlerStats];
};

extern WorkerState* workers;

// What the launcher passes to a dispatcher (bgw_extra): a dispatcher whose
// slot was given to another since (an old epoch after a crash-restart, or an
// old ticket after a launcher restart) just exits.
struct DispatcherArgs {
  int slot;
  TimestampTz epoch;
  uint32 ticket;
};

Size worker_state_size();
void worker_state_init(bool found);

// Database slot of dboid (creating it if create), or -1; with the lock held.
// A slot created for a report (not_started_since) only takes one while the
// table has room for every dispatcher besides.
int database_slot(Oid dboid, bool create);
int database_slot_for_report(Oid dboid);
// Whether DDL keeps the database's dispatchers out (lock held).
bool database_kept_out(Oid dboid);

// Wakes the launcher (after CREATE EXTENSION, DROP DATABASE, a setting change).
void wake_launcher();
// Wakes every dispatcher of a database.
void wake_dispatchers(Oid dboid);
// One dispatcher (its slot is running).
void wake_dispatcher(DispatcherSlot& slot);

// Publishers, and changes to relay.handlers or relay.routes, ask for a
// wake-up; it happens when their transaction commits.
void wake_dispatchers_at_commit();
// At commit (after its rows are visible): the database's dispatchers rescan
// their handlers from the head, and are woken.
void rescan_dispatchers_at_commit();
// The same, now (from a callback that runs after the commit).
void rescan_dispatchers(Oid dboid);
void workers_at_xact_end(bool commit);

// This database's handler counters, copied under the lock (palloc'd); *n is
// how many.
HandlerCounters* copy_handler_counters(int* n);

// Delivery counters of the workers, for relay.handler_stats.
void count_retried(Oid dboid, int32 handler_id, bool dead);
// The end of one attempt of an http or kafka handler: status < 0 is not an
// HTTP result (a kafka handler's), send_ms < 0 an attempt that never went out.
void count_attempt(Oid dboid, int32 handler_id, int status, TimestampTz breaker_until, int64 send_ms, bool after_gap);

// Deliveries created for handler_id by this transaction's publishes: added to
// its `published` counter when the transaction commits, dropped if it (or the
// subtransaction that made them) aborts.
void count_published_at_commit(int32 handler_id, int n);
void published_at_subxact_end(bool commit, int nest_level);
// Deliveries of handler_id this transaction removed (< 0) or put back (> 0):
// applied to its pending count when the transaction commits.
void count_pending_at_commit(int32 handler_id, int64 delta);
// A delivery of handler_id this transaction deleted as delivered, latency_us
// after its publish: counted (delivered, latency, pending) when it commits.
void count_delivered_at_commit(int32 handler_id, int64 latency_us);
// The pending counts of a database, as counted under a lock that excluded
// every writer of relay.deliveries (pending_counter.cpp); others become 0.
void set_pending_counts(Oid dboid, Oid extension, const int32* handler_ids, const int64* counts, int n);
// Whether the database's pending counts were counted for this installation.
bool pending_counted_for(Oid dboid, Oid extension);
// Rows were written by other means (COPY into relay.deliveries, as pg_restore
// does): the database's pending counts are counted again by its dispatcher.
void forget_pending_counts(Oid dboid);

// A permit of a handler's shared limits for dispatcher `share` (its
// worker_index), or false and *retry_in_ms. Never raises an error: without a
// free entry for the handler (kMaxHandlerStats handlers with limits) it is not limited.
bool limit_acquire(Oid dboid, int share, int32 handler_id, int max_concurrency, double rate, int burst, int64 now_ms,
                   int64* retry_in_ms);
void limit_release(Oid dboid, int share, int32 handler_id);
void limit_held_back(Oid dboid, int32 handler_id, int waited, int64 now_ms);
// Every permit dispatcher `share` of the database holds goes back.
void limit_reset_share(Oid dboid, int share);
// For relay.handler_stats: deliveries that waited, and when one was last refused (0: never).
void limit_stats(Oid dboid, int32 handler_id, uint64* held_back, int64* held_back_at_ms);

}  // namespace relaybus::pg
