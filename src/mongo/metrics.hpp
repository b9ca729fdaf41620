// Counters of one relaybus-mongo process and a tiny HTTP server on loopback
// for them: GET /metrics (Prometheus text format 0.0.4) and GET /healthz (200
// "ok" while the store answered recently, else 503). The server runs on its
// own thread, from what the dispatcher's loop last published, so that a store
// command in progress (seconds on a loaded FerretDB) never holds them up.
#pragma once

#include <atomic>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/prometheus.hpp"

namespace relaybus::mongo {

struct Metrics {
  struct PerHandler {
    uint64_t delivered = 0;
    uint64_t retried = 0;
    uint64_t dead = 0;
    uint64_t dropped = 0;            // results not completed because the lane's lease was lost
    core::LatencyHistogram latency;  // publish -> completion
  };
  std::map<std::string, PerHandler> handlers;
  std::map<std::string, uint64_t> held_back;  // deliveries that waited for a max_concurrency or rate permit
  std::map<std::string, bool> limited;        // one waited within the last second
  std::map<std::string, bool> breaker_open;
  uint64_t fetches = 0;
  uint64_t lanes_taken = 0;
  uint64_t lanes_released = 0;
  uint64_t lanes_lost = 0;
  uint64_t store_errors = 0;
  uint64_t trace_context_ignored = 0;  // the sequencer's (Sequencer::trace_context_ignored)
  uint64_t spans_exported = 0;         // otlp_endpoint (core::SpanExporter)
  uint64_t spans_dropped = 0;
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

  void observe_latency(const std::string& handler, double seconds) { handlers[handler].latency.observe(seconds); }
  std::string render() const;
};

// What the loop last published for the server thread: a copy of the
// counters (commands pointing at this snapshot's own copy) and the /healthz rule.
struct MetricsSnapshot {
  Metrics metrics;
  std::map<std::string, uint64_t> commands;
  // /healthz is 200 while wall time - metrics.last_store_ok_ms is below this.
  int64_t healthy_within_ms = 0;
};

// The thread owns the listening socket and every connection; it never calls
// the store. Requests under /v1/ (the pull API, which calls the store) are
// handed to the loop: queued, with a wakeup on api_fd(), answered by
// serve_api() on the loop's thread and written back by the server thread.
class MetricsServer {
 public:
  MetricsServer() = default;
  ~MetricsServer();  // stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  // "127.0.0.1:9464"; port 0 picks a free one. bound() is the actual address.
  // Binds and starts the thread.
  bool start(const std::string& address, std::string* why);
  std::string bound() const { return bound_; }
  // Ends and joins the thread and closes every socket; an API request still
  // waiting for the loop gets 503. Idempotent.
  void stop();

  // Loop side. publish: the counters and the /healthz rule as of now (a copy;
  // cheap enough for before every store command).
  void publish(const Metrics& m, int64_t healthy_within_ms);
  // Requests under /v1/ go to this (method, path, Authorization header value,
  // body) -> (status, JSON body): the pull API (pull_api.hpp).
  using ApiHandler = std::function<std::pair<int, std::string>(const std::string&, const std::string&,
                                                               const std::string&, const std::string&)>;
  void set_api(ApiHandler api);
  // Readable while API requests wait for serve_api (-1 before start): in the
  // loop's poll set, except between two store commands, where the API (which
  // calls the store) must not run.
  int api_fd() const { return api_fd_; }
  // Answers every waiting API request with the ApiHandler, on the caller's thread.
  void serve_api();

 private:
  struct Conn {
    int fd;
    uint64_t id;
    std::string in;
    std::string out;
    size_t sent = 0;
    int64_t opened_ms;
    bool waiting = false;  // its API request is with the loop
  };
  struct ApiRequest {
    uint64_t conn;
    std::string method, path, authorization, body;
  };
  void run();             // the thread
  void respond(Conn& c);  // the thread: /metrics, /healthz, or hand /v1/ to the loop
  void wake(int fd);
  void close_conns();  // the thread, when it ends

  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the thread's wakeup (answers, stop)
  int api_fd_ = -1;   // eventfd: the loop's wakeup (requests)
  std::string bound_;
  std::thread thread_;
  std::vector<Conn> conns_;  // the thread's only
  uint64_t next_conn_ = 1;
  ApiHandler api_;  // the loop's only
  std::atomic<bool> api_on_{false};

  std::mutex mu_;  // guards the members below
  std::shared_ptr<const MetricsSnapshot> snapshot_;
  std::deque<ApiRequest> requests_;
  std::vector<std::pair<uint64_t, std::string>> answers_;  // conn id -> HTTP response
  bool stop_ = false;
};

}  // namespace relaybus::mongo
