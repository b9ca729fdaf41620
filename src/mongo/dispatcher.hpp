// The relaybus-mongo dispatcher: leases lanes, claims each http and kafka
// handler's deliveries in its lanes and hands them to the core's delivery
// pipeline (core/delivery_pipeline.hpp), the same as the PostgreSQL
// dispatchers'. One thread runs one loop (run(), dispatcher.cpp) in named
// phases over one state struct (LoopState); each concept it uses has a file:
//
//   lane_leases      the lanes and the sequencer role: tick, renewal, receipts
//   handler_catalog  the handlers served, by kind
//   pipeline_host    the pipeline, the HTTP engine and the kafka producers
//   dispatch_stage   claim and stage: a handler's claim queued in the pipeline
//   dispatch_settle  the pipeline's store: completions fenced by their receipts
//   wait_set         the one poll(): signals, sockets, pull API, kafka reports
//   core/store_policy what a failed store command costs, lease timing
//
// /metrics and /healthz are answered by the metrics server's own thread from
// the copy the loop publishes (metrics.hpp). While a store command runs,
// helper threads drive the HTTP requests in flight and renew the lane leases
// (command_window.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/delivery_pipeline.hpp"
#include "core/store_policy.hpp"
#include "mongo/command_window.hpp"
#include "mongo/config.hpp"
#include "mongo/handler_catalog.hpp"
#include "mongo/lane_claim.hpp"
#include "mongo/lane_leases.hpp"
#include "mongo/metrics.hpp"
#include "mongo/pipeline_host.hpp"
#include "mongo/pull_api.hpp"
#include "mongo/sequencer.hpp"
#include "mongo/store.hpp"
#include "mongo/wait_set.hpp"

namespace relaybus::mongo {

class Dispatcher final : private core::DeliveryStore, private PullHost, private Store::CommandObserver {
 public:
  Dispatcher(Config cfg, std::map<std::string, std::string> flags, Store& store, int signal_fd);
  ~Dispatcher();
  // Runs until SIGTERM/SIGINT; returns the exit code.
  int run();

 private:
  // What the loop decides by: when each phase is due next, and where it is
  // between a signal and its exit.
  struct LoopState {
    int64_t next_tick_ms = 0;      // lease tick: catalog, heartbeat, lanes (wall clock)
    int64_t next_fetch_ms = 0;     // claim and stage
    int64_t next_sequence_ms = 0;  // the sequencer's next batch, while the role is held
    int64_t next_backlog_ms = 0;   // the backlog gauges
    core::StoreBackoff lease_backoff;
    Signals signals;               // seen by the wait, not acted on yet
    bool stopping = false;         // draining: no claims, leases given back
    int64_t stop_deadline_ms = 0;  // monotonic
  };

  // Phases of the loop (dispatcher.cpp), in its order.
  void interrupts();       // SIGTERM/SIGINT: start draining
  void reload();           // SIGHUP: the config file again
  bool drain();            // stopping: one pass; true when done
  void lanes();            // lease tick when due
  void expire_pulls();     // pull leases that ran out: failed attempts
  void renew();            // lease renewal when due
  void send();             // queued deliveries go out as responses made room
  void collect();          // results from the engine and the kafka producers
  void settle();           // a completion batch when due
  void claim_and_stage();  // when due: every handler's claim (dispatch_stage.cpp)
  void sequence();         // housekeeping: the sequencer's batch when due
  int64_t next_wait_ms();
  void wait(int64_t max_ms);

  bool start();            // the metrics endpoint, the pipeline, the renewals' client, the pull API
  void stop();             // leases given back, threads joined
  bool wait_for_server();  // server_wait.cpp: false when a SIGTERM/SIGINT came first
  void lease_tick();
  void tick_if_due();
  std::map<int, int> busy_lanes();  // lane -> deliveries the pipeline or a consumer holds
  void release_all();

  // Claim and stage (dispatch_stage.cpp).
  void stage(SentHandler& h);

  // The pipeline's store (dispatch_settle.cpp).
  void complete(const std::vector<core::Completion>& batch) override;
  void release(const std::vector<core::ClaimedDelivery>& never_sent) override;
  bool still_held(const core::ClaimedDelivery& d, int64_t now_ms) override;
  void flush();

  // Store::CommandObserver: around every store command, a fresh copy of the
  // metrics for the metrics thread, and the command window open meanwhile.
  void begin(bool lanes) override;
  void end() noexcept override;

  // PullHost: the pull API's view of the catalog and the lanes.
  const HandlerDoc* pull_handler(const std::string& name) const override;
  std::vector<std::pair<int, int64_t>> claimable_lanes(int64_t now_ms) const override;
  bool lane_holds(int lane, int64_t since_epoch, int64_t now_ms) const override;

  // stats.cpp: the heartbeat's per-handler load, and the backlog gauges.
  std::map<std::string, Store::HandlerLoad> handler_load();
  void refresh_backlog(int64_t now_ms);

  Config cfg_;
  std::map<std::string, std::string> flags_;
  Store& store_;
  LoopState loop_;
  Metrics metrics_;
  MetricsServer server_;
  WaitSet waits_;
  std::mt19937_64 rng_;
  Sequencer sequencer_;
  LaneLeases leases_;
  HandlerCatalog catalog_;
  PipelineHost host_;
  LaneClaimer claimer_{store_, metrics_};  // the http and kafka handlers' claims
  std::unique_ptr<PullApi> pull_;
  std::unique_ptr<CommandWindow> window_;
};

}  // namespace relaybus::mongo
