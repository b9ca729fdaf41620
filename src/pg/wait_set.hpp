// A dispatcher's one wait: its latch (publishers set it when they commit),
// postmaster death, the HTTP engine's sockets or its ready_fd, the Kafka
// producers' fd, and the engine's and the circuit breakers' timers.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// Waits up to timeout_ms and lets the engine work. True if the latch was set
// or the timeout passed; false if only sockets or the engine's own timer had
// activity.
bool wait_for_work(long timeout_ms);
// Frees the wait set kept across waits (the dispatcher exits).
void wait_set_close();

}  // namespace relaybus::pg
