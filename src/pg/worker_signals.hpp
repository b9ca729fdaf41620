// Signal handling of the launcher and the dispatchers, after PostgreSQL's own
// conventions: SIGHUP is SignalHandlerForConfigReload (ConfigReloadPending),
// SIGTERM is die (ProcDiePending: the next CHECK_FOR_INTERRUPTS ends the
// process with FATAL, so it also interrupts a lock wait).
//
// A dispatcher adds one thing: a SIGTERM that arrives while it is outside any
// transaction (waiting for work or for HTTP responses) is a normal stop, which
// lets requests in flight finish and completes them (see drain_http_on_exit);
// inside a transaction it is die, and the transaction is rolled back.
#pragma once

#include <csignal>

namespace relaybus::pg {

// Set by a dispatcher's SIGTERM handler (both cases).
extern volatile sig_atomic_t got_sigterm;

// Installs the handlers and unblocks signals (BackgroundWorkerUnblockSignals).
void install_launcher_signals();
void install_dispatcher_signals();

}  // namespace relaybus::pg
