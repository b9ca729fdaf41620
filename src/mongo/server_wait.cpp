#include "mongo/server_wait.hpp"

#include <algorithm>

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

int64_t server_wait_backoff_ms(int failures) {
  int64_t ms = 250;
  for (int i = 1; i < failures && ms < 30000; i++) ms *= 2;
  return std::min<int64_t>(ms, 30000);
}

// Dispatcher::wait_for_server: false when a SIGTERM/SIGINT came first.
bool Dispatcher::wait_for_server() {
  for (int failures = 0;;) {
    {
      ServerProbe probe(cfg_.uri, cfg_.database);
      while (!probe.done()) wait(50);  // /healthz, /metrics and signals meanwhile
      if (probe.ok()) {
        if (failures > 0) log_info("MongoDB server reachable", {{"failed_probes", failures}});
        return !stopping_;
      }
      failures++;
      const int64_t backoff = server_wait_backoff_ms(failures);
      metrics_.store_errors++;
      log_warn("MongoDB server not reachable; waiting",
               {{"error", probe.error()}, {"attempt", failures}, {"retry_in_ms", backoff}});
      const int64_t until = monotonic_ms() + backoff;
      while (!stopping_ && monotonic_ms() < until) wait(std::min<int64_t>(100, until - monotonic_ms()));
    }
    if (stopping_) return false;
  }
}

}  // namespace relaybus::mongo
