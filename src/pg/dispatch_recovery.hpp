// What a dispatcher does with an ERROR that aborted its iteration: charge it
// to its cause (core/error_class.hpp) as core::DispatchPolicy decides.
#pragma once

#include "pg/dispatcher_state.hpp"

namespace relaybus::pg {

// After worker_step() caught ed (in cxt; freed here): logs and counts it,
// gives the iteration's leases back, or nacks the delivery that failed alone
// in a transaction of its own.
void after_error(DispatcherState* st, MemoryContext cxt, ErrorData* ed);

}  // namespace relaybus::pg
