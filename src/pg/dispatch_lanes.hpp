// A dispatcher's share of its database's 64 lanes: leases in shared memory
// (workers->lanes), renewed every iteration, taken over from a dispatcher that
// stops renewing them, each with a token that grows with every change of
// owner, so that an iteration completes only while every lane it read is still
// its own (fencing).
#pragma once

#include "pg/claim.hpp"
#include "pg/dispatcher_state.hpp"

namespace relaybus::pg {

// Renews this dispatcher's lanes and takes or gives lanes to hold a fair share.
void balance_lanes(DispatcherState* st);
// Sets the lanes a claim of this dispatcher reads.
void claim_lanes(const DispatcherState* st, ClaimRequest* req);
// Whether every lane balance_lanes() last gave this dispatcher is still its own.
bool lanes_still_mine(const DispatcherState* st);
// Frees every lane this dispatcher holds (it exits), with workers->lock held.
void lanes_free_locked(const DispatcherState* st);

}  // namespace relaybus::pg
