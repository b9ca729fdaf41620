// Counters of one relaybus-mongo process and a tiny non-blocking HTTP server
// on loopback for them: GET /metrics (Prometheus text format 0.0.4) and
// GET /healthz (200 "ok" while the store answered recently, else 503).
// The server is driven by the dispatcher's poll loop; it never blocks.
#pragma once

#include <poll.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace relaybus::mongo {

struct Metrics {
  struct PerHandler {
    uint64_t delivered = 0;
    uint64_t retried = 0;
    uint64_t dead = 0;
    uint64_t dropped = 0;  // results not completed because the lane's lease was lost
    std::array<uint64_t, 16> latency_buckets{};  // publish -> completion
    double latency_sum_s = 0;
  };
  std::map<std::string, PerHandler> handlers;
  std::map<std::string, bool> breaker_open;
  uint64_t fetches = 0;
  uint64_t lanes_taken = 0;
  uint64_t lanes_released = 0;
  uint64_t lanes_lost = 0;
  uint64_t store_errors = 0;
  int lanes_held = 0;
  int in_flight = 0;
  int64_t last_store_ok_ms = 0;
  int64_t started_ms = 0;
  const std::map<std::string, uint64_t>* commands = nullptr;  // the store's, by operation
  // The PostgreSQL views' counts per handler, refreshed every max(10 s, lease)
  // by the dispatcher (counting rows costs the server); in_flight is live.
  struct Backlog {
    int64_t pending = 0, ready = 0, delayed = 0, retrying = 0, dead = 0;
    double oldest_age_s = 0;
  };
  std::map<std::string, Backlog> backlog;
  std::map<std::string, int64_t> handler_in_flight;  // HTTP requests or pull leases

  static const std::array<double, 16> kBucketsS;
  void observe_latency(const std::string& handler, double seconds);
  std::string render() const;
};

class MetricsServer {
 public:
  MetricsServer() = default;
  ~MetricsServer();
  // "127.0.0.1:9464"; port 0 picks a free one. bound() is the actual address.
  bool start(const std::string& address, std::string* why);
  std::string bound() const { return bound_; }
  // Adds its descriptors to the poll set; returns how many it added.
  void add_fds(std::vector<pollfd>* fds) const;
  // After poll: serve what is ready. healthy() decides /healthz.
  void on_ready(const std::vector<pollfd>& fds, const Metrics& m, const std::function<bool()>& healthy);
  // Requests under /v1/ go to this (method, path, Authorization header value,
  // body) -> (status, JSON body): the pull API (pull_api.hpp).
  using ApiHandler = std::function<std::pair<int, std::string>(const std::string&, const std::string&,
                                                               const std::string&, const std::string&)>;
  void set_api(ApiHandler api) { api_ = std::move(api); }
  // While paused, API requests wait (buffered) and /metrics and /healthz
  // are still answered: on_ready is then called between two store commands,
  // where the API (which calls the store) must not run.
  void pause_api(bool paused) { api_paused_ = paused; }

 private:
  struct Conn {
    int fd;
    std::string in;
    std::string out;
    size_t sent = 0;
    int64_t opened_ms;
  };
  void respond(Conn& c, const Metrics& m, const std::function<bool()>& healthy);
  int listen_fd_ = -1;
  std::string bound_;
  std::vector<Conn> conns_;
  ApiHandler api_;
  bool api_paused_ = false;
};

}  // namespace relaybus::mongo
