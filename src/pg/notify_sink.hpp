// The NOTIFY sink: how a dispatcher hands a notify handler's deliveries over,
// in its iteration's transaction (the same claim rule as relay_claim):
// pg_notify each delivery and delete the fire-and-forget ones, so that the
// notifications and the completion become visible together at commit. An
// ack-mode delivery, or one sent by reference, carries its lease and waits for
// relay_ack.
#pragma once

#include "pg/catalog_cache.hpp"
#include "pg/dispatcher_state.hpp"

namespace relaybus::pg {

// Within the iteration's SPI scope: hands one batch of h's deliveries over
// (st->policy.batch_max of them at most); returns how many.
int dispatch_notify(DispatcherState* st, const HandlerEntry* h);

}  // namespace relaybus::pg
