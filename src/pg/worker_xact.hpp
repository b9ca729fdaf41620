// Transactions of the background workers.
//
// CommitTransactionCommand() and AbortCurrentTransaction() leave
// TopMemoryContext current. Whatever a worker allocated after them without
// switching back lived until the process exited: a dispatcher with an http
// handler grew by ~30 kB/s that way (issue 15). worker_xact_commit() ends a
// worker transaction in the worker's loop context, which the loop resets;
// worker_step() (boundary.hpp) does the same after an abort.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// The context the worker's loop resets after every pass; set once at start.
void worker_xact_set_loop_context(MemoryContext cxt);
MemoryContext worker_loop_context();

// Starts a transaction with a snapshot, as every worker pass does.
void worker_xact_begin();
// Commits it (reporting the pass's table statistics, or autovacuum never sees
// a worker's deletes) and returns to the loop context.
void worker_xact_commit();

}  // namespace relaybus::pg
