#pragma once

// relaybus-agent's loop (docs/managed.md, "relaybus-agent"): one libpq
// connection to a database of the managed SQL edition, LISTEN relaybus for
// wake-ups with a poll as fallback, notify handlers delivered by the
// edition's server-side iteration (relay._agent_notify), http and kafka
// handlers by core's pipeline (the HTTP engine and the kafka producers behind
// one core::RoutingSink, as in the extension and relaybus-mongo), each result
// settled on its lease token (relay._agent_settle). One thread.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/limits.hpp"
#include "agent/metrics.hpp"
#include "agent/pg.hpp"
#include "core/delivery_pipeline.hpp"
#include "core/dispatch_policy.hpp"
#include "core/http_engine.hpp"
#include "core/kafka_sink.hpp"
#include "core/routing_sink.hpp"
#include "core/span_exporter.hpp"

namespace relaybus::agent {

struct AgentConfig {
  std::string database;  // libpq conninfo or URI
  int64_t poll_interval_ms = 1000;
  int batch_size = 1000;            // deliveries per claim (and per notify iteration)
  int notify_payload_limit = 7900;  // bytes; larger deliveries go by reference
  int claim_scan_limit = 1000;      // relaybus.claim_scan_limit of the agent's session
  int max_in_flight = 256;          // http requests and kafka messages in flight and queued, all handlers
  int64_t http_lease_margin_ms = 2000;
  std::string http_allowlist;         // hosts and CIDRs the SSRF guard lets through
  std::string ca_file;                // webhooks' TLS trust store; empty: the system's
  int64_t drain_timeout_ms = 10000;   // SIGTERM: how long in-flight requests may finish
  int64_t reconnect_base_ms = 500;    // reconnect backoff: doubling from here...
  int64_t reconnect_max_ms = 30000;   // ...to here
  std::string metrics_addr;           // HOST:PORT of /metrics and /healthz; empty: none
  std::string otlp_endpoint;          // spans per traced attempt (docs/tracing.md); empty: none
  int64_t report_interval_ms = 5000;  // counters into relay.agent_reports this often; 0: never
  std::vector<std::pair<std::string, std::string>> otlp_headers;
};

constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitConfig = 2;

class Agent final : public core::DeliveryStore {
 public:
  explicit Agent(AgentConfig config);
  // Runs until stop is set (signals), or a fatal configuration error. Returns
  // the exit code.
  int run(const std::atomic<bool>& stop, int wake_fd);

  // core::DeliveryStore
  void complete(const std::vector<core::Completion>& batch) override;
  void release(const std::vector<core::ClaimedDelivery>& never_sent) override;

 private:
  struct Handler {
    std::shared_ptr<const core::PipelineHandler> pipe;
    bool paused = false;
    bool due = true;
    int64_t lease_ms = 30000;  // http, kafka: the agent's lease (core::http_lease_ms)
    int64_t retry_at_ms = 0;   // after an error of this handler's statement
    // When the earliest retry a settle scheduled falls due (0: none): the
    // claim goes then, not at the next poll (as the extension's dispatchers
    // keep a retry's backoff).
    int64_t due_at_ms = 0;
    // notify: the extension's error policy, per handler since each iteration
    // is one handler's statement (notify_isolation.cpp).
    core::DispatchPolicy notify_policy;
  };
  enum class Connect { Ok, Retry, Fatal };

  Connect connect_and_check();
  void load_handlers();
  void serve_notify(Handler& h);
  void serve_notify_alone(Handler& h);
  void after_notify_error(Handler& h, const PgError& e, int in_flight, const core::ClaimedDelivery* suspect);
  void claim_sent(Handler& h, int64_t now);
  int claim_room(const Handler& h, int64_t now);
  void sync_limits(int64_t now);
  void on_pg_error(const PgError& e, const char* what, Handler* h);
  void mark_all_due();
  void due_after(int handler_key, int64_t in_ms);  // a retry due in in_ms: claim for it then
  void count_http_statuses(const std::vector<core::Completion>& batch);
  int64_t wait_ms(int64_t now);
  void wait(int wake_fd, int64_t timeout_ms);
  void on_notifications(const std::vector<std::pair<std::string, std::string>>& notes);
  void set_connected(bool up);
  void publish_gauges();
  void report(int64_t now);

  AgentConfig cfg_;
  PgConn conn_;
  Metrics metrics_;
  std::unique_ptr<core::HttpEngine> engine_;
  std::unique_ptr<core::HttpSink> sink_;
  std::unique_ptr<core::KafkaSink> kafka_sink_;
  std::unique_ptr<core::RoutingSink> router_;
  std::unique_ptr<core::DeliveryPipeline> pipeline_;
  std::unique_ptr<core::SpanExporter> spans_;  // --otlp-endpoint
  SharedLimits limits_;                        // max_concurrency and rate across the database's agents
  std::map<int, Handler> handlers_;
  bool catalog_dirty_ = true;
  int64_t catalog_retry_at_ms_ = 0;  // after a failed load
  int connect_failures_ = 0;
  int64_t reconnect_at_ms_ = 0;
  int64_t next_poll_ms_ = 0;
  int64_t engine_deadline_ms_ = -1;
  bool fatal_ = false;
  // relay._agent_report: this agent's name in relay.agent_reports (host:pid),
  // when it started, the next report; off after the edition refused it.
  std::string report_name_;
  int64_t started_ms_ = 0;
  int64_t next_report_ms_ = 0;
  bool report_off_ = false;
};

}  // namespace relaybus::agent
