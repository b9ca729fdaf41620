// Shared memory of relaybus: the catalog generation and the lease table.
#pragma once

#include "pg/pg_includes.hpp"

extern "C" {
#include "port/atomics.h"
}

namespace relaybus::pg {

struct SharedState {
  LWLock* lease_lock;                      // guards the lease table
  pg_atomic_uint64 catalog_generation;     // bumped when handlers or routes change
  pg_atomic_uint64 trace_context_ignored;  // malformed traceparent/tracestate values publishes dropped
};

extern SharedState* shared;

void request_shared_memory();  // from shmem_request_hook
void init_shared_memory();     // from shmem_startup_hook

}  // namespace relaybus::pg
