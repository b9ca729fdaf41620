// Where relay_claim starts reading a pull handler's backlog.
//
// Consumers of one handler all used to scan from the oldest row. With several
// of them, the oldest rows are the ones the others hold (in flight), and the
// index entries of the rows acked a moment ago are still there: each claim
// read 6-7 rows per row it took, and many found rows whose ack committed
// after their snapshot (empty claims). The frontier remembers, per class, an
// id below which every row was taken or held when a claim last looked, so a
// claim of a busy handler starts there.
//
// It is only a hint: correctness never depends on it (the fetch after leasing
// is the fence). Rows can appear below it (a publisher that commits late, a
// lease that expires, a retry, a replay); they are found because
//   - a nack, a lease given back or a replay lowers it (frontier_lower/_forget),
//   - it is valid for kFrontierMs after the claim that scanned from the head
//     set it; then the next claim scans from the head again (one claim: the
//     others use the old frontier until it is renewed, or for kFrontierMs),
//   - a claim from the frontier that finds nothing more ahead of it scans from
//     the head too, so only a claim with a backlog ahead skips what is behind.
//
// A held row below it still blocks its key, and a scan from the frontier does
// not see it: the follower it reads would look like the key's head, and the
// fence would drop it (a claim of max 1 came back empty while other keys'
// deliveries were ready). So the slot also keeps hashes of the keys that may
// have a delivery below the frontier ahead of one above it: a key is added
// when a claim moves the frontier past a row of it that was taken or held
// while a later row of the key was in its scan, and when the fence drops a
// row of a frontier claim that is still there. A scan from the frontier reads
// the first rows of those keys (one index descent per key) and plans with
// them. The frontier does not pass a held row whose key no longer fits; a
// stale entry costs a descent until the next claim from the head, which
// replaces the set with what it saw.
//
// The same slot keeps the handler's settled floor (claim_floor.hpp): where a
// claim "from the head" starts. Its generation is bumped when rows may have
// appeared below it (frontier_forget) and when a claimer that noted it aborts.
#pragma once

#include "pg/claim_floor.hpp"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

constexpr int kFrontierMs = 250;
constexpr int kFrontierKeys = 32;

// A claim's view of its handler's frontier.
struct FrontierView {
  bool head;       // scan from the head, i.e. from floor[]: no valid frontier
  int64 from[4];   // per priority class: the first id worth reading
  uint64 gen;      // lowered since? (an advance from an older view is dropped)
  int64 floor[4];  // the settled floor (0: none)
  uint64 floor_gen;
  int nkeys;  // keys that may be blocked below from[] (frontier_key_hash)
  uint64 keys[kFrontierKeys];
};

// A taken or held keyed row that a claim's advance may move the frontier
// past, while a later row of its key was in the claim's scan.
struct FrontierPassed {
  int64 id;
  int priority;  // class 0..3
  uint64 key_hash;
};

Size claim_frontier_shmem_size();
void claim_frontier_shmem_init();

void frontier_read(int32 handler_id, TimestampTz now, FrontierView* out);
uint64 frontier_key_hash(const char* key);
bool frontier_view_has_key(const FrontierView& view, uint64 key_hash);

// After a claim leased its rows: every row of class p below upto[p] was taken
// or held; passed[] (ascending id) are the keyed ones among them whose key
// has a later row. From a head view this sets the frontier (valid for
// kFrontierMs) and its keys; from a frontier view it moves it forward and
// adds the keys. Dropped if it was lowered since.
void frontier_advance(int32 handler_id, const FrontierView& view, const int64 upto[4], const FrontierPassed* passed,
                      int npassed, TimestampTz now);
// The fence dropped a row of this key that is still there: an earlier row of
// the key may be below the frontier.
void frontier_note_key(int32 handler_id, uint64 key_hash);
// Delivery id (any class) of the handler may be claimable again.
void frontier_lower(int32 handler_id, int64 id);
// Forgets the handler's frontier and floor (handler_id 0: every handler of this database).
void frontier_forget(int32 handler_id);
// After a scan from the floor (used): the floor's rule (claim_floor.hpp).
// Dropped if the floor was forgotten since view was read.
void frontier_note_floor(int32 handler_id, const FrontierView& view, const FloorView& used, const int64 first[4],
                         const int64 highest[4], TransactionId xmin);

}  // namespace relaybus::pg
