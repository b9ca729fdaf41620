// Shared memory of the background workers: one slot per dispatcher, the
// databases the launcher knows, lane leases, and per-handler delivery counters.
#pragma once

#include "pg/pg_includes.hpp"

extern "C" {
#include "port/atomics.h"
}

namespace relaybus::pg {

constexpr int kMaxDatabases = 64;
constexpr int kMaxWorkersPerDatabase = 8;
constexpr int kMaxDispatchers = kMaxDatabases * kMaxWorkersPerDatabase;
constexpr int kNumLanes = 64;
constexpr int kMaxHandlerStats = 1024;
constexpr int kLatencyBuckets = 40;  // bucket b: latency < 2^b microseconds

struct DispatcherSlot {
    Oid dboid;               // InvalidOid: free
    int worker_index;        // 0..workers_per_database-1
    int pid;                 // 0 until the worker runs
    int pgprocno;
    TimestampTz started_at;
    TimestampTz heartbeat;
    int lanes_held;
    uint64 delivered;
    uint64 failed;
    char last_error[256];
    // Bumped by every wake-up request before the latch is set. The latch alone
    // can lose a wake: a lock wait inside an iteration (ProcSleep) resets it.
    pg_atomic_uint32 wakes;
};

struct DatabaseState {
    Oid dboid;               // InvalidOid: free
    bool no_extension;       // a dispatcher found no relaybus here; wait for CREATE EXTENSION
    uint64 created;          // bumped when CREATE EXTENSION relaybus commits here
    bool dropping;           // DROP DATABASE in progress: keep out
};

struct LaneLease {
    int owner_slot;          // -1: free
    uint64 token;            // grows with every change of owner (fencing)
    TimestampTz until;
};

struct HandlerCounters {
    Oid dboid;               // InvalidOid: free
    int32 handler_id;
    uint64 delivered;
    uint64 retried;
    uint64 dead;
    uint64 latency[kLatencyBuckets];
    uint64 http_status[6];   // http: responses 1xx..5xx by class (index 1..5); [0] = no response
    TimestampTz breaker_until;  // http: calls suspended until then (circuit breaker), 0 = closed
};

struct WorkerState {
    LWLock* lock;
    TimestampTz epoch;       // set when shared memory is (re)initialized
    int launcher_pid;
    int launcher_procno;
    DispatcherSlot slots[kMaxDispatchers];
    DatabaseState databases[kMaxDatabases];
    LaneLease lanes[kMaxDatabases][kNumLanes];
    HandlerCounters handlers[kMaxHandlerStats];
    uint64 next_token;
};

extern WorkerState* workers;

// What the launcher passes to a dispatcher (bgw_extra): a dispatcher restarted
// by the postmaster after a crash-restart carries an old epoch and just exits.
struct DispatcherArgs {
    int slot;
    TimestampTz epoch;
};

Size worker_state_size();
void worker_state_init(bool found);

// Database slot of dboid (creating it if create), or -1.
int database_slot(Oid dboid, bool create);

// Wakes the launcher (after CREATE EXTENSION, DROP DATABASE, a setting change).
void wake_launcher();
// Wakes every dispatcher of a database.
void wake_dispatchers(Oid dboid);

// Publishers ask for a wake-up; it happens when their transaction commits.
void wake_dispatchers_at_commit();
void workers_at_xact_end(bool commit);

// Delivery counters of the workers, for relay.handler_stats.
void count_delivered(Oid dboid, const int32* handler_ids, const int64* latency_us, int n);
void count_retried(Oid dboid, int32 handler_id, bool dead);
void count_http(Oid dboid, int32 handler_id, int status, TimestampTz breaker_until);

}  // namespace relaybus::pg
