// The pending count per handler (relay.handler_metrics.pending) without a
// count(*) per scrape: counted once under a lock that excludes every writer of
// relay.deliveries, then kept by the writers (worker_state.cpp): publishes add
// at commit, every settled delivery (settle.hpp) subtracts at commit.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// From a dispatcher's iteration (in its transaction, with the extension's oid):
// counts the database once per installation, when no transaction writes
// relay.deliveries (a conditional lock: it never waits, nor makes others wait).
void ensure_pending_counted(Oid extension);

}  // namespace relaybus::pg
