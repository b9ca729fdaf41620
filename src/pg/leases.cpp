#include "pg/leases.hpp"
#include "pg/pg_compat.hpp"

#include "pg/settings.hpp"
#include "pg/shared_state.hpp"

extern "C" {
#include "utils/hsearch.h"
}

namespace relaybus::pg {

static HTAB* lease_table = nullptr;

static LeaseKey key_of(int64 id) {
  LeaseKey k;
  memset(&k, 0, sizeof(k));
  k.delivery_id = id;
  k.database_id = MyDatabaseId;
  return k;
}

Size leases_shmem_size() { return hash_estimate_size(guc_max_leases, sizeof(LeaseEntry)); }

void leases_shmem_init() {
  HASHCTL ctl;
  memset(&ctl, 0, sizeof(ctl));
  ctl.keysize = sizeof(LeaseKey);
  ctl.entrysize = sizeof(LeaseEntry);
  lease_table =
      relaybus_shmem_init_fixed_hash("relaybus leases", guc_max_leases, &ctl, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
}

static void require_shared() {
  if (shared == nullptr || lease_table == nullptr)
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("relaybus is not loaded through shared_preload_libraries"),
                    errhint("Add relaybus to shared_preload_libraries and restart the server.")));
}

static bool same_token(const LeaseToken& a, const LeaseToken& b) { return memcmp(a.data, b.data, UUID_LEN) == 0; }

static LeaseState state_of(const LeaseEntry* e, TimestampTz now, bool take_notified) {
  if (e == nullptr) return LeaseState::Free;
  // Being completed by an open transaction: held against every other
  // session until it ends; the transaction itself sees its completion done,
  // as after a commit (the row it deleted or updated says what comes next).
  if (e->completing_pid != 0) return e->completing_pid == MyProcPid ? LeaseState::Free : LeaseState::Held;
  if (e->until <= now) return LeaseState::Expired;
  if (take_notified && e->kind == LeaseKind::Notified) return LeaseState::Free;
  return LeaseState::Held;
}

void leases_lookup(const int64* ids, int n, TimestampTz now, bool take_notified, LeaseState* state) {
  require_shared();
  LWLockAcquire(shared->lease_lock, LW_SHARED);
  for (int i = 0; i < n; i++) {
    LeaseKey k = key_of(ids[i]);
    auto* e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_FIND, nullptr));
    state[i] = state_of(e, now, take_notified);
  }
  LWLockRelease(shared->lease_lock);
}

// Frees the slots of expired leases; called with the lock held exclusively when
// the table is full. (Their expiry is then not charged: the table was too small.)
static void purge_expired(TimestampTz now) {
  HASH_SEQ_STATUS seq;
  hash_seq_init(&seq, lease_table);
  LeaseEntry* e;
  while ((e = static_cast<LeaseEntry*>(hash_seq_search(&seq))) != nullptr) {
    if (e->until <= now && e->completing_pid == 0) hash_search(lease_table, &e->key, HASH_REMOVE, nullptr);
  }
}

int leases_acquire(const int64* ids, int n, int32 handler_id, LeaseKind kind, TimestampTz now, TimestampTz until,
                   bool take_notified, bool take_expired, bool* got, LeaseToken* tokens) {
  require_shared();
  // Receipts are drawn before taking the lock, one call for the batch.
  if (n > 0 && !pg_strong_random(tokens, sizeof(LeaseToken) * n))
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("could not generate a random lease token")));
  int taken = 0;
  bool purged = false;
  LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
  for (int i = 0; i < n; i++) {
    bool found = false;
    LeaseKey k = key_of(ids[i]);
    auto* e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_ENTER_NULL, &found));
    if (e == nullptr && !purged) {
      purge_expired(now);
      purged = true;
      e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_ENTER_NULL, &found));
    }
    LeaseState st = found ? state_of(e, now, take_notified) : LeaseState::Free;
    if (e == nullptr || st == LeaseState::Held || (st == LeaseState::Expired && !take_expired)) {
      got[i] = false;
      continue;
    }
    e->handler_id = handler_id;
    e->owner_pid = MyProcPid;
    e->until = until;
    e->token = tokens[i];
    e->completing_pid = 0;
    e->charging = false;
    e->kind = kind;
    got[i] = true;
    taken++;
  }
  LWLockRelease(shared->lease_lock);
  return taken;
}

void leases_release(const int64* ids, const LeaseToken* tokens, int n) {
  if (n == 0) return;
  require_shared();
  LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
  for (int i = 0; i < n; i++) {
    LeaseKey k = key_of(ids[i]);
    auto* e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_FIND, nullptr));
    if (e != nullptr && e->completing_pid == 0 && same_token(e->token, tokens[i]))
      hash_search(lease_table, &k, HASH_REMOVE, nullptr);
  }
  LWLockRelease(shared->lease_lock);
}

// Ids marked by the current transaction, with their token and the
// subtransaction level that marked them.
struct PendingMark {
  int64 id;
  LeaseToken token;
  int level;
};
static PendingMark* pending = nullptr;
static int pending_count = 0;
static int pending_cap = 0;

// Room for n more marks, made before taking the lock: nothing may fail while it is held.
static void reserve_marks(int n) {
  if (pending_cap - pending_count >= n) return;
  int cap = pending_cap == 0 ? 256 : pending_cap * 2;
  while (cap - pending_count < n) cap *= 2;
  pending =
      static_cast<PendingMark*>(pending == nullptr ? MemoryContextAlloc(TopMemoryContext, sizeof(PendingMark) * cap)
                                                   : repalloc(pending, sizeof(PendingMark) * cap));
  pending_cap = cap;
}

static void remember_mark(int64 id, const LeaseToken& token) {
  pending[pending_count++] = PendingMark{id, token, GetCurrentTransactionNestLevel()};
}

// The check of one completion, with the lock held exclusively.
static LeaseCheck check_holder(LeaseEntry* e, const LeaseToken* token, TimestampTz now) {
  if (e == nullptr) return LeaseCheck::NoLease;
  if (token != nullptr ? !same_token(e->token, *token) : e->owner_pid != MyProcPid)
    return token != nullptr ? LeaseCheck::OtherHolder : LeaseCheck::NotOwner;
  if (e->completing_pid == MyProcPid)  // this transaction completes it already, or charged its expiry
    return e->charging ? LeaseCheck::Expired : LeaseCheck::Held;
  if (e->completing_pid != 0) return LeaseCheck::OtherHolder;
  if (e->until <= now) return LeaseCheck::Expired;
  return LeaseCheck::Held;
}

int leases_begin_completion(const int64* ids, const LeaseToken* tokens, const bool* has_token, int n, TimestampTz now,
                            LeaseCheck* out) {
  if (n == 0) return 0;
  require_shared();
  reserve_marks(n);
  int held = 0;
  LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
  for (int i = 0; i < n; i++) {
    LeaseKey k = key_of(ids[i]);
    auto* e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_FIND, nullptr));
    bool with_token = tokens != nullptr && (has_token == nullptr || has_token[i]);
    out[i] = check_holder(e, with_token ? &tokens[i] : nullptr, now);
    if (out[i] != LeaseCheck::Held) continue;
    e->completing_pid = MyProcPid;
    e->charging = false;
    remember_mark(ids[i], e->token);
    held++;
  }
  LWLockRelease(shared->lease_lock);
  return held;
}

int leases_begin_charge(const int64* ids, int n, TimestampTz now, bool* marked) {
  if (n == 0) return 0;
  require_shared();
  reserve_marks(n);
  int count = 0;
  LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
  for (int i = 0; i < n; i++) {
    LeaseKey k = key_of(ids[i]);
    auto* e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_FIND, nullptr));
    marked[i] = e != nullptr && e->completing_pid == 0 && e->until <= now;
    if (!marked[i]) continue;
    e->completing_pid = MyProcPid;
    e->charging = true;
    remember_mark(ids[i], e->token);
    count++;
  }
  LWLockRelease(shared->lease_lock);
  return count;
}

LeaseCheck leases_extend(int64 id, const LeaseToken* token, TimestampTz now, TimestampTz until) {
  require_shared();
  LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
  LeaseKey k = key_of(id);
  auto* e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_FIND, nullptr));
  LeaseCheck c = check_holder(e, token, now);
  if (c == LeaseCheck::Held) e->until = until;
  LWLockRelease(shared->lease_lock);
  return c;
}

void report_lease_not_held(int64 id, LeaseCheck why, bool with_token) {
  const char* reason = "no lease";
  const char* detail = "Nobody holds it: it was never handed over, or it was completed, or the server restarted.";
  switch (why) {
    case LeaseCheck::Expired:
      reason = "it expired";
      detail = "The lease ran out; the next claimer counts that as a failed attempt and hands it over again.";
      break;
    case LeaseCheck::OtherHolder:
      reason = "another holder";
      detail = with_token ? "The lease token does not match the current lease (stale or forged), or another "
                            "transaction is completing it."
                          : "Another transaction is completing it.";
      break;
    case LeaseCheck::NotOwner:
      reason = "another holder";
      detail =
          "This session did not take the lease; without a token only the session that claimed a "
          "delivery can complete it.";
      break;
    default:
      break;
  }
  ereport(ERROR, (errcode(ERRCODE_LOCK_NOT_AVAILABLE),
                  errmsg("lease of delivery %lld is not held: %s", static_cast<long long>(id), reason),
                  errdetail("%s Nothing was changed.", detail),
                  with_token ? 0
                             : errhint("Pass the lease token that relay_claim returned or the NOTIFY "
                                       "message carried (\"lease\").")));
}

void lease_token_text(const LeaseToken& t, char out[37]) {
  static const char hex[] = "0123456789abcdef";
  int j = 0;
  for (int i = 0; i < UUID_LEN; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[j++] = '-';
    out[j++] = hex[t.data[i] >> 4];
    out[j++] = hex[t.data[i] & 0xf];
  }
  out[j] = '\0';
}

void leases_purge_database(Oid dboid) {
  if (shared == nullptr || lease_table == nullptr) return;
  LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
  HASH_SEQ_STATUS seq;
  hash_seq_init(&seq, lease_table);
  LeaseEntry* e;
  while ((e = static_cast<LeaseEntry*>(hash_seq_search(&seq))) != nullptr)
    if (e->key.database_id == dboid) hash_search(lease_table, &e->key, HASH_REMOVE, nullptr);
  LWLockRelease(shared->lease_lock);
}

int leases_count_handler(int32 handler_id, TimestampTz now) {
  require_shared();
  int n = 0;
  LWLockAcquire(shared->lease_lock, LW_SHARED);
  HASH_SEQ_STATUS seq;
  hash_seq_init(&seq, lease_table);
  LeaseEntry* e;
  while ((e = static_cast<LeaseEntry*>(hash_seq_search(&seq))) != nullptr)
    if (e->key.database_id == MyDatabaseId && e->handler_id == handler_id && (e->until > now || e->completing_pid != 0))
      n++;
  LWLockRelease(shared->lease_lock);
  return n;
}

int leases_copy(LeaseEntry* out, int max) {
  require_shared();
  int n = 0;
  LWLockAcquire(shared->lease_lock, LW_SHARED);
  HASH_SEQ_STATUS seq;
  hash_seq_init(&seq, lease_table);
  LeaseEntry* e;
  while ((e = static_cast<LeaseEntry*>(hash_seq_search(&seq))) != nullptr) {
    if (n >= max) {
      hash_seq_term(&seq);
      break;
    }
    if (e->key.database_id != MyDatabaseId) continue;
    out[n++] = *e;
  }
  LWLockRelease(shared->lease_lock);
  return n;
}

void leases_at_xact_end(bool commit) {
  if (pending_count == 0) return;
  if (lease_table != nullptr) {
    LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
    for (int i = 0; i < pending_count; i++) {
      LeaseKey k = key_of(pending[i].id);
      auto* e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_FIND, nullptr));
      if (e == nullptr || e->completing_pid != MyProcPid || !same_token(e->token, pending[i].token)) continue;
      if (commit)
        hash_search(lease_table, &k, HASH_REMOVE, nullptr);
      else
        e->completing_pid = 0;  // the lease lapses as it would have
    }
    LWLockRelease(shared->lease_lock);
  }
  pending_count = 0;
  if (pending_cap > 4096) {  // do not keep a huge buffer after one big ack
    pfree(pending);
    pending = nullptr;
    pending_cap = 0;
  }
}

void leases_at_subxact_commit(int nest_level) {
  for (int i = 0; i < pending_count; i++)
    if (pending[i].level >= nest_level) pending[i].level = nest_level - 1;
}

void leases_at_subxact_abort(int nest_level) {
  int first = 0;
  while (first < pending_count && pending[first].level < nest_level) first++;
  if (first == pending_count) return;
  // Clear the marks the aborted subtransaction made, unless an outer level
  // marked the same lease too (its mark stands). Aborted subtransactions
  // with marks are rare: a quadratic scan is fine.
  if (lease_table != nullptr) {
    LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
    for (int i = first; i < pending_count; i++) {
      if (pending[i].level < nest_level) continue;
      bool outer = false;
      for (int j = 0; j < pending_count && !outer; j++)
        outer = pending[j].level < nest_level && pending[j].id == pending[i].id &&
                same_token(pending[j].token, pending[i].token);
      if (outer) continue;
      LeaseKey k = key_of(pending[i].id);
      auto* e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_FIND, nullptr));
      if (e != nullptr && e->completing_pid == MyProcPid && same_token(e->token, pending[i].token))
        e->completing_pid = 0;
    }
    LWLockRelease(shared->lease_lock);
  }
  int kept = 0;
  for (int i = 0; i < pending_count; i++)
    if (pending[i].level < nest_level) pending[kept++] = pending[i];
  pending_count = kept;
}

}  // namespace relaybus::pg
