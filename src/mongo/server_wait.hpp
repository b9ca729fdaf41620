// `run` when the MongoDB server is not reachable yet: instead of exiting, the
// dispatcher probes it with backoff (core::reconnect_backoff_ms: 250 ms
// doubling up to 30 s, one log line per failed probe) while its poll loop
// keeps serving /healthz (503 until connected), /metrics and signals. A probe runs in a helper thread with its
// own client (a mongoc client is not shared between threads), because a ping
// blocks for up to the URI's serverSelectionTimeoutMS.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace relaybus::mongo {

class ServerProbe {
 public:
  ServerProbe(const std::string& uri, const std::string& database);
  ~ServerProbe();  // joins (bounded by the server selection timeout)
  ServerProbe(const ServerProbe&) = delete;
  ServerProbe& operator=(const ServerProbe&) = delete;
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Valid once done().
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }

 private:
  std::atomic<bool> done_{false};
  bool ok_ = false;
  std::string error_;
  std::thread thread_;
};

}  // namespace relaybus::mongo
