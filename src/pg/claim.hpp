// Leasing ready deliveries: shared by relay_claim (pull consumers) and the
// dispatchers (notify handlers), so both follow one rule for order and leases.
#pragma once

#include "pg/leases.hpp"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// One claimed delivery, read out of the claim's fetch. Its memory lives in the
// caller's SPI scope: use it before spi_end().
struct ClaimedRow {
  int64 id;
  int64 event_id;
  char* topic;  // the route's wire name where it has one
  char* key;    // nullptr: unkeyed
  int64 seq;
  bool has_seq;
  Jsonb* payload;
  Jsonb* headers;  // nullptr: none
  int32 attempt;   // this attempt, 1 = the first
  int32 priority;
  TimestampTz published_at;
  LeaseToken token;  // the lease (receipt) this claim took
};

struct ClaimRequest {
  int32 handler_id;
  int max;
  int per_key;
  int64 lease_ms;
  const int16* lanes;  // nullptr: every lane
  int nlanes;
  LeaseKind kind;      // who the leases are for
  bool take_notified;  // relay_claim of an ack-mode notify handler: take over unacked NOTIFYs
  bool use_frontier;   // relay_claim of a pull handler: start at the claim frontier (claim_frontier.hpp)
  bool use_floor;      // a dispatcher: start at its claim floor (claim_floor.hpp)
  uint32 rescans;      // with use_floor: its slot's rescan count, read before the claim
};

struct ClaimResult {
  int n;
  ClaimedRow* rows;  // in hand-over order
  TimestampTz until;
  // Epoch ms of the earliest scanned delivery that was not ready yet (its
  // not_before: a retry's backoff, a delayed publish), 0 = none seen. The
  // dispatchers wake up then instead of at their next poll.
  int64 next_ready_ms;
};

// Within spi_begin()/spi_end(): leases up to max ready deliveries (see
// claim.cpp) and returns them. Scanned deliveries whose lease
// ran out without completion are charged a failed attempt first (in the
// caller's transaction) and are not handed over by this claim.
void claim_deliveries(const ClaimRequest* req, ClaimResult* out);

}  // namespace relaybus::pg
