// Where claims start reading a handler's backlog: the settled floor.
//
// Completed deliveries are deleted, and their index entries stay until VACUUM.
// A scan skips an entry cheaply only once it is marked dead, which needs its
// row to be dead to every snapshot. A transaction that holds an old snapshot
// (a report, pg_dump, a session idle in transaction) keeps them all alive: a
// claim that starts each priority class at its first entry read every
// delivery completed since that snapshot was taken (601 entries per claim
// after 1,200 events one at a time: test/integration/old_snapshot.sh).
//
// A floor per class: no delivery of the class with a smaller id is live in
// the claimer's lanes or can become live, so claims scan from there. A
// dispatcher keeps its floors in its own memory (below); relay_claim of a
// pull handler keeps one per handler in the claim frontier's shared table
// (claim_frontier.hpp), where it is where a scan "from the head" starts.
// It rises in two steps, because rows below the first one a scan returns may
// still be uncommitted:
//   1. a claim notes, per class, the first id its scan returned (none: one past
//      the highest returned since the floor was last reset) and the next
//      transaction id after the scan: a candidate;
//   2. a later claim whose snapshot's xmin has passed that transaction id
//      (every transaction that was running at the first scan has ended) raises
//      the floor to the smaller of the candidate and the first id its own scan
//      returned.
// This holds because a publisher has its transaction id before it draws
// delivery ids (delivery_writer_open): a row with an id below the candidate's
// was drawn earlier, by a transaction older than the noted id.
//
// Other paths put rows below a floor. relay_replay puts dead letters back with
// their old ids, and relay._recount_pending follows rows written by other
// means (pg_restore): after their commit the dispatchers' rescan counts are
// bumped (worker_state.hpp), and a claim that sees a new count starts from
// the head. For anything else (an operator's INSERT), once per
// relaybus.poll_interval a claim starts from the head anyway: such a row waits
// one poll interval at most. A change of the dispatcher's lanes starts from
// the head too, and so does every claim after the claimer's transaction
// aborted (its own deletes, which its claims did not see, are back).
//
// A transaction that has a transaction id and stays open (a long writer)
// holds back every snapshot's xmin: no candidate is taken up meanwhile, and
// claims scan from the last floor, as before this file.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// A claim's floor: from[p] is the first id of class p worth reading.
struct FloorView {
  bool head;  // from the head (from[] all 0)
  int64 from[4];
};

// The rule's state for one handler (plain data: it may live in shared memory).
struct FloorState {
  uint64 lanes;    // the lanes it is for (bit n = lane n)
  uint32 rescans;  // the rescan count it is for
  int64 floor[4];
  int64 highest[4];  // the highest id returned per class since the last reset (-1: none)
  bool pending;
  int64 candidate[4];
  TransactionId after;   // the candidate holds once xmin has passed this
  TimestampTz head_due;  // the next claim from the head, at the latest
};

void floor_state_init(FloorState* f);
// Before a scan: starts again from the head on a change of lanes or rescan
// count, or once per relaybus.poll_interval. No call that can fail or wait.
void floor_state_view(FloorState* f, uint64 lanes, uint32 rescans, TimestampTz now, FloorView* out);
// After a scan from `used`: first[p] the first id of class p it returned,
// highest[p] the highest (-1: none); xmin: of the scan's snapshot (or an older one);
// next_xid: the next transaction id, read after the scan. No call that can
// fail or wait.
void floor_state_note(FloorState* f, const FloorView& used, const int64 first[4], const int64 highest[4],
                      TransactionId xmin, TransactionId next_xid);
// Whether floor_state_note with this xmin will note a new candidate (and so
// needs next_xid): a caller that holds no lock can skip reading it.
bool floor_state_takes_candidate(const FloorState* f, TransactionId xmin);

// A dispatcher's floors, per handler, in its own memory; all forgotten when
// its transaction aborts.
void floor_read(int32 handler_id, uint64 lanes, uint32 rescans, TimestampTz now, FloorView* out);
void floor_note(int32 handler_id, const FloorView& used, const int64 first[4], const int64 highest[4],
                TransactionId xmin);

// The next transaction id (for floor_state_note).
TransactionId floor_next_xid();

}  // namespace relaybus::pg
