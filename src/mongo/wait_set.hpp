// The dispatcher's one wait: poll() over the signal pipe, the HTTP engine's
// sockets, the pull API's waiting requests and the kafka producers' wake-up
// fd, up to a deadline or the engine's next timer. What became ready is
// served before it returns (socket events to the engine, API requests to the
// pull API, delivery reports to the kafka sink, whose results the loop then
// collects). A signal ends the wait at once and is only reported, for the
// loop's interrupts and reload phases.
#pragma once

#include <cstdint>

#include "core/http_engine.hpp"
#include "core/kafka_sink.hpp"
#include "mongo/metrics.hpp"

namespace relaybus::mongo {

struct Signals {
  bool stop = false;    // SIGTERM or SIGINT ('T' on the pipe)
  bool reload = false;  // SIGHUP ('H')
};

class WaitSet {
 public:
  // signal_fd: the read end of the self-pipe the signal handlers write to.
  explicit WaitSet(int signal_fd) : signal_fd_(signal_fd) {}
  // engine and kafka may be null (not made yet).
  Signals wait(int64_t max_ms, core::HttpEngine* engine, MetricsServer& server, core::KafkaSink* kafka);

 private:
  int signal_fd_;
};

}  // namespace relaybus::mongo
