// The relaybus-mongo dispatcher: leases lanes, reads each http handler's
// deliveries in its lanes, plans with the core's claim planner, POSTs through
// the core's HTTP engine and completes results in bulk. One thread, one poll()
// loop over the engine's sockets, the metrics server and a signal pipe.
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
#include <unordered_map>
#include <vector>

#include "core/http_engine.hpp"
#include "core/webhook_delivery.hpp"
#include "mongo/config.hpp"
#include "mongo/metrics.hpp"
#include "mongo/store.hpp"

namespace relaybus::mongo {

class Dispatcher {
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
  };
  struct InFlight {
    std::string handler;
    int lane = 0;
    int attempt = 0;  // failed attempts before this one
    int64_t published_ms = 0;
  };
  struct Done {
    int64_t id;
    core::HttpResult result;
    InFlight info;
  };
  struct HandlerState {
    HandlerDoc doc;
    int key = 0;
    core::CircuitBreaker breaker;
  };

  void reload();
  void lease_tick();
  void fetch_all();
  void fetch_handler(HandlerState& h);
  void collect_results();
  void flush();
  void release_all();
  bool lane_valid(int lane, int64_t now) const;
  bool ensure_engine();
  void wait(int64_t max_ms);

  Config cfg_;
  std::map<std::string, std::string> flags_;
  Store& store_;
  int signal_fd_;
  Metrics metrics_;
  MetricsServer server_;
  std::unique_ptr<core::HttpEngine> engine_;
  std::string engine_allowlist_;
  std::map<std::string, HandlerState> handlers_;
  std::map<std::string, int> handler_keys_;
  std::map<int, Held> held_;
  std::unordered_map<int64_t, InFlight> in_flight_;
  std::vector<Done> done_;
  std::set<int64_t> done_ids_;
  int64_t first_done_ms_ = 0;
  int64_t next_tick_ms_ = 0;
  int64_t next_fetch_ms_ = 0;
  int64_t next_flush_retry_ms_ = 0;
  bool stopping_ = false;
  int64_t stop_deadline_ms_ = 0;
  std::mt19937_64 rng_;
  std::set<std::string> warned_;
};

}  // namespace relaybus::mongo
