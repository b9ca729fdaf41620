#include "pg/worker_state.hpp"
#include "pg/pg_compat.hpp"

#include <cmath>

#include "pg/handler_alerts.hpp"

extern "C" {
#include "access/xact.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/proc.h"
}

namespace relaybus::pg {

WorkerState* workers = nullptr;

static int slot_count() { return Max(max_worker_processes, 1); }
static int database_count() { return MaxBackends + max_worker_processes; }

static Size slots_offset() { return MAXALIGN(sizeof(WorkerState)); }
static Size databases_offset() { return slots_offset() + MAXALIGN(mul_size(slot_count(), sizeof(DispatcherSlot))); }
static Size lanes_offset() { return databases_offset() + MAXALIGN(mul_size(database_count(), sizeof(DatabaseState))); }

// MaxBackends is known in shmem_request_hook (PostgreSQL 15+).
Size worker_state_size() { return add_size(lanes_offset(), mul_size(database_count(), sizeof(LaneLease) * kNumLanes)); }

void worker_state_init(bool found) {
  if (found) return;
  memset(workers, 0, worker_state_size());
  char* base = reinterpret_cast<char*>(workers);
  workers->nslots = slot_count();
  workers->ndatabases = database_count();
  workers->slots = reinterpret_cast<DispatcherSlot*>(base + slots_offset());
  workers->databases = reinterpret_cast<DatabaseState*>(base + databases_offset());
  workers->lanes = reinterpret_cast<LaneLease(*)[kNumLanes]>(base + lanes_offset());
  for (int s = 0; s < workers->nslots; s++) {
    pg_atomic_init_u32(&workers->slots[s].wakes, 0);
    pg_atomic_init_u32(&workers->slots[s].rescans, 0);
  }
  for (int d = 0; d < workers->ndatabases; d++)
    for (int l = 0; l < kNumLanes; l++) workers->lanes[d][l].owner_slot = -1;
  SpinLockInit(&workers->limits_lock);
  workers->next_token = 1;
  workers->extension_generation = 1;
  workers->epoch = GetCurrentTimestamp();
}

static int find_database(Oid dboid, int* free_slot, int* used) {
  *free_slot = -1;
  *used = 0;
  int found = -1;
  for (int i = 0; i < workers->ndatabases; i++) {
    if (workers->databases[i].dboid == InvalidOid) {
      if (*free_slot < 0) *free_slot = i;
      continue;
    }
    ++*used;
    if (workers->databases[i].dboid == dboid) found = i;
  }
  return found;
}

static int take_database(int d, Oid dboid) {
  DatabaseState& db = workers->databases[d];
  memset(&db, 0, sizeof(db));
  db.dboid = dboid;
  for (int l = 0; l < kNumLanes; l++) workers->lanes[d][l].owner_slot = -1;
  return d;
}

int database_slot(Oid dboid, bool create) {
  int free_slot, used;
  int d = find_database(dboid, &free_slot, &used);
  if (d >= 0 || !create || free_slot < 0) return d;
  return take_database(free_slot, dboid);
}

int database_slot_for_report(Oid dboid) {
  int free_slot, used;
  int d = find_database(dboid, &free_slot, &used);
  if (d >= 0 || free_slot < 0 || used >= workers->ndatabases - workers->nslots) return d;
  return take_database(free_slot, dboid);
}

bool database_kept_out(Oid dboid) {
  int free_slot, used;
  int d = find_database(dboid, &free_slot, &used);
  return d >= 0 && workers->databases[d].keep_out > 0;
}

static void set_latch_of(int procno) {
  if (procno >= 0 && procno < static_cast<int>(ProcGlobal->allProcCount))
    SetLatch(&ProcGlobal->allProcs[procno].procLatch);
}

void wake_launcher() {
  if (workers == nullptr || workers->launcher_pid == 0) return;
  set_latch_of(workers->launcher_procno);
}

void wake_dispatcher(DispatcherSlot& slot) {
  pg_atomic_fetch_add_u32(&slot.wakes, 1);
  set_latch_of(slot.pgprocno);
}

// rescan: bump the rescan count before the wake-up (claim_floor.hpp).
static void signal_dispatchers(Oid dboid, bool rescan) {
  if (workers == nullptr) return;
  // Unlocked read: a slot that changes meanwhile costs at most one spurious wake-up.
  for (int i = 0; i < workers->nslots; i++) {
    DispatcherSlot& s = workers->slots[i];
    if (s.dboid != dboid || s.pid == 0) continue;
    if (rescan) pg_atomic_fetch_add_u32(&s.rescans, 1);
    wake_dispatcher(s);
  }
}

void wake_dispatchers(Oid dboid) { signal_dispatchers(dboid, false); }

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

static bool wake_pending = false;
static bool rescan_pending = false;

void wake_dispatchers_at_commit() { wake_pending = true; }
void rescan_dispatchers_at_commit() { rescan_pending = true; }

// Runs after the commit made this transaction's rows visible: a dispatcher
// that reads the new count before its next scan sees them.
void rescan_dispatchers(Oid dboid) { signal_dispatchers(dboid, true); }

// What this transaction's publishes and completions change per (handler,
// nesting level): published and delivered deliveries (with their latencies)
// and the pending count. Kept in a fixed array (no allocation in a callback);
// a full array merges into the handler's first entry (its level then may be
// lower: a rolled-back savepoint's changes may count).
struct CountNote {
  int32 handler_id;
  int nest_level;
  int64 published;
  int64 pending;
  uint32 delivered;
  uint64 latency_sum_us;
  uint32 latency[kLatencyBuckets];
};
constexpr int kMaxCountNotes = 64;
static CountNote count_notes[kMaxCountNotes];
static int ncount_notes = 0;

static CountNote* note_of(int32 handler_id) {
  int level = GetCurrentTransactionNestLevel();
  int same_handler = -1;
  for (int i = 0; i < ncount_notes; i++) {
    CountNote& p = count_notes[i];
    if (p.handler_id != handler_id) continue;
    if (p.nest_level == level) return &p;
    if (same_handler < 0) same_handler = i;
  }
  if (ncount_notes < kMaxCountNotes) {
    CountNote* p = &count_notes[ncount_notes++];
    memset(p, 0, sizeof(*p));
    p->handler_id = handler_id;
    p->nest_level = level;
    return p;
  }
  // 64 other handlers in one transaction: merged, or uncounted
  // (relay._recount_pending() puts the pending count right).
  return same_handler >= 0 ? &count_notes[same_handler] : nullptr;
}

static void note_at_commit(int32 handler_id, int64 published, int64 pending) {
  CountNote* p = note_of(handler_id);
  if (p == nullptr) return;
  p->published += published;
  p->pending += pending;
}

static int latency_bucket(int64 latency_us) {
  int b = 0;
  while (b < kLatencyBuckets - 1 && latency_us >= (int64{1} << b)) b++;
  return b;
}

void count_delivered_at_commit(int32 handler_id, int64 latency_us) {
  CountNote* p = note_of(handler_id);
  if (p == nullptr) return;
  p->pending--;
  p->delivered++;
  p->latency_sum_us += static_cast<uint64>(Max(latency_us, int64{0}));
  p->latency[latency_bucket(latency_us)]++;
}

void count_published_at_commit(int32 handler_id, int n) { note_at_commit(handler_id, n, n); }
void count_pending_at_commit(int32 handler_id, int64 delta) { note_at_commit(handler_id, 0, delta); }

void published_at_subxact_end(bool commit, int nest_level) {
  int kept = 0;
  for (int i = 0; i < ncount_notes; i++) {
    CountNote p = count_notes[i];
    if (p.nest_level >= nest_level) {
      if (!commit) continue;
      p.nest_level = nest_level - 1;  // now the parent's
    }
    count_notes[kept++] = p;
  }
  ncount_notes = kept;
}

// The pending counts of a database: its entry with handler id 0 holds the
// extension they count for.
static HandlerCounters* pending_meta_of(Oid dboid, bool create) {
  uint32 h = (static_cast<uint32>(dboid) * 2654435761u);
  for (int probe = 0; probe < kMaxHandlerStats; probe++) {
    HandlerCounters* c = &workers->handlers[(h + probe) % kMaxHandlerStats];
    if (c->dboid == dboid && c->handler_id == 0) return c;
    if (c->dboid == InvalidOid) return create ? counters_of(dboid, 0) : nullptr;
  }
  return nullptr;
}

// Under the commit's locks still: a recount (which waits for every writer of
// relay.deliveries) sees these rows and these counts together.
static void apply_at_commit() {
  if (workers == nullptr || ncount_notes == 0) return;
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  for (int i = 0; i < ncount_notes; i++) {
    const CountNote& n = count_notes[i];
    HandlerCounters* c = counters_of(MyDatabaseId, n.handler_id);
    if (c == nullptr) continue;
    c->published += static_cast<uint64>(n.published);
    c->pending += n.pending;
    if (n.delivered == 0) continue;
    c->delivered += n.delivered;
    c->latency_sum_us += n.latency_sum_us;
    for (int b = 0; b < kLatencyBuckets; b++) c->latency[b] += n.latency[b];
    c->failing = false;
  }
  LWLockRelease(workers->lock);
}

void workers_at_xact_end(bool commit) {
  if (rescan_pending && commit)
    rescan_dispatchers(MyDatabaseId);
  else if (wake_pending && commit)
    wake_dispatchers(MyDatabaseId);
  wake_pending = rescan_pending = false;
  if (commit) apply_at_commit();
  ncount_notes = 0;
}

void set_pending_counts(Oid dboid, Oid extension, const int32* handler_ids, const int64* counts, int n) {
  if (workers == nullptr) return;
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  HandlerCounters* meta = pending_meta_of(dboid, true);
  if (meta != nullptr) {
    for (int i = 0; i < kMaxHandlerStats; i++)
      if (workers->handlers[i].dboid == dboid) workers->handlers[i].pending = 0;
    for (int i = 0; i < n; i++) {
      HandlerCounters* c = counters_of(dboid, handler_ids[i]);
      if (c != nullptr) c->pending = counts[i];
    }
    meta->counted_for = extension;
  }
  LWLockRelease(workers->lock);
}

void forget_pending_counts(Oid dboid) {
  if (workers == nullptr) return;
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  HandlerCounters* meta = pending_meta_of(dboid, false);
  if (meta != nullptr) meta->counted_for = InvalidOid;
  LWLockRelease(workers->lock);
}

bool pending_counted_for(Oid dboid, Oid extension) {
  if (workers == nullptr) return false;
  LWLockAcquire(workers->lock, LW_SHARED);
  HandlerCounters* meta = pending_meta_of(dboid, false);
  bool counted = meta != nullptr && meta->counted_for == extension;
  LWLockRelease(workers->lock);
  return counted;
}

void count_retried(Oid dboid, int32 handler_id, bool dead) {
  if (workers == nullptr) return;
  PendingAlert alert;
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  HandlerCounters* c = counters_of(dboid, handler_id);
  if (c != nullptr) {
    if (dead)
      c->dead++;
    else
      c->retried++;
    if (dead)
      alert_event(c, kAlertDeadLettered, -1, 0, &alert);
    else if (!c->failing)
      alert_event(c, kAlertStartedFailing, -1, 0, &alert);
    c->failing = true;
  }
  LWLockRelease(workers->lock);
  alert_log(dboid, handler_id, alert);
}

}  // namespace relaybus::pg

namespace relaybus::pg {

HandlerCounters* copy_handler_counters(int* n) {
  auto* copy = static_cast<HandlerCounters*>(palloc(sizeof(HandlerCounters) * kMaxHandlerStats));
  *n = 0;
  if (workers == nullptr) return copy;
  LWLockAcquire(workers->lock, LW_SHARED);
  for (int i = 0; i < kMaxHandlerStats; i++)
    if (workers->handlers[i].dboid == MyDatabaseId) copy[(*n)++] = workers->handlers[i];
  LWLockRelease(workers->lock);
  return copy;
}

void count_attempt(Oid dboid, int32 handler_id, int status, TimestampTz breaker_until, int64 send_ms, bool after_gap) {
  if (workers == nullptr) return;
  PendingAlert alert;
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  HandlerCounters* c = counters_of(dboid, handler_id);
  if (c != nullptr) {
    int cls = status >= 100 && status < 600 ? status / 100 : 0;
    if (status >= 0) c->http_status[cls]++;
    if (c->breaker_until == 0 && breaker_until != 0)
      alert_event(c, kAlertBreakerOpened, status, breaker_until, &alert);
    else if (c->breaker_until != 0 && breaker_until == 0)
      alert_event(c, kAlertBreakerClosed, -1, 0, &alert);
    c->breaker_until = breaker_until;
    if (send_ms >= 0) {
      // The pipeline's clock counts whole milliseconds: the attempt took
      // [send_ms, send_ms + 1) ms. The bucket takes the upper end (its
      // percentile is an upper bound), the sum the middle.
      c->sends++;
      c->send_sum_us += static_cast<uint64>(send_ms) * 1000 + 500;
      c->send_latency[latency_bucket((send_ms + 1) * 1000)]++;
    }
    if (after_gap) c->delivered_after_gap++;
  }
  LWLockRelease(workers->lock);
  alert_log(dboid, handler_id, alert);
}

// With limits_lock held.
static HandlerLimit* limit_of(Oid dboid, int32 handler_id, bool create) {
  uint32 h = (static_cast<uint32>(dboid) * 2654435761u) ^ static_cast<uint32>(handler_id);
  for (int probe = 0; probe < kMaxHandlerStats; probe++) {
    HandlerLimit* l = &workers->limits[(h + probe) % kMaxHandlerStats];
    if (l->dboid == dboid && l->handler_id == handler_id) return l;
    if (l->dboid == InvalidOid) {
      if (!create) return nullptr;
      memset(l, 0, sizeof(*l));
      l->dboid = dboid;
      l->handler_id = handler_id;
      return l;
    }
  }
  return nullptr;
}

static bool valid_share(int share) { return share >= 0 && share < kMaxWorkersPerDatabase; }

bool limit_acquire(Oid dboid, int share, int32 handler_id, int max_concurrency, double rate, int burst, int64 now_ms,
                   int64* retry_in_ms) {
  if (workers == nullptr || !valid_share(share)) return true;
  bool ok = true;
  SpinLockAcquire(&workers->limits_lock);
  HandlerLimit* l = limit_of(dboid, handler_id, true);
  if (l != nullptr) {
    if (max_concurrency > 0) {
      int held = 0;
      for (int i = 0; i < kMaxWorkersPerDatabase; i++) held += l->in_flight[i];
      if (held >= max_concurrency) {
        ok = false;
        // Given back by a result in any dispatcher, which does not wake this one.
        *retry_in_ms = 5;
      }
    }
    if (ok && rate > 0) {
      // Dispatchers' clocks are read at different moments: never backwards.
      if (l->tokens_at_ms == 0) {
        l->tokens = burst;
        l->tokens_at_ms = now_ms;
      } else if (now_ms > l->tokens_at_ms) {
        l->tokens = Min(static_cast<double>(burst), l->tokens + (now_ms - l->tokens_at_ms) * rate / 1000.0);
        l->tokens_at_ms = now_ms;
      }
      l->tokens = Min(l->tokens, static_cast<double>(burst));  // a smaller burst set live
      if (l->tokens >= 1) {
        l->tokens -= 1;
      } else {
        ok = false;
        *retry_in_ms = Max(static_cast<int64>(1), static_cast<int64>(std::ceil((1 - l->tokens) * 1000.0 / rate)));
      }
    }
    if (ok) l->in_flight[share]++;
  }
  SpinLockRelease(&workers->limits_lock);
  return ok;
}

void limit_release(Oid dboid, int share, int32 handler_id) {
  if (workers == nullptr || !valid_share(share)) return;
  SpinLockAcquire(&workers->limits_lock);
  HandlerLimit* l = limit_of(dboid, handler_id, false);
  if (l != nullptr && l->in_flight[share] > 0) l->in_flight[share]--;
  SpinLockRelease(&workers->limits_lock);
}

void limit_held_back(Oid dboid, int32 handler_id, int waited, int64 now_ms) {
  if (workers == nullptr) return;
  SpinLockAcquire(&workers->limits_lock);
  HandlerLimit* l = limit_of(dboid, handler_id, false);
  if (l != nullptr) {
    l->held_back += static_cast<uint64>(Max(0, waited));
    l->held_back_at_ms = now_ms;
  }
  SpinLockRelease(&workers->limits_lock);
}

void limit_reset_share(Oid dboid, int share) {
  if (workers == nullptr || !valid_share(share)) return;
  SpinLockAcquire(&workers->limits_lock);
  for (int i = 0; i < kMaxHandlerStats; i++)
    if (workers->limits[i].dboid == dboid) workers->limits[i].in_flight[share] = 0;
  SpinLockRelease(&workers->limits_lock);
}

void limit_stats(Oid dboid, int32 handler_id, uint64* held_back, int64* held_back_at_ms) {
  *held_back = 0;
  *held_back_at_ms = 0;
  if (workers == nullptr) return;
  SpinLockAcquire(&workers->limits_lock);
  HandlerLimit* l = limit_of(dboid, handler_id, false);
  if (l != nullptr) {
    *held_back = l->held_back;
    *held_back_at_ms = l->held_back_at_ms;
  }
  SpinLockRelease(&workers->limits_lock);
}

}  // namespace relaybus::pg
