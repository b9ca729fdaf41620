#include "pg/worker_state.hpp"

extern "C" {
#include "storage/proc.h"
}

namespace relaybus::pg {

WorkerState* workers = nullptr;

Size worker_state_size() { return MAXALIGN(sizeof(WorkerState)); }

void worker_state_init(bool found) {
    if (found) return;
    memset(workers, 0, sizeof(WorkerState));
    for (int s = 0; s < kMaxDispatchers; s++) pg_atomic_init_u32(&workers->slots[s].wakes, 0);
    for (int d = 0; d < kMaxDatabases; d++)
        for (int l = 0; l < kNumLanes; l++) workers->lanes[d][l].owner_slot = -1;
    workers->next_token = 1;
    workers->epoch = GetCurrentTimestamp();
}

int database_slot(Oid dboid, bool create) {
    int free_slot = -1;
    for (int i = 0; i < kMaxDatabases; i++) {
        if (workers->databases[i].dboid == dboid) return i;
        if (free_slot < 0 && workers->databases[i].dboid == InvalidOid) free_slot = i;
    }
    if (!create || free_slot < 0) return -1;
    workers->databases[free_slot].dboid = dboid;
    workers->databases[free_slot].no_extension = false;
    workers->databases[free_slot].dropping = false;
    for (int l = 0; l < kNumLanes; l++) workers->lanes[free_slot][l].owner_slot = -1;
    return free_slot;
}

static void set_latch_of(int procno) {
    if (procno >= 0 && procno < static_cast<int>(ProcGlobal->allProcCount))
        SetLatch(&ProcGlobal->allProcs[procno].procLatch);
}

void wake_launcher() {
    if (workers == nullptr || workers->launcher_pid == 0) return;
    set_latch_of(workers->launcher_procno);
}

void wake_dispatchers(Oid dboid) {
    if (workers == nullptr) return;
    // Unlocked read: a slot that changes meanwhile costs at most one spurious wake-up.
    for (int i = 0; i < kMaxDispatchers; i++) {
        DispatcherSlot& s = workers->slots[i];
        if (s.dboid == dboid && s.pid != 0) {
            pg_atomic_fetch_add_u32(&s.wakes, 1);
            set_latch_of(s.pgprocno);
        }
    }
}

static bool wake_pending = false;

void wake_dispatchers_at_commit() { wake_pending = true; }

void workers_at_xact_end(bool commit) {
    if (wake_pending && commit) wake_dispatchers(MyDatabaseId);
    wake_pending = false;
}

static HandlerCounters* counters_of(Oid dboid, int32 handler_id) {
    uint32 h = (static_cast<uint32>(dboid) * 2654435761u) ^ static_cast<uint32>(handler_id);
    for (int probe = 0; probe < kMaxHandlerStats; probe++) {
        HandlerCounters* c = &workers->handlers[(h + probe) % kMaxHandlerStats];
        if (c->dboid == dboid && c->handler_id == handler_id) return c;
        if (c->dboid == InvalidOid) {
            memset(c, 0, sizeof(*c));
            c->dboid = dboid;
            c->handler_id = handler_id;
            return c;
        }
    }
    return nullptr;  // table full: counting stops, delivery does not
}

void count_delivered(Oid dboid, const int32* handler_ids, const int64* latency_us, int n) {
    if (workers == nullptr || n == 0) return;
    LWLockAcquire(workers->lock, LW_EXCLUSIVE);
    HandlerCounters* c = nullptr;
    for (int i = 0; i < n; i++) {
        if (c == nullptr || c->handler_id != handler_ids[i]) c = counters_of(dboid, handler_ids[i]);
        if (c == nullptr) continue;
        c->delivered++;
        int b = 0;
        while (b < kLatencyBuckets - 1 && latency_us[i] >= (int64{1} << b)) b++;
        c->latency[b]++;
    }
    LWLockRelease(workers->lock);
}

void count_retried(Oid dboid, int32 handler_id, bool dead) {
    if (workers == nullptr) return;
    LWLockAcquire(workers->lock, LW_EXCLUSIVE);
    HandlerCounters* c = counters_of(dboid, handler_id);
    if (c != nullptr) {
        if (dead)
            c->dead++;
        else
            c->retried++;
    }
    LWLockRelease(workers->lock);
}

}  // namespace relaybus::pg

namespace relaybus::pg {

void count_http(Oid dboid, int32 handler_id, int status, TimestampTz breaker_until) {
    if (workers == nullptr) return;
    LWLockAcquire(workers->lock, LW_EXCLUSIVE);
    HandlerCounters* c = counters_of(dboid, handler_id);
    if (c != nullptr) {
        int cls = status >= 100 && status < 600 ? status / 100 : 0;
        c->http_status[cls]++;
        c->breaker_until = breaker_until;
    }
    LWLockRelease(workers->lock);
}

}  // namespace relaybus::pg
