#include "pg/worker_signals.hpp"

#include "pg/pg_includes.hpp"

extern "C" {
#include "postmaster/bgworker.h"
#include "storage/latch.h"
}

namespace relaybus::pg {

volatile sig_atomic_t got_sighup = false;
volatile sig_atomic_t got_sigterm = false;

static void on_sighup(SIGNAL_ARGS) {
    int save_errno = errno;
    got_sighup = true;
    SetLatch(MyLatch);
    errno = save_errno;
}

static void on_sigterm(SIGNAL_ARGS) {
    int save_errno = errno;
    got_sigterm = true;
    SetLatch(MyLatch);
    errno = save_errno;
}

void install_worker_signals() {
    pqsignal(SIGHUP, on_sighup);
    pqsignal(SIGTERM, on_sigterm);
    BackgroundWorkerUnblockSignals();
}

}  // namespace relaybus::pg
