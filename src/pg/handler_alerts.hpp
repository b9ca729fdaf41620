// Server log lines for operators when a handler's deliveries start failing,
// its circuit breaker opens or closes, or a delivery is dead-lettered. The
// counting functions (worker_state.cpp) decide under the workers lock; the
// line is written after the lock is released. Rate limited per handler and
// kind of event (docs/operations.md).
#pragma once

#include "pg/worker_state.hpp"

namespace relaybus::pg {

constexpr int kAlertLogIntervalMs = 60000;  // at most one line per handler and kind per minute

enum AlertKind { kAlertStartedFailing = 0, kAlertBreakerOpened, kAlertBreakerClosed, kAlertDeadLettered, kAlertKinds };

// What one counting call has to say, filled under the lock.
struct PendingAlert {
  AlertKind kind = kAlertKinds;  // kAlertKinds: nothing
  uint32 suppressed = 0;         // events of this kind not logged since the last line
  int status = -1;               // http: the status (0 = no response), -1 = not http
  TimestampTz until = 0;         // breaker opened: until when
};

// Under workers->lock: whether an event of `kind` is logged now; if not, it is
// counted as suppressed. Fills *out when it is.
void alert_event(HandlerCounters* c, AlertKind kind, int status, TimestampTz until, PendingAlert* out);

// After the lock: writes the line (LOG level) if *a holds one.
void alert_log(Oid dboid, int32 handler_id, const PendingAlert& a);

}  // namespace relaybus::pg
