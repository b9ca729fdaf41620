#include "pg/leases.hpp"

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

Size leases_shmem_size() {
    return hash_estimate_size(guc_max_leases, sizeof(LeaseEntry));
}

void leases_shmem_init() {
    HASHCTL ctl;
    memset(&ctl, 0, sizeof(ctl));
    ctl.keysize = sizeof(LeaseKey);
    ctl.entrysize = sizeof(LeaseEntry);
    lease_table = ShmemInitHash("relaybus leases", guc_max_leases, guc_max_leases, &ctl,
                                HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
}

static void require_shared() {
    if (shared == nullptr || lease_table == nullptr)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("relaybus is not loaded through shared_preload_libraries"),
                        errhint("Add relaybus to shared_preload_libraries and restart the server.")));
}

void leases_lookup(const int64* ids, int n, TimestampTz now, bool* leased) {
    require_shared();
    LWLockAcquire(shared->lease_lock, LW_SHARED);
    for (int i = 0; i < n; i++) {
        LeaseKey k = key_of(ids[i]);
        auto* e = static_cast<LeaseEntry*>(hash_search(lease_table, &k, HASH_FIND, nullptr));
        leased[i] = e != nullptr && e->until > now;
    }
    LWLockRelease(shared->lease_lock);
}

// Frees the slots of expired leases; called with the lock held exclusively when the table is full.
static void purge_expired(TimestampTz now) {
    HASH_SEQ_STATUS seq;
    hash_seq_init(&seq, lease_table);
    LeaseEntry* e;
    while ((e = static_cast<LeaseEntry*>(hash_seq_search(&seq))) != nullptr) {
        if (e->until <= now) hash_search(lease_table, &e->key, HASH_REMOVE, nullptr);
    }
}

int leases_acquire(const int64* ids, int n, int32 handler_id, TimestampTz now, TimestampTz until,
                   bool* got) {
    require_shared();
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
        if (e == nullptr || (found && e->until > now)) {
            got[i] = false;
            continue;
        }
        e->handler_id = handler_id;
        e->owner_pid = MyProcPid;
        e->until = until;
        got[i] = true;
        taken++;
    }
    LWLockRelease(shared->lease_lock);
    return taken;
}

void leases_release(const int64* ids, int n) {
    if (n == 0) return;
    require_shared();
    LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
    for (int i = 0; i < n; i++) {
        LeaseKey k = key_of(ids[i]);
        hash_search(lease_table, &k, HASH_REMOVE, nullptr);
    }
    LWLockRelease(shared->lease_lock);
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
        if (e->key.database_id == MyDatabaseId && e->handler_id == handler_id && e->until > now) n++;
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

// Ids completed by the current transaction, with the subtransaction level that did it.
struct PendingRelease {
    int64 id;
    int level;
};
static PendingRelease* pending = nullptr;
static int pending_count = 0;
static int pending_cap = 0;

void leases_release_at_commit(int64 id) {
    if (pending_count == pending_cap) {
        int cap = pending_cap == 0 ? 256 : pending_cap * 2;
        pending = static_cast<PendingRelease*>(
            pending == nullptr ? MemoryContextAlloc(TopMemoryContext, sizeof(PendingRelease) * cap)
                               : repalloc(pending, sizeof(PendingRelease) * cap));
        pending_cap = cap;
    }
    pending[pending_count++] = PendingRelease{id, GetCurrentTransactionNestLevel()};
}

void leases_at_xact_end(bool commit) {
    if (pending_count == 0) return;
    if (commit && lease_table != nullptr) {
        LWLockAcquire(shared->lease_lock, LW_EXCLUSIVE);
        for (int i = 0; i < pending_count; i++) {
            LeaseKey k = key_of(pending[i].id);
            hash_search(lease_table, &k, HASH_REMOVE, nullptr);
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
    int kept = 0;
    for (int i = 0; i < pending_count; i++)
        if (pending[i].level < nest_level) pending[kept++] = pending[i];
    pending_count = kept;
}

}  // namespace relaybus::pg
