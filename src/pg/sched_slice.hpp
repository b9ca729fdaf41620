// A short CPU time slice for the dispatchers: a hint to the kernel's
// scheduler that they are latency-sensitive (see sched_slice.cpp).
#pragma once

namespace relaybus::pg {

// Asks for a time slice of slice_us microseconds for this process (0: the
// kernel's default). Returns false where the kernel does not support it;
// never fails otherwise.
bool request_time_slice(int slice_us);

}  // namespace relaybus::pg
