#include "mongo/server_wait.hpp"

#include <algorithm>

#include "core/store_policy.hpp"

#include "mongo/dispatcher.hpp"
#include "mongo/store.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

ServerProbe::ServerProbe(const std::string& uri, const std::string& database) {
  thread_ = std::thread([this, uri, database] {
    try {
      Store probe(uri, database);
      probe.ping();
      ok_ = true;
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    done_.store(true, std::memory_order_release);
  });
}

ServerProbe::~ServerProbe() {
  if (thread_.joinable()) thread_.join();
}

// Dispatcher::wait_for_server: false when a SIGTERM/SIGINT came first.
bool Dispatcher::wait_for_server() {
  auto pause = [this](int64_t ms) {  // /healthz, /metrics and signals meanwhile
    wait(ms);
    interrupts();
    reload();
  };
  for (int failures = 0;;) {
    {
      ServerProbe probe(cfg_.uri, cfg_.database);
      while (!probe.done()) pause(50);
      if (probe.ok()) {
        if (failures > 0) log_info("MongoDB server reachable", {{"failed_probes", failures}});
        return !loop_.stopping;
      }
      failures++;
      const int64_t backoff = core::reconnect_backoff_ms(failures);
      metrics_.store_errors++;
      log_warn("MongoDB server not reachable; waiting",
               {{"error", probe.error()}, {"attempt", failures}, {"retry_in_ms", backoff}});
      const int64_t until = monotonic_ms() + backoff;
      while (!loop_.stopping && monotonic_ms() < until) pause(std::min<int64_t>(100, until - monotonic_ms()));
    }
    if (loop_.stopping) return false;
  }
}

}  // namespace relaybus::mongo
