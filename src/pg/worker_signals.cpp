#include "pg/worker_signals.hpp"

#include "pg/pg_compat.hpp"
#include "pg/pg_includes.hpp"

extern "C" {
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
}

namespace relaybus::pg {

volatile sig_atomic_t got_sigterm = false;

static void dispatcher_sigterm(SIGNAL_ARGS) {
  int save_errno = errno;
  got_sigterm = true;
  // IsTransactionState() only reads the current transaction's state.
  if (IsTransactionState())
    RELAYBUS_FORWARD_SIGNAL(die);
  else
    SetLatch(MyLatch);
  errno = save_errno;
}

void install_launcher_signals() {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
}

void install_dispatcher_signals() {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, dispatcher_sigterm);
  BackgroundWorkerUnblockSignals();
}

}  // namespace relaybus::pg
