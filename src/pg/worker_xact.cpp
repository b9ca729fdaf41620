#include "pg/worker_xact.hpp"

extern "C" {
#include "pgstat.h"
}

namespace relaybus::pg {

static MemoryContext loop_context = nullptr;

void worker_xact_set_loop_context(MemoryContext cxt) { loop_context = cxt; }

MemoryContext worker_loop_context() { return loop_context != nullptr ? loop_context : TopMemoryContext; }

void worker_xact_begin() {
  SetCurrentStatementStartTimestamp();
  StartTransactionCommand();
  PushActiveSnapshot(GetTransactionSnapshot());
}

void worker_xact_commit() {
  PopActiveSnapshot();
  CommitTransactionCommand();
  pgstat_report_stat(false);
  MemoryContextSwitchTo(worker_loop_context());
}

}  // namespace relaybus::pg
