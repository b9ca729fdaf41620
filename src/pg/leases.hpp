// Delivery leases in shared memory.
//
// A lease says "this delivery is being handled until T". Claiming writes no row:
// the lease lives here, so a crash or restart simply forgets it and the delivery
// is claimable again, which is the one way a duplicate can happen.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// Delivery ids come from a per-database sequence, so a lease is keyed by the
// database too: the table is shared by every database of the cluster.
struct LeaseKey {
    int64 delivery_id;
    Oid database_id;
    uint32 pad;  // always 0: the key is hashed and compared as bytes
};

struct LeaseEntry {
    LeaseKey key;  // hash key
    int32 handler_id;
    int32 owner_pid;
    TimestampTz until;
};

Size leases_shmem_size();
void leases_shmem_init();

// All functions work on deliveries of the current database.
// leased[i] = ids[i] holds an unexpired lease at now.
void leases_lookup(const int64* ids, int n, TimestampTz now, bool* leased);
// Takes the leases that are free (absent or expired); got[i] tells which. Returns how many.
int leases_acquire(const int64* ids, int n, int32 handler_id, TimestampTz now, TimestampTz until,
                   bool* got);
void leases_release(const int64* ids, int n);
// Unexpired leases of a handler of this database (for the in-flight cap).
int leases_count_handler(int32 handler_id, TimestampTz now);
// Forgets every lease of a database (its extension was created again).
void leases_purge_database(Oid dboid);
// Copies up to max entries of the current database (for the relay._leases() view); returns how many.
int leases_copy(LeaseEntry* out, int max);

// Completion of a delivery (ack, nack, dead letter) releases its lease only when
// the completing transaction commits; a rollback keeps it.
void leases_release_at_commit(int64 id);
void leases_at_xact_end(bool commit);
void leases_at_subxact_commit(int nest_level);
void leases_at_subxact_abort(int nest_level);

}  // namespace relaybus::pg
