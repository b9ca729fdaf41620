#pragma once

// relaybus-agent's counters and a small HTTP server for them: GET /metrics
// (Prometheus text format 0.0.4) and GET /healthz (200 "ok" while connected,
// else 503). The server has its own thread, so that a scrape never waits for
// a statement of the loop; the loop updates the counters under the mutex.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "core/prometheus.hpp"

namespace relaybus::agent {

class Metrics {
 public:
  struct PerHandler {
    uint64_t delivered = 0;            // http, kafka: settled as delivered
    uint64_t retried = 0;              // a failed attempt, retried later (notify: a poison delivery)
    uint64_t dead = 0;                 // moved to the dead letters (notify: a poison delivery)
    uint64_t stale = 0;                // http, kafka: a result refused, the lease no longer held
    uint64_t sends = 0;                // http, kafka: attempts that reached the sink and ended
    uint64_t delivered_after_gap = 0;  // kafka: acknowledged after an earlier message of its key failed for good
    uint64_t notified = 0;             // notify: NOTIFYs sent
    uint64_t in_flight = 0;            // http, kafka: requests or messages at the sink now
    uint64_t held_back = 0;            // deliveries that waited for a max_concurrency or rate permit
    uint64_t limit_slots = 0;          // max_concurrency slots this agent holds
    uint64_t limit_agents = 0;         // agents sharing the handler's limits (0: this one is not among them)
    // http: attempts by the class of their status (1..5: 1xx..5xx; 0: no
    // response), counted as the extension's workers count them.
    uint64_t http_status[6] = {};
    bool breaker_open = false;
    core::LatencyHistogram latency;  // http, kafka: publish -> settled as delivered
    bool limited = false;            // a delivery waited for a permit within the last second
  };

  std::mutex mu;
  std::map<std::string, PerHandler> handlers;
  bool connected = false;
  uint64_t connect_failures = 0;
  uint64_t connections_lost = 0;
  uint64_t statement_errors = 0;
  uint64_t in_flight = 0;
  uint64_t spans_exported = 0;  // --otlp-endpoint (core::SpanExporter)
  uint64_t spans_dropped = 0;
  std::string last_error;  // the last failed statement's, for relay.workers

  std::string render();  // takes mu
  // What relay._agent_report stores (docs/managed.md, "The agents' counters in
  // the views"): a JSON object, "" the agent's own counters, then one object
  // per handler by name. Takes mu.
  std::string report_json();
};

class MetricsServer {
 public:
  explicit MetricsServer(Metrics& metrics) : metrics_(metrics) {}
  ~MetricsServer() { stop(); }
  // HOST:PORT (PORT 0: any free one). False with *why; else the port bound.
  bool start(const std::string& address, int* port, std::string* why);
  void stop();

 private:
  void serve();
  Metrics& metrics_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace relaybus::agent
