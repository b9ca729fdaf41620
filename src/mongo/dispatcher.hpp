// The relaybus-mongo dispatcher: leases lanes, reads each http handler's
// deliveries in its lanes, plans with the core's claim planner and hands them
// to the core's delivery pipeline (core/delivery_pipeline.hpp: queue,
// concurrency, breaker, expiry, the HTTP engine, classification, batched
// completion), the same as the PostgreSQL dispatchers'. It is the pipeline's
// store here: completions are written to relay_deliveries only on a receipt
// (lane, epoch at which this instance took the lane) that still holds. One
// thread, one poll() loop over the engine's sockets, the pull API's requests
// and a signal pipe; /metrics and /healthz are answered by the metrics
// server's own thread from the copy the loop publishes (metrics.hpp). While
// a store command runs, helper threads drive the HTTP requests in flight and
// renew the lane leases (command_window.hpp).
//
// kafka handlers share the pipeline: a core::RoutingSink hands their
// deliveries to core::KafkaSink (librdkafka producers), whose wake-up fd is in
// the same poll() set; their completions go through the same receipts.
//
// Lane leases (docs/mongo.md, "Lane leases"): relay_lanes holds one document
// per (lane, epoch), unique. The holder of a lane is the owner of its highest
// epoch while that document's `until` has not passed. Taking a free or expired
// lane, renewing a held one and giving one back are all the same operation:
// insert epoch+1. Two instances racing for a lane race to insert the same
// (lane, epoch); the unique index lets exactly one win, on any server that
// enforces unique indexes (FerretDB v1 does, even though its findAndModify and
// update are not atomic). All of an instance's renewals, takeovers and
// releases of one tick go in one insertMany. The epoch is the fencing token:
// an instance that fails to insert its next epoch has lost the lane and drops
// that lane's results without completing them; and it completes results only
// while its last successful renewal's `until` (minus a margin for clock skew
// and the completing write) lies ahead, which no other instance can reach
// before that `until` has passed on its own clock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/delivery_pipeline.hpp"
#include "core/http_engine.hpp"
#include "core/kafka_sink.hpp"
#include "core/routing_sink.hpp"
#include "mongo/command_window.hpp"
#include "mongo/config.hpp"
#include "mongo/metrics.hpp"
#include "mongo/lane_claim.hpp"
#include "mongo/pull_api.hpp"
#include "mongo/sequencer.hpp"
#include "mongo/store.hpp"

namespace relaybus::mongo {

class Dispatcher final : private core::DeliveryStore, private PullHost, private Store::CommandObserver {
 public:
  // signal_fd: the read end of the self-pipe the signal handlers write 'T'
  // (SIGTERM/SIGINT) or 'H' (SIGHUP) to. reload() re-reads the config.
  Dispatcher(Config cfg, std::map<std::string, std::string> flags, Store& store, int signal_fd);
  ~Dispatcher();
  // Runs until SIGTERM/SIGINT; returns the exit code.
  int run();

 private:
  struct Held {
    int64_t epoch = 0;
    int64_t until_ms = 0;
    bool draining = false;
    // The epoch at which this instance took the lane (renewals keep it): a
    // delivery's receipt. Lost and taken again, the lane has a new one.
    int64_t since_epoch = 0;
  };
  struct HandlerState {
    HandlerDoc doc;
    int key = 0;
    std::shared_ptr<const core::PipelineHandler> pipe;  // the doc, as the pipeline sends it
  };

  // core::DeliveryStore: completions and releases of the pipeline.
  void complete(const std::vector<core::Completion>& batch) override;
  void release(const std::vector<core::ClaimedDelivery>& never_sent) override;
  bool still_held(const core::ClaimedDelivery& d, int64_t now_ms) override;
  bool receipt_holds(const core::Receipt& r, int64_t now_ms) const;

  void reload();
  void lease_tick();
  // Renews every held lane and nothing else (one insertMany): for a fetch
  // whose reads outlasted a tick interval, before its deliveries are queued.
  void renew_leases();
  // renew_leases when a tick interval has passed since the last renewal was
  // sent: before the lease is used (queuing, sending, completing).
  void renew_if_due();
  int64_t tick_interval_ms() const { return std::max<int64_t>(100, cfg_.lease_ms / 3); }
  void drop_lost(const std::vector<int>& leases);  // lanes (and kSequencerLane) a renewal found taken
  int64_t renewed_at_ms_ = 0;
  void fetch_all();
  void fetch_handler(HandlerState& h);
  void collect_results();
  void flush();
  void release_all();
  bool lane_valid(int lane, int64_t now) const;
  bool ensure_engine();
  // Waits up to max_ms for a signal, the engine's sockets or a pull API request.
  void wait(int64_t max_ms);
  // Store::CommandObserver: around every store command, a fresh copy of the
  // metrics for the metrics thread, and the command window open meanwhile.
  void begin(bool lanes) override;
  void end() noexcept override;
  std::unique_ptr<CommandWindow> window_;
  // The window's renewals, applied when it closes (the epochs and expiry of
  // the lanes renewed); losses wait for settle_renewals, which may drop lanes.
  void apply_renewals(CommandWindow::Renewed r) noexcept;
  void settle_renewals();
  std::vector<int> lost_in_window_;
  std::string window_error_;
  std::vector<std::pair<int, int64_t>> stale_lane_docs_;  // renewed past in a window: deleted by the next tick
  bool wait_for_server();                                 // server_wait.cpp

  // PullHost: the pull API's view of the catalog and the lanes.
  const HandlerDoc* pull_handler(const std::string& name) const override;
  std::vector<std::pair<int, int64_t>> claimable_lanes(int64_t now_ms) const override;
  bool lane_holds(int lane, int64_t since_epoch, int64_t now_ms) const override;
  std::map<std::string, HandlerDoc> pull_handlers_;
  // stats.cpp: the heartbeat's per-handler load, and the backlog gauges.
  std::map<std::string, Store::HandlerLoad> handler_load();
  void refresh_backlog(int64_t now_ms);
  int64_t next_backlog_ms_ = 0;
  std::unique_ptr<PullApi> pull_;
  // The sequencer role (sequencer.hpp): leased with the lanes, one batch per call.
  void sequence_some();
  void tick_if_due(int64_t& store_backoff_until);  // lease_tick when due

  Config cfg_;
  std::map<std::string, std::string> flags_;
  Store& store_;
  int signal_fd_;
  Metrics metrics_;
  LaneClaimer claimer_{store_, metrics_};  // the http and kafka handlers' claims
  MetricsServer server_;
  std::unique_ptr<core::HttpEngine> engine_;
  std::unique_ptr<core::HttpSink> sink_;
  std::unique_ptr<core::KafkaSink> kafka_sink_;  // kafka handlers' deliveries
  std::unique_ptr<core::RoutingSink> router_;    // the pipeline's sink: http or kafka by handler
  std::unique_ptr<core::DeliveryPipeline> pipeline_;
  std::string engine_allowlist_;
  std::map<std::string, HandlerState> handlers_;
  std::map<std::string, int> handler_keys_;
  std::map<int, Held> held_;
  int64_t next_tick_ms_ = 0;
  int64_t next_fetch_ms_ = 0;
  bool stopping_ = false;
  int64_t stop_deadline_ms_ = 0;
  std::mt19937_64 rng_;
  std::set<std::string> warned_;
  Held seq_lease_;  // the sequencer role's lease, while seq_held_
  bool seq_held_ = false;
  std::unique_ptr<Sequencer> sequencer_;
  int64_t next_sequence_ms_ = 0;
};

}  // namespace relaybus::mongo
