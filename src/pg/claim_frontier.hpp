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
// The same slot keeps the handler's settled floor (claim_floor.hpp): where a
// claim "from the head" starts. Its generation is bumped when rows may have
// appeared below it (frontier_forget) and when a claimer that noted it aborts.
#pragma once

#include "pg/claim_floor.hpp"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

constexpr int kFrontierMs = 250;

// A claim's view of its handler's frontier.
struct FrontierView {
    bool head;       // scan from the head, i.e. from floor[]: no valid frontier
    int64 from[4];   // per priority class: the first id worth reading
    uint64 gen;      // lowered since? (an advance from an older view is dropped)
    int64 floor[4];  // the settled floor (0: none)
    uint64 floor_gen;
};

Size claim_frontier_shmem_size();
void claim_frontier_shmem_init();

void frontier_read(int32 handler_id, TimestampTz now, FrontierView* out);
// After a claim leased its rows: every row of class p below upto[p] was taken
// or held. From a head view this sets the frontier (valid for kFrontierMs);
// from a frontier view it moves it forward. Dropped if it was lowered since.
void frontier_advance(int32 handler_id, const FrontierView& view, const int64 upto[4], TimestampTz now);
// Delivery id (any class) of the handler may be claimable again.
void frontier_lower(int32 handler_id, int64 id);
// Forgets the handler's frontier and floor (handler_id 0: every handler of this database).
void frontier_forget(int32 handler_id);
// After a scan from the floor (used): the floor's rule (claim_floor.hpp).
// Dropped if the floor was forgotten since view was read.
void frontier_note_floor(int32 handler_id, const FrontierView& view, const FloorView& used, const int64 first[4],
                         const int64 highest[4], TransactionId xmin);

}  // namespace relaybus::pg
