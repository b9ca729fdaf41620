// Delivery leases in shared memory.
//
// A lease says "this delivery is being handled until T, by the holder of this
// token". Claiming writes no row: the lease lives here, so a crash or restart
// simply forgets it and the delivery is claimable again, which is the one way a
// duplicate can happen.
//
// Every hand-over (relay_claim, an ack-mode or by-reference NOTIFY, an HTTP
// request) creates a lease with a fresh 128-bit token (a receipt, like an SQS
// receipt handle). Completing is compare-and-mark on (delivery, token): the
// lease must exist, be unexpired and carry that token; it is then marked as
// being completed by this backend's transaction, which a claimer treats as
// held however late it gets, and it is removed when that transaction commits
// (at abort the mark goes and the lease lapses as it would have).
#pragma once

#include "pg/pg_includes.hpp"

extern "C" {
#include "utils/uuid.h"
}

namespace relaybus::pg {

using LeaseToken = pg_uuid_t;

// Who took a lease: a consumer's relay_claim, a dispatcher's NOTIFY awaiting
// relay_ack (relay_claim of the handler may take it over), or a dispatcher
// delivering itself (fire-mode NOTIFY, HTTP).
enum class LeaseKind : uint8 { Claim = 0, Notified = 1, Dispatcher = 2 };

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
  LeaseToken token;
  int32 completing_pid;  // 0, or the backend whose open transaction completes it
  bool charging;         // ... by charging its expiry (then the holder's token no longer completes)
  LeaseKind kind;
};

// A scanned delivery's lease, as a claimer sees it.
enum class LeaseState : uint8 {
  Free,     // no lease (or, for a take-over, a dispatcher's NOTIFY awaiting its ack)
  Held,     // unexpired, or being completed by an open transaction
  Expired,  // ran out without completion: the next claimer charges an attempt
};

// Why a completion was refused (Held = accepted).
enum class LeaseCheck : uint8 { Held, NoLease, Expired, OtherHolder, NotOwner };

Size leases_shmem_size();
void leases_shmem_init();

// All functions work on deliveries of the current database.
// take_notified: Notified leases count as Free (relay_claim of an ack-mode notify handler).
void leases_lookup(const int64* ids, int n, TimestampTz now, bool take_notified, LeaseState* state);
// Takes the leases that are free; got[i] tells which, tokens[i] is the new
// receipt. take_notified as above; take_expired also takes expired ones without
// a charge (only when the charge cannot be written: a read-only transaction).
// Returns how many.
int leases_acquire(const int64* ids, int n, int32 handler_id, LeaseKind kind, TimestampTz now, TimestampTz until,
                   bool take_notified, bool take_expired, bool* got, LeaseToken* tokens);
// Gives back leases this holder did not use: compare-and-release on the token.
void leases_release(const int64* ids, const LeaseToken* tokens, int n);

// Completion: checks (ids[i], tokens[i]) (has_token[i] false, or has_token
// nullptr: the id-only form, accepted only for a lease this backend took) and
// marks the held ones as completed by the current transaction. out[i] says
// why not. Returns how many were accepted.
int leases_begin_completion(const int64* ids, const LeaseToken* tokens, const bool* has_token, int n, TimestampTz now,
                            LeaseCheck* out);
// Marks the expired, unmarked leases among ids as being charged by the current
// transaction (once per expiry: a concurrent claimer then sees them held);
// marked[i] tells which. Returns how many.
int leases_begin_charge(const int64* ids, int n, TimestampTz now, bool* marked);
// Lengthens a held lease to until (the same checks as a completion).
LeaseCheck leases_extend(int64 id, const LeaseToken* token, TimestampTz now, TimestampTz until);
// ereport(ERROR) 55P03 for a refused completion of delivery id.
void report_lease_not_held(int64 id, LeaseCheck why, bool with_token);

// Unexpired leases of a handler of this database (for the in-flight cap).
int leases_count_handler(int32 handler_id, TimestampTz now);
// Forgets every lease of a database (its extension was created again).
void leases_purge_database(Oid dboid);
// Copies up to max entries of the current database (for the relay._leases() view); returns how many.
int leases_copy(LeaseEntry* out, int max);
// The token as uuid text (36 characters and a NUL).
void lease_token_text(const LeaseToken& t, char out[37]);

// Marks made by leases_begin_completion/_charge end with the transaction:
// removed at commit, cleared at abort (also of the subtransaction that made them).
void leases_at_xact_end(bool commit);
void leases_at_subxact_commit(int nest_level);
void leases_at_subxact_abort(int nest_level);

}  // namespace relaybus::pg
