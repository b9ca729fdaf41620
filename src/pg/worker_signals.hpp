// Signal handling shared by the launcher and the dispatchers: SIGTERM asks for
// a clean exit, SIGHUP for a settings reload; both set the process latch.
#pragma once

#include <csignal>

namespace relaybus::pg {

extern volatile sig_atomic_t got_sighup;
extern volatile sig_atomic_t got_sigterm;

// Installs the handlers and unblocks signals (BackgroundWorkerUnblockSignals).
void install_worker_signals();

}  // namespace relaybus::pg
